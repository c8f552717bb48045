#!/bin/sh
# /// ferry
# description = "Host facts: OS, kernel, CPUs, memory, free disk of the run base, python3 and nvidia-smi on PATH"
# interpreter = "sh"
# timeout = 30
# ///
#
# Result:
#   {"hostname", "os", "kernel", "arch", "cpus",
