# /// ferry
# interpreter = "sh"
# [params.a]
# type = "list"
# items = "json"
# ///
