#!/usr/bin/env python3
# /// ferry
# description = "KV-cache capacity"
# interpreter = "python3"
# timeout = 120
#
# [params.tp]
# type = "int"
# default = 1
# help = "tensor-parallel size"
#
# [params.kv_dtype]
# type = "list"
# items = "string"
# default = ["bf16", "fp8_e4m3"]
# choices = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
#
# [params.ratio]
# type = "float"
# default = 0.9
# choices = [0.5, 0.9, 1]
#
# [params.verbose]
# type = "bool"
# default = false
#
# [params.name]
# type = "string"
# required = true
#
# [params.config]
# type = "json"
# default = { a = [1, 2.5, "x", { b = true }], c = 1979-05-27T07:32:00Z }
#
# [params.sizes]
# type = "list"
# items = "int"
# default = [32768, 131072]
# ///
print("hi")
