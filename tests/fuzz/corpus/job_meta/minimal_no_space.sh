#/// ferry
#interpreter="/bin/sh"
#///
