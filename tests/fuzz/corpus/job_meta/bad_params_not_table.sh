# /// ferry
# interpreter = "sh"
# params = [1, 2]
# ///
