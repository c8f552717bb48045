# /// ferry
# interpreter = "sh"
# ///
echo
