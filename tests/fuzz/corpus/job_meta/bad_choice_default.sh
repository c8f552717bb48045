# /// ferry
# interpreter = "sh"
# [params.a]
# type = "string"
# default = "c"
# choices = ["a", "b"]
# ///
