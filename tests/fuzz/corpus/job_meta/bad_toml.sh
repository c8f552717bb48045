#!/bin/sh
# /// ferry
# interpreter = "sh"
# timeout = = 3
# ///
