# /// ferry
# interpreter = "sh"
# timeout = 604801
# ///
