# /// ferry
# interpreter = "sh"
