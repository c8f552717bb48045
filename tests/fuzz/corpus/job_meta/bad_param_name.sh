# /// ferry
# interpreter = "sh"
# [params."a b"]
# type = "int"
# ///
