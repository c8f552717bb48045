# /// ferry
# interpreter = "$(id) -u"
# ///
