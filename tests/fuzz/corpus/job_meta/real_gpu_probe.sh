#!/bin/sh
# /// ferry
# description = "GPUs on this host: name, memory total/used/free (MiB), driver, CUDA version"
# interpreter = "sh"
# timeout = 30
# ///
#
# Result: {"gpus": [{"index", "name", "memory_total_mib", "memory_used_mib",
# "memory_free_mib", "driver", "cuda"}]}; a memory figure nvidia-smi reports as [N/A] is null.
