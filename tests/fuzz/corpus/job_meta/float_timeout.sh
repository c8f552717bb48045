# /// ferry
# interpreter = "sh"
# timeout = 60.0
# ///
