# /// ferry
# interpreter = "sh"
echo
# ///
