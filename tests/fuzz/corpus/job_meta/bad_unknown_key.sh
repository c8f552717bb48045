# /// ferry
# interpreter = "sh"
# [params.a]
# type = "int"
# defualt = 1
# ///
