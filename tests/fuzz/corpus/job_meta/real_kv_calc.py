# /// ferry
# description = "KV-cache and recurrent-state capacity of a model on this host's GPUs"
# interpreter = "python3"
# timeout = 120
#
# [params.model_dir]
# type = "string"
# help = "checkpoint directory on the host (config.json, hf_quant_config.json, *.safetensors)"
#
# [params.config]
# type = "json"
# help = "the config.json object itself (or a path to one), instead of model_dir"
#
# [params.model]
# type = "string"
# help = "a named preset instead of model_dir/config"
# choices = ["qwen3.5-397b-a17b", "qwen3-next-80b-a3b", "llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "gpt-oss-120b"]
#
# [params.tp]
# type = "int"
# default = 1
# help = "tensor-parallel size (attention TP)"
#
# [params.kv_dtype]
# type = "list"
# items = "string"
# default = ["bf16", "fp8_e4m3"]
# choices = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
# help = "KV-cache dtypes to compare; auto = the checkpoint's KV dtype"
#
# [params.kv_memory_gib]
# type = "float"
# help = "GiB per GPU for the KV pool (and recurrent state); unset = probe with nvidia-smi"
#
# [params.mem_fraction]
# type = "float"
# default = 0.9
# help = "fraction of GPU memory for weights + cache when probing (vLLM --gpu-memory-utilization default 0.9; SGLang --mem-fraction-static, whose default depends on the GPU)"
#
# [params.weights_gib]
# type = "float"
# help = "checkpoint size in GiB when probing without model_dir (default: sum of *.safetensors, or the preset's)"
#
# [params.activation_reserve_gib]
# type = "float"
# help = "GiB per GPU kept for activations when probing (default: sglang 0, vllm 2)"
#
# [params.context]
# type = "list"
# items = "int"
# help = "context lengths for the concurrency columns (default: 32768, 131072 and max_position_embeddings)"
#
# [params.engine]
# type = "string"
# default = "sglang"
# choices = ["sglang", "vllm"]
# help = "whose allocation arithmetic to follow"
#
# [params.page_size]
# type = "int"
# help = "tokens per KV page/block (default: sglang 1, vllm 16)"
#
# [params.ssm_dtype]
# type = "string"
# default = "float32"
# choices = ["float32", "bfloat16", "float16"]
# help = "dtype of the recurrent (SSM) state of linear-attention layers"
#
# [params.mamba_full_memory_ratio]
# type = "float"
# default = 0.9
# help = "SGLang --mamba-full-memory-ratio: recurrent state gets r/(1+r) of the pool"
#
# [params.calibrate_log]
# type = "string"
# help = "an engine's startup log line(s), or a path to its log, to compare against"
# ///
"""kv_calc: how many tokens of KV cache fit per GPU, following the serving engines' arithmetic.

Run by ferry (FERRY_PARAMS / FERRY_RESULT set) or by hand:
