# /// ferry
# description = "KV-cache and recurrent-state capacity per GPU as SGLang or vLLM allocate it (mode=size), or a plan of GPU count, TP/DP-attention split and KV dtype for a workload (mode=plan)"
# interpreter = "python3"
# timeout = 120
# summary = ["/kv/*/max_tokens", "/pick/gpus", "/pick/tp", "/pick/dp", "/pick/kv_dtype", "/pick/concurrent_requests"]
#
# [params.mode]
# type = "string"
# default = "size"
# choices = ["size", "plan"]
# help = "size: for one deployment (tp, dp) the per-GPU bytes per token of each KV dtype, the tokens the engine allocates, concurrent requests per context, recurrent state per request and a per-layer-kind breakdown; plan: every GPU count in gpus x DP-attention split x kv_dtype that fits the model and the workload (context, concurrency) on GPUs of gpu_memory_gib (or nvidia-smi), with weights per GPU, KV pool, max tokens, concurrent requests and headroom, and one pick with its reasons"
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
# help = "a named preset instead of model_dir/config (one per supported family)"
# choices = ["qwen3.5-397b-a17b", "qwen3.5-397b-a17b-nvfp4", "qwen3-next-80b-a3b", "llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "deepseek-v3.2-exp", "gpt-oss-120b", "gemma-2-9b", "gemma-3-27b", "llama-4-scout", "mistral-7b-v0.1", "qwen2.5-7b", "nemotron-h-8b", "nemotron-3-nano-30b-a3b", "falcon-h1", "granite-4.0-h-small", "jamba-mini-1.7", "minimax-text-01"]
#
# [params.tp]
# type = "int"
# default = 1
# help = "tensor-parallel size = GPUs of one deployment (mode=size)"
#
# [params.dp]
# type = "int"
# default = 1
# help = "DP-attention size (SGLang --enable-dp-attention --dp, vLLM --data-parallel-size with expert parallel): attention TP = tp / dp, each DP rank keeps its own KV pool and requests (mode=size)"
#
# [params.kv_dtype]
# type = "list"
# items = "string"
# default = ["bf16", "fp8_e4m3"]
# choices = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
# help = "KV-cache dtypes to compare (mode=plan: the candidates); auto = what the engine picks for this checkpoint"
#
# [params.kv_memory_gib]
# type = "float"
# help = "mode=size: the KV pool's size per GPU in GiB (recurrent state included), as the engine reports it: SGLang's log 'KV size', vLLM's 'Available KV cache memory'; for DeepSeek-V3.2 in SGLang the tokens are those whose tensors (788 B/layer FP8 rows + one padding page) fit it, where the memory SGLang sizes from is smaller; unset = derive the memory available for the pool from nvidia-smi (GPU memory x mem_fraction - weights - reserve) and size it as the engine does"
#
# [params.mem_fraction]
# type = "float"
# help = "fraction of GPU memory for weights + cache when probing or planning; unset = the engine's own default as its code computes it (vLLM --gpu-memory-utilization 0.9; SGLang --mem-fraction-static from the GPU's memory, TP, DP attention and a vision encoder)"
#
# [params.weights_gib]
# type = "float"
# help = "checkpoint size in GiB when probing or planning without model_dir (default: sum of *.safetensors, or the preset's)"
#
# [params.activation_reserve_gib]
# type = "float"
# help = "GiB per GPU kept for activations when probing or planning (default: sglang 0, vllm 2)"
#
# [params.context]
# type = "list"
# items = "int"
# help = "context lengths for the concurrency columns (default: 32768, 131072 and max_position_embeddings); mode=plan sizes for the largest"
#
# [params.engine]
# type = "string"
# default = "sglang"
# choices = ["sglang", "vllm"]
# help = "whose allocation arithmetic to follow"
#
# [params.page_size]
# type = "int"
# help = "tokens per KV page/block (default: sglang 1, vllm 16; 64 for DeepSeek-V3.2 in both)"
#
# [params.attention_backend]
# type = "string"
# default = "auto"
# choices = ["auto", "trtllm", "flashmla", "fa3", "flashinfer", "triton"]
# help = "the attention backend where it changes the cache layout: SGLang stores the DeepSeek-V3.2 FP8 row without scales with trtllm, and drops its separate sliding-window pool for GPT-OSS with trtllm; auto = the engine's non-trtllm default"
#
# [params.ssm_dtype]
# type = "string"
# default = "auto"
# choices = ["auto", "float32", "bfloat16", "float16"]
# help = "dtype of the recurrent (SSM / linear-attention) state; auto = the engine's default (SGLang: config mamba_ssm_dtype, else float32; vLLM: the model dtype)"
#
# [params.mamba_full_memory_ratio]
# type = "float"
# default = 0.9
# help = "SGLang --mamba-full-memory-ratio: recurrent state gets r/(1+r) of the pool"
#
# [params.mtp]
# type = "bool"
# default = false
# help = "speculative decoding with the checkpoint's MTP/NextN draft layers on: count their KV as the engine allocates it (vLLM: in the shared pool; SGLang: a separate draft pool outside the profiled one)"
#
# [params.allow_unknown]
# type = "bool"
# default = false
# help = "size a config whose field or layer kind kv_calc does not know (and that may change what is cached) without it: an unknown layer kind as full attention (one unknown-layer-kind warning per kind), an unknown field ignored (unknown-config-field), instead of failing"
#
# [params.gpus]
# type = "list"
# items = "int"
# help = "mode=plan: GPU counts to consider (default: the count nvidia-smi lists, else 1, 2, 4, 8)"
#
# [params.gpu_memory_gib]
# type = "float"
# help = "mode=plan: memory per GPU in GiB (default: the smallest memory.total nvidia-smi lists)"
#
# [params.concurrency]
# type = "int"
# default = 1
# help = "mode=plan: concurrent requests of the workload at its context"
#
# [params.calibrate_log]
# type = "string"
# help = "an engine's startup log line(s), or a path to its log, to compare against (mode=size)"
# ///
"""kv_calc: how many tokens of KV cache fit per GPU, following the serving engines' arithmetic.

Run by ferry (FERRY_PARAMS / FERRY_RESULT set) or by hand:
    python3 jobs/kv_calc.py model=qwen3.5-397b-a17b tp=8 kv_memory_gib=17.4
    python3 jobs/kv_calc.py mode=plan model=qwen3.5-397b-a17b-nvfp4 gpus=8 gpu_memory_gib=95.59 \
        context=262144
Standard library only; runs on Python 3.8+.

Reading order: parameters, the model (config.json and each family's layer rule, checkpoint
files), memory, the inputs of one sizing gathered in `Inputs`, the arithmetic (numbers only:
per-layer bytes, SGLang's pool, vLLM's block pool), the explanations (warnings and assumptions,
built from the numbers), the result and its report, the planner, and the presets at the end.
Every engine rule names the engine file and function it follows, and the commit read (CITE).
"""

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20

# Mirrors the `/// ferry` block above (a unit test checks they agree): by-hand runs and
# params.json files missing a key fall back to these.
PARAM_TYPES = {
    "mode": ("string", "size"),
    "model_dir": ("string", None),
    "config": ("json", None),
    "model": ("string", None),
    "tp": ("int", 1),
    "dp": ("int", 1),
    "kv_dtype": ("list:string", ["bf16", "fp8_e4m3"]),
    "kv_memory_gib": ("float", None),
    "mem_fraction": ("float", None),
    "weights_gib": ("float", None),
    "activation_reserve_gib": ("float", None),
    "context": ("list:int", None),
    "engine": ("string", "sglang"),
    "page_size": ("int", None),
    "attention_backend": ("string", "auto"),
    "ssm_dtype": ("string", "auto"),
    "mamba_full_memory_ratio": ("float", 0.9),
    "mtp": ("bool", False),
    "allow_unknown": ("bool", False),
    "gpus": ("list:int", None),
    "gpu_memory_gib": ("float", None),
    "concurrency": ("int", 1),
    "calibrate_log": ("string", None),
}
MODES = ["size", "plan"]
KV_DTYPE_CHOICES = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
SSM_DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]
ENGINES = ["sglang", "vllm"]
ATTENTION_BACKENDS = ["auto", "trtllm", "flashmla", "fa3", "flashinfer", "triton"]

# Bytes per cached element. nvfp4 is 4-bit data plus one FP8 scale per 16 elements
# (SGLang get_cell_size_per_token: cell_size // 2 + elements // 16).
DTYPE_BYTES = {
    "fp32": Fraction(4), "float32": Fraction(4),
    "bf16": Fraction(2), "bfloat16": Fraction(2),
    "fp16": Fraction(2), "float16": Fraction(2),
    "fp8_e4m3": Fraction(1), "fp8_e5m2": Fraction(1),
    "nvfp4": Fraction(9, 16),
}
TORCH_TO_KV = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16",
               "float": "fp32"}
KV_TO_TORCH = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

DEFAULT_PAGE_SIZE = {"sglang": 1, "vllm": 16}
# SGLang keeps activations and CUDA graphs in the (1 - mem_fraction_static) headroom; vLLM
# profiles its activation peak inside gpu_memory_utilization, so something must be set aside.
DEFAULT_ACTIVATION_RESERVE_GIB = {"sglang": 0.0, "vllm": 2.0}
# SGLang ServerArgs.swa_full_tokens_ratio default.
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
# SGLang MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: with the radix cache on, running
# requests are capped at state slots // 3.
SGLANG_STATE_SLOTS_PER_REQUEST = 3
# vLLM's default --max-num-batched-tokens for `vllm serve` on a large GPU: the chunked-prefill
# slack that sliding-window and chunked layers keep per request.
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
# DeepSeek-V3.2 (DSA): FP8 quantization block of the latent and the indexer key, and the page
# size both engines force.
DSA_QUANT_BLOCK = 128
DSA_PAGE_SIZE = 64
DEFAULT_CONTEXTS = [32768, 131072]
# The planner's accuracy rule applies from this context length on.
LONG_CONTEXT_TOKENS = 32768

# The engine code each rule follows: repository path, function, and the commit read.
CITE = {
    "sg_mixin": "SGLang model_executor/model_runner_kv_cache_mixin.py@001ccef0",
    "sg_mamba": "SGLang configs/mamba_utils.py@02e208de",
    "sg_nemotron": "SGLang configs/nemotron_h.py@01144484",
    "sg_falcon": "SGLang configs/falcon_h1.py@0464817a",
    "sg_model_config": "SGLang configs/model_config.py@001adf56",
    "sg_mem_fraction": "SGLang server_args.py ServerArgs._handle_gpu_memory_settings (PR "
                       "#10975) and adjust_mem_fraction_for_vlm; newer SGLang "
                       "(arg_groups/memory_hook.py handle_gpu_memory_settings) also reserves for "
                       "prefill CUDA graphs",
    "vl_cache_config": "vLLM config/cache.py@c1d86421 CacheConfig.gpu_memory_utilization; "
                       "0.92 from config/cache.py@002f10e0",
    "sg_context_len": "SGLang utils/hf_transformers_utils.py get_context_length, "
                      "CONTEXT_LENGTH_KEYS",
    "sg_kimi": "SGLang configs/kimi_linear.py@008b79d2 KimiLinearConfig.mamba2_cache_params, "
               "configs/mamba_utils.py KimiLinearStateShape.create",
    "sg_lfm2": "SGLang configs/lfm2.py@05319dc0 Lfm2Config.mamba2_cache_params",
    "vl_kda": "vLLM model_executor/layers/mamba/mamba_utils.py kda_state_shape / "
              "kda_state_dtype",
    "vl_shortconv": "vLLM model_executor/layers/mamba/mamba_utils.py short_conv_state_shape, "
                    "models/lfm2.py get_mamba_state_shape_from_config",
    "sg_nsa_pool": "SGLang mem_cache/memory_pool.py NSATokenToKVPool, "
                   "MLATokenToKVPool._create_buffers (the stored version's commit is not shown "
                   "by the index)",
    "sg_server_args": "SGLang server_args.py _handle_model_specific_adjustments (excerpts; "
                      "the stored version's commit is not shown by the index)",
    "vl_iface": "vLLM v1/kv_cache_interface.py@001cabc1",
    "vl_utils": "vLLM v1/core/kv_cache_utils.py@001cabc1",
    "vl_mamba": "vLLM model_executor/layers/mamba/mamba_utils.py@02d71083",
    "vl_models_config": "vLLM model_executor/models/config.py@0144dd5b",
    "vl_deepseek": "vLLM model_executor/models/deepseek_v2.py@002d6073",
    "tf_gemma3": "transformers models/gemma3/configuration_gemma3.py@008f5c8c",
    "tf_defaults": "transformers configuration classes (Gemma2Config, Qwen2Config, "
                   "Llama4TextConfig, MistralConfig)",
}


class InputError(Exception):
    """Bad or missing input: reported on stderr, exit 2, and a result holding an "error" with
    the field and value it is about."""

    def __init__(self, message, field_name=None, value=None):
        super().__init__(message)
        self.field = field_name
        self.value = value


# ---------------------------------------------------------------------------------------
# Parameters


def _typed_value(name, kind, text):
    """`KEY=VALUE` from a by-hand command line, typed like ferry's `-p`."""
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if kind == "json":
            # config=PATH by hand: text that is not JSON is taken as the path it names.
            try:
                return json.loads(text)
            except ValueError:
                return text
        if kind.startswith("list:"):
            item = kind.split(":", 1)[1]
            parts = [p.strip() for p in text.split(",") if p.strip()]
            return [_typed_value(name, item, p) for p in parts]
        return text
    except ValueError:
        raise InputError(f"parameter '{name}' expects {kind}, got '{text}'", name, text)


def params_from_argv(argv):
    params = {}
    for arg in argv:
        if "=" not in arg:
            raise InputError(f"arguments are KEY=VALUE (got '{arg}'); keys: "
                             f"{', '.join(PARAM_TYPES)}")
        key, text = arg.split("=", 1)
        if key not in PARAM_TYPES:
            raise InputError(f"unknown parameter '{key}'; known: {', '.join(PARAM_TYPES)}", key)
        params[key] = _typed_value(key, PARAM_TYPES[key][0], text)
    return params


def load_params(environ, argv):
    """The typed parameter object: FERRY_PARAMS when ferry runs us, else KEY=VALUE arguments."""
    path = environ.get("FERRY_PARAMS")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                given = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read FERRY_PARAMS file {path}: {e}")
        if not isinstance(given, dict):
            raise InputError(f"FERRY_PARAMS file {path} does not hold a JSON object")
    else:
        given = params_from_argv(argv)
    params = {key: default for key, (_, default) in PARAM_TYPES.items()}
    params.update({k: v for k, v in given.items() if k in PARAM_TYPES})
    return check_params(params)


def _is_count(value, minimum):
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _want(cond, message, key, value):
    if not cond:
        raise InputError(message, key, value)


def _check_choice(params, key, choices):
    value = params[key]
    _want(value in choices, f"{key} must be one of {', '.join(choices)} (got {value!r})", key,
          value)


def _check_gib(params, key):
    value = params[key]
    _want(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                            and value >= 0),
          f"{key} must be a number of GiB >= 0 (got {value!r})", key, value)


def _check_counts(params, key, what):
    value = params[key]
    _want(value is None or (isinstance(value, list) and value and all(
        _is_count(c, 1) for c in value)), f"{key} must be a list of {what} (got {value!r})",
        key, value)


def check_params(params):
    _check_choice(params, "mode", MODES)
    for key in ("tp", "dp", "concurrency"):
        _want(_is_count(params[key], 1), f"{key} must be a whole number >= 1 (got "
              f"{params[key]!r})", key, params[key])
    tp, dp = params["tp"], params["dp"]
    _want(tp % dp == 0, f"dp {dp} must divide tp {tp}: attention TP = tp / dp", "dp", dp)
    dtypes = params["kv_dtype"]
    _want(isinstance(dtypes, list) and dtypes, "kv_dtype must be a non-empty list", "kv_dtype",
          dtypes)
    for d in dtypes:
        _want(d in KV_DTYPE_CHOICES, f"kv_dtype: '{d}' is not one of "
              f"{', '.join(KV_DTYPE_CHOICES)}", "kv_dtype", d)
    _check_choice(params, "engine", ENGINES)
    _check_choice(params, "ssm_dtype", SSM_DTYPE_CHOICES)
    _check_choice(params, "attention_backend", ATTENTION_BACKENDS)
    for key in ("kv_memory_gib", "weights_gib", "activation_reserve_gib", "gpu_memory_gib"):
        _check_gib(params, key)
    frac = params["mem_fraction"]
    _want(frac is None or isinstance(frac, (int, float)) and not isinstance(frac, bool)
          and 0 < frac <= 1,
          f"mem_fraction must be in (0, 1] (got {frac!r})", "mem_fraction", frac)
    ratio = params["mamba_full_memory_ratio"]
    _want(isinstance(ratio, (int, float)) and ratio > 0,
          f"mamba_full_memory_ratio must be > 0 (got {ratio!r})", "mamba_full_memory_ratio",
          ratio)
    page = params["page_size"]
    _want(page is None or _is_count(page, 1),
          f"page_size must be a whole number >= 1 (got {page!r})", "page_size", page)
    _check_counts(params, "context", "positive token counts")
    _check_counts(params, "gpus", "positive GPU counts")
    for key in ("mtp", "allow_unknown"):
        _want(isinstance(params[key], bool), f"{key} must be true or false (got "
              f"{params[key]!r})", key, params[key])
    return params


# ---------------------------------------------------------------------------------------
# Findings: warnings with stable codes, and assumptions in plain words.


@dataclass
class Notes:
    warnings: list = field(default_factory=list)
    assumptions: list = field(default_factory=list)

    def warn(self, code, message):
        if not any(w["code"] == code and w["message"] == message for w in self.warnings):
            self.warnings.append({"code": code, "message": message})

    def assume(self, text):
        if text not in self.assumptions:
            self.assumptions.append(text)


def fmt_int(n):
    return f"{int(n):,}"


def fmt_num(x):
    """Bytes per token: an integer with separators, or a fraction of a byte when nvfp4 is odd."""
    x = Fraction(x)
    return fmt_int(x) if x.denominator == 1 else f"{float(x):,.2f}"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def cdiv(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# The model: where it comes from, and what its config.json says


@dataclass
class Source:
    """Where the model came from: a checkpoint directory, a config object, or a preset."""
    kind: str
    label: str
    config: dict
    checkpoint: Path = None
    preset: str = None
    quant_file: dict = None  # hf_quant_config.json


def read_json_file(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}", "model_dir", str(path))
    except ValueError as e:
        raise InputError(f"{what} {path} is not valid JSON: {e}", "model_dir", str(path))
    if not isinstance(value, dict):
        raise InputError(f"{what} {path} does not hold a JSON object", "model_dir", str(path))
    return value


def resolve_source(params):
    given = [k for k in ("model_dir", "config", "model") if params.get(k) not in (None, "")]
    if not given:
        raise InputError(
            "no model given: pass model_dir=DIR (a checkpoint on this host), config=JSON "
            f"(its config.json), or model=NAME (presets: {', '.join(sorted(PRESETS))})", "model")
    if len(given) > 1:
        raise InputError(f"give one of model_dir, config, model (got {', '.join(given)})",
                         given[1])
    kind = given[0]
    if kind == "model_dir":
        ckpt = Path(params["model_dir"]).expanduser()
        if not ckpt.is_dir():
            raise InputError(f"model_dir {ckpt} is not a directory on this host", "model_dir",
                             str(ckpt))
        config = read_json_file(ckpt / "config.json", "config file")
        quant_path = ckpt / "hf_quant_config.json"
        quant = read_json_file(quant_path, "quantization file") if quant_path.is_file() else None
        return Source("model_dir", str(ckpt), config, checkpoint=ckpt, quant_file=quant)
    if kind == "config":
        config = params["config"]
        if isinstance(config, str):
            path = Path(config).expanduser()
            return Source("config", config, read_json_file(path, "config file"))
        if not isinstance(config, dict):
            raise InputError("config must be the config.json object (or a path to one), "
                             f"got {type(config).__name__}", "config", type(config).__name__)
        return Source("config", "config parameter", config)
    key = find_preset(params["model"])
    preset = PRESETS[key]
    return Source("preset", preset["name"], json.loads(json.dumps(preset["config"])), preset=key)


# Multimodal wrappers keep the language model under one of these (Qwen3.5/Gemma-3/Llama-4:
# text_config, InternVL: llm_config, DeepSeek-VL2: language_config).
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
NOT_TEXT_KEYS = ("vision_config", "audio_config", "vision_tower", "projector_config")


def vision_config(source):
    """The vision encoder's config of a multimodal checkpoint, or None."""
    vision = source.config.get("vision_config")
    return vision if isinstance(vision, dict) else None


def text_config(config):
    """The language model's fields; those it lacks (quantization_config, torch_dtype) fall back
    to the wrapper's top level. Returns (merged config, the wrapper key or None)."""
    for key in TEXT_CONFIG_KEYS:
        inner = config.get(key)
        if isinstance(inner, dict):
            merged = {k: v for k, v in config.items()
                      if k not in TEXT_CONFIG_KEYS and k not in NOT_TEXT_KEYS}
            merged.update(inner)
            return merged, key
    return dict(config), None


@dataclass
class Attention:
    """The per-token cache of one attention layer; every attention layer of a model shares it."""
    style: str = "mha"  # "mha" (incl. GQA/MQA) or "mla"
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    kv_lora_rank: int = None
    qk_rope_head_dim: int = None
    index_head_dim: int = None  # DeepSeek-V3.2 (DSA) lightning-indexer key


@dataclass
class Recurrent:
    """A recurrent mixer that keeps a fixed state per request: its kind and dimensions."""
    kind: str  # one of RECURRENT_KINDS
    dims: dict


ATTENTION_KINDS = ("full", "sliding", "chunked")
RECURRENT_KINDS = ("gdn", "kda", "mamba2", "mamba1", "lightning", "shortconv")
KIND_NAMES = {"full": "full_attention", "sliding": "sliding_attention",
              "chunked": "chunked_attention", "gdn": "gated_delta_net",
              "kda": "kimi_delta_attention", "mamba2": "mamba2", "mamba1": "mamba1",
              "lightning": "lightning_attention", "shortconv": "short_conv"}


@dataclass
class Model:
    name: str
    family: str
    attention: Attention
    layers: list  # per layer: a tuple of its mixers' kinds, () for MLP/MoE-only layers
    torch_dtype: str
    max_position_embeddings: int = None
    sliding_window: int = None
    chunk_size: int = None
    recurrent: dict = field(default_factory=dict)  # kind -> Recurrent
    mtp_layers: int = 0  # MTP/NextN draft layers (each one full-attention layer)
    config_ssm_dtype: str = None  # config.json mamba_ssm_dtype
    architectures: list = field(default_factory=list)
    model_type: str = None
    rule: dict = None  # the layer rule used: reader, family, how it was chosen

    def count(self, kind):
        return sum(1 for mixers in self.layers if kind in mixers)

    def recurrent_layers(self):
        return sum(1 for mixers in self.layers if any(k in RECURRENT_KINDS for k in mixers))

    @property
    def is_dsa(self):
        return self.attention.index_head_dim is not None


def need(cfg, key, what=None):
    """A field the arithmetic cannot do without."""
    value = cfg.get(key)
    if value is None:
        why = f" ({what})" if what else ""
        raise InputError(f"config.json has no '{key}'{why}; it is needed to size the KV cache",
                         key)
    return value


def first_of(cfg, keys, what):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise InputError(f"config.json has none of {', '.join(keys)} ({what}); it is needed to size "
                     "the cache", keys[0])


def field_or_default(cfg, key, default, notes):
    value = cfg.get(key)
    if value is None:
        notes.warn("config-field-missing", f"config.json has no '{key}'; assumed {default}")
        return default
    return value


# ---------------------------------------------------------------------------------------
# Layer rules: which layers cache K/V for every token, which a window or chunk, which hold a
# recurrent state. A family's rule reads the fields its config class defines, with that class's
# defaults; a model_type that only renames a family (a wrapper's "_text" model, a "_lite" or
# "_vl" sibling) takes the family's rule; any other model_type is placed from its fields. A
# field or layer-type value kv_calc does not know, and that could change what is cached, stops
# the run with its name: nothing defaults silently to full attention.

LAYER_TYPE_NAMES = {
    "full_attention": "full", "attention": "full", "global_attention": "full",
    "sliding_attention": "sliding", "sliding_window": "sliding", "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear", "gated_delta_net": "gdn",
    "mamba": "mamba",
    "conv": "shortconv", "short_conv": "shortconv",
}

# The fields the readers below take what a layer caches from.
CACHE_FIELDS = frozenset({
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "attention_head_dim", "hidden_size", "v_head_dim", "kv_lora_rank", "qk_rope_head_dim",
    "index_head_dim", "index_topk", "layer_types", "sliding_window", "use_sliding_window",
    "max_window_layers", "sliding_window_pattern", "sliding_window_size", "attention_chunk_size",
    "no_rope_layers", "no_rope_layer_interval", "full_attention_interval",
    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_num_key_heads",
    "linear_num_value_heads", "linear_value_head_dim", "linear_attn_config",
    "hybrid_override_pattern", "layers_block_type", "attn_type_list", "attn_layer_period",
    "attn_layer_offset", "mamba_num_heads", "mamba_head_dim", "mamba_n_heads", "mamba_d_head",
    "mamba_n_groups", "n_groups", "ssm_state_size", "mamba_d_state", "conv_kernel",
    "mamba_d_conv", "mamba_d_ssm", "mamba_expand", "mamba_ssm_dtype", "conv_L_cache",
    "full_attn_idxs", "num_nextn_predict_layers", "mtp_num_hidden_layers",
    "max_position_embeddings", "model_max_length", "torch_dtype", "dtype", "quantization_config",
})
# Fields that change nothing a layer caches: MLP and MoE shapes and routing, RoPE, norms,
# softcapping and scaling, the query side of MLA, token ids, bookkeeping.
NEUTRAL_FIELDS = frozenset({
    "architectures", "model_type", "auto_map", "transformers_version", "_name_or_path",
    "_commit_hash", "vocab_size", "intermediate_size", "intermediate_size_mlp", "hidden_act",
    "hidden_activation", "mlp_hidden_act", "mamba_hidden_act", "initializer_range",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "use_cache",
    "cache_implementation", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    "pad_token_id", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
    "attention_bias", "attention_dropout", "attention_out_bias", "attn_output_gate",
    "attn_logit_softcapping", "final_logit_softcapping", "attn_scale", "attn_temperature_tuning",
    "floor_scale", "query_pre_attn_scalar", "use_qk_norm", "mlp_bias", "hidden_dropout",
    "use_bias", "pretraining_tp", "initial_context_length", "num_experts", "num_local_experts",
    "n_routed_experts", "n_shared_experts", "num_shared_experts", "num_experts_per_tok",
    "num_experts_per_token", "experts_per_token", "moe_intermediate_size",
    "shared_expert_intermediate_size", "moe_layer_freq", "first_k_dense_replace",
    "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "routed_scaling_factor",
    "n_group", "topk_group", "topk_method", "scoring_func", "router_aux_loss_coef",
    "router_z_loss_coef", "output_router_logits", "moe_router_activation_func",
    "moe_renormalize", "use_grouped_topk", "num_expert_group", "ep_size", "swiglu_limit",
    "interleave_moe_layer_step", "expert_layer_offset", "expert_layer_period",
    "q_lora_rank", "qk_nope_head_dim", "index_n_heads", "mla_use_nope", "image_token_id",
    "image_token_index", "video_token_id", "boi_token_index", "eoi_token_index",
    "mm_tokens_per_image", "vision_start_token_id", "vision_end_token_id", "chunk_size",
    "mamba_chunk_size", "mamba_conv_bias", "use_conv_bias", "conv_bias", "mamba_proj_bias",
    "mamba_dt_rank", "expand", "conv_dim", "conv_dim_out", "conv_use_xavier_init",
    "num_heads", "use_pos_enc", "block_dim", "block_ff_dim", "block_multiple_of",
    "block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_use_swiglu",
    "block_norm_eps", "block_use_xavier_init", "block_mlp_init_scale", "block_out_init_scale",
    "moe_layers", "rope_local_base_freq", "attn_implementation", "_attn_implementation",
})
# Name endings of numeric knobs (multipliers, scales, biases, norms, dropouts, initialisation),
# which never change what a layer caches.
NEUTRAL_SUFFIXES = ("_multiplier", "_multipliers", "_scale", "_scaling", "_bias", "_eps",
                    "_epsilon", "_dropout", "_init", "_std", "_range", "_act", "_activation",
                    "_softcapping", "_norm", "_layernorm")
# Words in a field's name that say it may be about what a layer caches.
CACHE_HINT_WORDS = frozenset({
    "attn", "attention", "kv", "cache", "window", "sliding", "swa", "chunk", "chunked",
    "mamba", "ssm", "conv", "state", "linear", "lora", "index", "indexer", "sparse",
    "compress", "compression", "nope", "local", "global", "mla", "kda", "gdn", "delta",
    "recurrent", "hybrid", "sharing", "cross", "types", "pattern", "head", "heads",
})
# Kimi-Linear's linear_attn_config (KimiLinearConfig) and what kv_calc reads of it.
KDA_FIELDS = frozenset({"kda_layers", "full_attn_layers", "num_heads", "head_dim",
                        "short_conv_kernel_size", "gate_lower_bound", "use_full_rank_gate"})


def may_change_cache(name):
    if name.endswith(NEUTRAL_SUFFIXES):
        return False
    words = name.lower().split("_")
    return any(w in CACHE_HINT_WORDS for w in words) or name.endswith(("_layers", "_idxs"))


def unknown_cache_fields(cfg):
    """Fields kv_calc does not know whose names say they may change what is cached; a field
    that is null or false asks for nothing and is let pass."""
    found = []
    for key, value in cfg.items():
        if key in CACHE_FIELDS or key in NEUTRAL_FIELDS or key in TEXT_CONFIG_KEYS:
            continue
        if value not in (None, False) and may_change_cache(key):
            found.append((key, value))
    kda = cfg.get("linear_attn_config")
    if isinstance(kda, dict):
        found.extend((f"linear_attn_config.{k}", v) for k, v in kda.items()
                     if k not in KDA_FIELDS and v not in (None, False) and may_change_cache(k))
    return found


def check_fields(cfg, notes, allow_unknown):
    found = unknown_cache_fields(cfg)
    if not found:
        return
    names = ", ".join(f"'{k}'" for k, _ in found)
    if not allow_unknown:
        key, value = found[0]
        raise InputError(
            f"config.json field {names} is not one kv_calc knows, and its name says it may "
            "change what the layers cache; kv_calc will not guess (pass allow_unknown=true to "
            "size the model without it, with a warning)", key, value)
    notes.warn("unknown-config-field",
               f"config.json field {names} is not one kv_calc knows and may change what the "
               "layers cache: sized without it (allow_unknown=true)")


@dataclass
class LayerRule:
    cfg: dict
    num_layers: int
    notes: Notes
    allow_unknown: bool
    linear: str = "gdn"  # what layer_types' "linear_attention" means for this family
    mamba: str = None  # what "mamba" means (granite: mamba2, jamba: mamba1)

    def unknown(self, field_name, value, count, what, known=None):
        """The loud failure, or with allow_unknown the warned guess (one warning per value)."""
        if not self.allow_unknown:
            raise InputError(
                f"config.json {field_name} = {value!r} is {what}; kv_calc will not guess (pass "
                "allow_unknown=true to size it as full attention, with a warning)"
                + (f"; known: {known}" if known else ""), field_name, value)
        self.notes.warn("unknown-layer-kind",
                        f"{field_name} = {value!r} is {what}: assumed full attention for "
                        f"{plural(count, 'layer')} (allow_unknown=true)")
        return ("full",)

    def place(self, field_name, values, kind_of, what, known=None):
        """Per value its mixers (kind_of returns None for a value kv_calc cannot place); each
        unknown value is refused, or warned about once, at its first position."""
        layers, unknown = [], {}
        for i, value in enumerate(values):
            mixers = kind_of(value)
            if mixers is None:
                unknown.setdefault(value, []).append(i)
            layers.append(mixers)
        for value, where in unknown.items():
            guess = self.unknown(f"{field_name}[{where[0]}]", value, len(where), what, known)
            for i in where:
                layers[i] = guess
        return layers

    def type_kind(self, name):
        kind = LAYER_TYPE_NAMES.get(str(name).lower())
        if kind == "linear":
            kind = self.linear
        elif kind == "mamba":
            kind = self.mamba
        return (kind,) if kind else None

    def from_layer_types(self, layer_types):
        known = ", ".join(sorted(k for k, v in LAYER_TYPE_NAMES.items()
                                 if v != "mamba" or self.mamba))
        layers = self.place("layer_types", layer_types, self.type_kind,
                            "not a layer type kv_calc knows", known)
        if len(layers) != self.num_layers:
            self.notes.warn("config-inconsistent",
                            f"layer_types lists {len(layers)} layers but num_hidden_layers is "
                            f"{self.num_layers}; using layer_types")
        return layers

    def layer_types(self):
        value = self.cfg.get("layer_types")
        return value if isinstance(value, list) and value else None


def rule_dense(rule):
    """Llama-style: every layer is full attention unless the config lists layer_types."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    window = rule.cfg.get("sliding_window")
    if window:
        rule.notes.assume(f"sliding_window {window} in config.json, but this family applies no "
                          "sliding window in the engines: every layer is full attention")
    return [("full",)] * rule.num_layers


def rule_mistral(rule):
    """Mistral/Mixtral: a non-null sliding_window applies to every layer (MistralConfig)."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    window = rule.cfg.get("sliding_window")
    if window:
        rule.notes.assume(f"sliding_window {window} with no layer_types: every layer is "
                          f"sliding-window, as in MistralConfig ({CITE['tf_defaults']})")
        return [("sliding",)] * rule.num_layers
    return [("full",)] * rule.num_layers


def rule_qwen2(rule):
    """Qwen2/Qwen2-MoE/Qwen3: Qwen2Config builds layer_types as sliding for layers at or past
    max_window_layers when use_sliding_window is set, else every layer is full."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    cfg = rule.cfg
    if not (cfg.get("use_sliding_window") and cfg.get("sliding_window")):
        return [("full",)] * rule.num_layers
    first = cfg.get("max_window_layers")
    if first is None:
        first = 28
        rule.notes.warn("config-field-missing", "config.json has no 'max_window_layers'; "
                        "assumed Qwen2Config's default 28")
    rule.notes.assume(f"use_sliding_window with no layer_types: layers {first} and up are "
                      f"sliding-window, layers below full (Qwen2Config; {CITE['tf_defaults']})")
    return [("sliding",) if i >= first else ("full",) for i in range(rule.num_layers)]


def rule_gemma2(rule):
    """Gemma-2: every other layer sliding, starting with layer 0 (Gemma2Config layer_types:
    sliding when (i + 1) % 2), window 4096 when the config omits it."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    rule.notes.assume("Gemma-2 config without layer_types: layers 0, 2, 4, ... sliding-window, "
                      f"1, 3, 5, ... global, as transformers' Gemma2Config ({CITE['tf_defaults']})")
    return [("sliding",) if (i + 1) % 2 else ("full",) for i in range(rule.num_layers)]


def rule_gemma3(rule):
    """Gemma-3: every sliding_window_pattern-th layer global (default 6), the rest sliding with
    window 4096 unless the config says otherwise (Gemma3TextConfig)."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    pattern = rule.cfg.get("sliding_window_pattern") or 6
    rule.notes.assume(f"Gemma-3 config without layer_types: layer i is global when (i + 1) % "
                      f"{pattern} == 0, sliding-window otherwise (Gemma3TextConfig "
                      f"sliding_window_pattern default 6; {CITE['tf_gemma3']})")
    return [("sliding",) if (i + 1) % pattern else ("full",) for i in range(rule.num_layers)]


def rule_llama4(rule):
    """Llama-4: RoPE layers use chunked local attention (attention_chunk_size, default 8192),
    every no_rope_layer_interval-th layer (default 4) is a global NoPE layer."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    cfg = rule.cfg
    interval = cfg.get("no_rope_layer_interval") or 4
    rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0)
                                         for i in range(rule.num_layers)]
    rule.notes.assume("Llama-4 config without layer_types: layers with RoPE (no_rope_layers[i] "
                      f"= 1; default every layer but each {interval}th) use chunked attention, "
                      f"the NoPE layers global (Llama4TextConfig; {CITE['tf_defaults']})")
    return [("chunked",) if r else ("full",) for r in rope[:rule.num_layers]]


def rule_gpt_oss(rule):
    types = rule.layer_types()
    if not types:
        raise InputError("config.json of a gpt_oss model has no layer_types; it is needed to "
                         "place its sliding-window layers", "layer_types")
    return rule.from_layer_types(types)


def rule_qwen_next(rule):
    """Qwen3-Next / Qwen3.5: Gated DeltaNet layers, every full_attention_interval-th layer full."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    interval = need(rule.cfg, "full_attention_interval", "the hybrid layout")
    return [("full",) if (i + 1) % interval == 0 else ("gdn",) for i in range(rule.num_layers)]


NEMOTRON_PATTERN = {"M": ("mamba2",), "*": ("full",), "-": (), "E": ()}
NEMOTRON_BLOCKS = {"mamba": ("mamba2",), "attention": ("full",), "mlp": (), "moe": ()}


def rule_nemotron_h(rule):
    """Nemotron-H: hybrid_override_pattern, one character a layer: M Mamba-2, * attention,
    - MLP, E MoE (SGLang NemotronHConfig._pattern_to_list)."""
    cfg = rule.cfg
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list) and blocks:
        return rule.place("layers_block_type", blocks, NEMOTRON_BLOCKS.get,
                          "not one of mamba, attention, mlp, moe")
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise InputError("config.json of a nemotron_h model has neither hybrid_override_pattern "
                         "nor layers_block_type; they place its Mamba-2 and attention layers",
                         "hybrid_override_pattern")
    return rule.place("hybrid_override_pattern", pattern, NEMOTRON_PATTERN.get,
                      "a character kv_calc cannot place (M Mamba-2, * attention, - MLP, E MoE)")


def rule_falcon_h1(rule):
    """Falcon-H1: attention and Mamba-2 side by side in every layer (SGLang FalconH1Config
    full_attention_layer_ids and linear_layer_ids are both every layer)."""
    return [("full", "mamba2")] * rule.num_layers


def rule_granite_hybrid(rule):
    types = rule.layer_types()
    if not types:
        raise InputError("config.json of a granitemoehybrid model has no layer_types; it is "
                         "needed to place its Mamba-2 and attention layers", "layer_types")
    return rule.from_layer_types(types)


def rule_jamba(rule):
    """Jamba: attention where i % attn_layer_period == attn_layer_offset, Mamba-1 elsewhere."""
    cfg = rule.cfg
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list) and blocks:
        return rule.from_layer_types(blocks)
    period = cfg.get("attn_layer_period") or 8
    offset = cfg.get("attn_layer_offset")
    offset = 4 if offset is None else offset
    return [("full",) if i % period == offset else ("mamba1",) for i in range(rule.num_layers)]


MINIMAX_FLAGS = {0: ("lightning",), 1: ("full",)}


def rule_minimax(rule):
    """MiniMax-Text-01 / M1: attn_type_list, 0 = lightning (linear) attention, 1 = softmax."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    flags = rule.cfg.get("attn_type_list")
    if not isinstance(flags, list) or not flags:
        raise InputError("config.json of a MiniMax model has neither attn_type_list nor "
                         "layer_types; they place its lightning and softmax attention layers",
                         "attn_type_list")
    return rule.place("attn_type_list", flags, MINIMAX_FLAGS.get,
                      "neither 0 (lightning) nor 1 (softmax)")


def rule_kimi_linear(rule):
    """Kimi-Linear: linear_attn_config lists the KDA layers, 1-based; every other layer is a
    full-attention (MLA) layer (KimiLinearConfig.is_kda_layer / full_attention_layer_ids, the
    same in SGLang configs/kimi_linear.py and vLLM transformers_utils/configs/kimi_linear.py)."""
    kda_cfg = rule.cfg.get("linear_attn_config")
    if not isinstance(kda_cfg, dict) or not isinstance(kda_cfg.get("kda_layers"), list):
        raise InputError("config.json of a kimi_linear model has no linear_attn_config.kda_layers;"
                         " it places its KDA and MLA layers", "linear_attn_config.kda_layers")
    kda = set(kda_cfg["kda_layers"])
    full = set(kda_cfg.get("full_attn_layers") or [])
    stray = [n for n in range(1, rule.num_layers + 1) if (n in kda) == (n in full)]
    if full and stray:
        rule.notes.warn("config-inconsistent",
                        f"linear_attn_config lists layer {stray[0]} (1-based) in both or neither "
                        "of kda_layers and full_attn_layers; the engines take every layer not "
                        "in kda_layers as full attention")
    return [("kda",) if i + 1 in kda else ("full",) for i in range(rule.num_layers)]


def rule_lfm2(rule):
    """LFM2: layer_types ("conv" / "full_attention"), or in the first checkpoints
    full_attn_idxs; every other layer a short-convolution layer (SGLang configs/lfm2.py
    Lfm2Config.linear_layer_ids; vLLM models/lfm2.py)."""
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    idxs = rule.cfg.get("full_attn_idxs")
    if not isinstance(idxs, list):
        raise InputError("config.json of an lfm2 model has neither layer_types nor "
                         "full_attn_idxs; they place its attention and short-convolution layers",
                         "layer_types")
    return [("full",) if i in idxs else ("shortconv",) for i in range(rule.num_layers)]


def rule_fields(rule):
    """A model_type without a family rule: each layer placed from the config's fields, which
    are all known (check_fields); a sliding window no field places is refused."""
    cfg = rule.cfg
    if isinstance(cfg.get("linear_attn_config"), dict):
        return rule_kimi_linear(rule)
    if cfg.get("conv_L_cache") is not None and (cfg.get("full_attn_idxs") is not None or
                                               rule.layer_types()):
        return rule_lfm2(rule)
    types = rule.layer_types()
    if types:
        return rule.from_layer_types(types)
    if cfg.get("hybrid_override_pattern") or cfg.get("layers_block_type"):
        return rule_nemotron_h(rule)
    if cfg.get("attn_type_list"):
        return rule_minimax(rule)
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return [("full",) if (i + 1) % interval == 0 else ("gdn",) for i in range(rule.num_layers)]
    if cfg.get("attention_chunk_size"):
        return rule_llama4(rule)
    return fields_sliding(rule)


def fields_sliding(rule):
    """Where a sliding window applies, from the fields that say so."""
    cfg = rule.cfg
    window = cfg.get("sliding_window")
    pattern = cfg.get("sliding_window_pattern")
    if not window or cfg.get("use_sliding_window") is False:
        return [("full",)] * rule.num_layers
    if pattern:
        return [("full",) if (i + 1) % pattern == 0 else ("sliding",)
                for i in range(rule.num_layers)]
    if cfg.get("use_sliding_window"):
        return rule_qwen2(rule)
    max_pos = cfg.get("max_position_embeddings")
    if max_pos and window >= max_pos:
        rule.notes.assume(f"sliding_window {window} >= max_position_embeddings {max_pos}: no "
                          "request outgrows it, every layer caches like full attention")
        return [("full",)] * rule.num_layers
    if not rule.allow_unknown:
        raise InputError(
            f"config.json sets sliding_window = {window} but no field places it (layer_types, "
            "sliding_window_pattern, use_sliding_window) and its model_type has no family rule; "
            "kv_calc will not guess which layers slide (pass allow_unknown=true to take every "
            "layer as sliding-window, with a warning)", "sliding_window", window)
    rule.notes.warn("unknown-layer-kind", f"sliding_window {window} placed by no field: every "
                    "layer taken as sliding-window, Mistral-style (allow_unknown=true)")
    return [("sliding",)] * rule.num_layers


# model_type -> (rule, what "mamba" means in its layer_types)
FAMILIES = {
    "llama": (rule_dense, None), "deepseek_v2": (rule_dense, None),
    "deepseek_v3": (rule_dense, None), "deepseek_v32": (rule_dense, None),
    "kimi_k2": (rule_dense, None), "glm4": (rule_dense, None), "glm4_moe": (rule_dense, None),
    "minimax_m2": (rule_dense, None), "phi3": (rule_dense, None), "granite": (rule_dense, None),
    "granitemoe": (rule_dense, None), "olmo2": (rule_dense, None),
    "internlm2": (rule_dense, None), "cohere": (rule_dense, None),
    "mistral": (rule_mistral, None), "mixtral": (rule_mistral, None),
    "qwen2": (rule_qwen2, None), "qwen2_moe": (rule_qwen2, None), "qwen3": (rule_qwen2, None),
    "qwen3_moe": (rule_qwen2, None),
    "gemma2": (rule_gemma2, None), "gemma3": (rule_gemma3, None),
    "gemma3_text": (rule_gemma3, None),
    "llama4": (rule_llama4, None), "llama4_text": (rule_llama4, None),
    "gpt_oss": (rule_gpt_oss, None),
    "qwen3_next": (rule_qwen_next, None), "qwen3_5": (rule_qwen_next, None),
    "qwen3_5_text": (rule_qwen_next, None), "qwen3_5_moe": (rule_qwen_next, None),
    "qwen3_5_moe_text": (rule_qwen_next, None),
    "nemotron_h": (rule_nemotron_h, None), "falcon_h1": (rule_falcon_h1, None),
    "granitemoehybrid": (rule_granite_hybrid, "mamba2"), "jamba": (rule_jamba, "mamba1"),
    "minimax": (rule_minimax, None), "minimaxtext01": (rule_minimax, None),
    "minimax_text_01": (rule_minimax, None), "minimax_m1": (rule_minimax, None),
    "minimaxm1": (rule_minimax, None),
    "kimi_linear": (rule_kimi_linear, None),
    "lfm2": (rule_lfm2, None), "lfm2_moe": (rule_lfm2, None),
}
# Words of a model_type that rename a family without changing its layers: a multimodal
# wrapper's text model (qwen3_vl_moe_text), a smaller sibling (glm4_moe_lite), a
# vision-language variant (qwen3_vl_moe).
ALIAS_WORDS = ("text", "lite", "vl")


def resolve_family(model_type):
    """(family, how) for a model_type with a family rule, or (None, None)."""
    key = str(model_type).lower()
    if key in FAMILIES:
        return key, f"family rule of model_type {key!r}"
    base = "_".join(w for w in key.split("_") if w not in ALIAS_WORDS)
    if base != key and base in FAMILIES:
        dropped = ", ".join(f"'_{w}'" for w in key.split("_") if w in ALIAS_WORDS)
        return base, (f"family rule of {base!r}: model_type {model_type!r} only renames it "
                      f"({dropped} dropped)")
    return None, None


def read_layers(cfg, model_type, num_layers, notes, allow_unknown):
    """(the rule used, per-layer mixer kinds)."""
    check_fields(cfg, notes, allow_unknown)
    rule = LayerRule(cfg, num_layers, notes, allow_unknown)
    family, how = resolve_family(model_type) if model_type is not None else (None, None)
    if family is None:
        layers = rule_fields(rule)
        why = "config.json has no model_type" if model_type is None else \
            f"model_type {model_type!r} has no family rule"
        return {"reader": "fields", "family": None,
                "how": f"{why}: each layer placed from its fields, every one of which kv_calc "
                       "knows"}, layers
    rule_fn, mamba = FAMILIES[family]
    rule.linear = "lightning" if rule_fn is rule_minimax else "gdn"
    rule.mamba = mamba
    return {"reader": rule_fn.__name__[len("rule_"):], "family": family, "how": how}, rule_fn(rule)


def read_attention(cfg, notes):
    """The per-token cache of the attention layers: MHA/GQA heads, or the MLA latent (and the
    DSA indexer key of DeepSeek-V3.2)."""
    if cfg.get("kv_lora_rank"):
        att = Attention(style="mla", num_kv_heads=1, kv_lora_rank=cfg["kv_lora_rank"],
                        qk_rope_head_dim=need(cfg, "qk_rope_head_dim", "MLA rope dimension"))
        if cfg.get("index_topk") is not None:
            # vLLM checks `hasattr(hf_config, "index_topk")`; SGLang is_deepseek_nsa likewise.
            att.index_head_dim = field_or_default(cfg, "index_head_dim", 128, notes)
        return att
    heads = need(cfg, "num_attention_heads")
    kv_heads = field_or_default(cfg, "num_key_value_heads", heads, notes)
    head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim")
    if head_dim is None:
        hidden = need(cfg, "hidden_size", "head_dim is absent, so hidden_size is needed")
        head_dim = hidden // heads
        notes.assume(f"head_dim = hidden_size / num_attention_heads = {hidden} / {heads} = "
                     f"{head_dim} (config.json has no head_dim; transformers and the engines "
                     "derive it the same way)")
    return Attention(style="mha", num_kv_heads=kv_heads, head_dim=head_dim,
                     v_head_dim=cfg.get("v_head_dim") or head_dim)


def read_gdn(cfg, notes):
    return {"key_heads": need(cfg, "linear_num_key_heads"),
            "key_dim": need(cfg, "linear_key_head_dim"),
            "value_heads": need(cfg, "linear_num_value_heads"),
            "value_dim": need(cfg, "linear_value_head_dim"),
            "conv_kernel": field_or_default(cfg, "linear_conv_kernel_dim", 4, notes)}


def read_mamba2(cfg, family, notes):
    """Mamba-2 dimensions under each family's field names (NemotronHConfig, FalconH1Config,
    GraniteMoeHybridConfig); intermediate = heads x head_dim."""
    if family == "falcon_h1":
        hidden = need(cfg, "hidden_size")
        inner = cfg.get("mamba_d_ssm") or (cfg.get("mamba_expand") or 2) * hidden
        heads = need(cfg, "mamba_n_heads")
        head_dim = cfg.get("mamba_d_head")
        head_dim = inner // heads if head_dim in (None, "auto") else head_dim
        return {"intermediate": inner, "heads": heads, "head_dim": head_dim,
                "n_groups": field_or_default(cfg, "mamba_n_groups", 1, notes),
                "state": need(cfg, "mamba_d_state"),
                "conv_kernel": field_or_default(cfg, "mamba_d_conv", 4, notes)}
    if family == "granite_hybrid":
        heads, head_dim = need(cfg, "mamba_n_heads"), need(cfg, "mamba_d_head")
        return {"intermediate": (cfg.get("mamba_expand") or 2) * need(cfg, "hidden_size"),
                "heads": heads, "head_dim": head_dim,
                "n_groups": field_or_default(cfg, "mamba_n_groups", 1, notes),
                "state": need(cfg, "mamba_d_state"),
                "conv_kernel": field_or_default(cfg, "mamba_d_conv", 4, notes)}
    heads, head_dim = need(cfg, "mamba_num_heads"), need(cfg, "mamba_head_dim")
    return {"intermediate": heads * head_dim, "heads": heads, "head_dim": head_dim,
            "n_groups": first_of(cfg, ("n_groups", "mamba_n_groups"), "Mamba-2 groups"),
            "state": first_of(cfg, ("ssm_state_size", "mamba_d_state"), "Mamba-2 state size"),
            "conv_kernel": cfg.get("conv_kernel") or cfg.get("mamba_d_conv") or 4}


def read_mamba1(cfg, notes):
    return {"intermediate": (cfg.get("mamba_expand") or 2) * need(cfg, "hidden_size"),
            "state": field_or_default(cfg, "mamba_d_state", 16, notes),
            "conv_kernel": field_or_default(cfg, "mamba_d_conv", 4, notes)}


def read_lightning(cfg, attention):
    heads = need(cfg, "num_attention_heads")
    return {"heads": heads, "head_dim": cfg.get("head_dim") or attention.head_dim}


def read_kda(cfg, notes):
    """Kimi Delta Attention: heads, head dim and short-conv kernel from linear_attn_config
    (KimiLinearStateShape.create takes num_heads, head_dim, short_conv_kernel_size)."""
    kda = cfg.get("linear_attn_config") or {}

    def field_of(key):
        if kda.get(key) is None:
            raise InputError(f"config.json has no 'linear_attn_config.{key}'; it is needed to "
                             "size the KDA state", f"linear_attn_config.{key}")
        return kda[key]

    kernel = kda.get("short_conv_kernel_size")
    if kernel is None:
        kernel = 4
        notes.warn("config-field-missing", "config.json has no 'linear_attn_config."
                   "short_conv_kernel_size'; assumed 4 (KimiLinearStateShape default)")
    return {"heads": field_of("num_heads"), "head_dim": field_of("head_dim"),
            "conv_kernel": kernel}


def read_shortconv(cfg):
    """LFM2's short convolution: hidden_size channels, conv_L_cache - 1 of them kept (SGLang
    Lfm2Config.mamba2_cache_params, vLLM Lfm2ForCausalLM.get_mamba_state_shape_from_config)."""
    return {"hidden": need(cfg, "hidden_size"),
            "conv_kernel": need(cfg, "conv_L_cache", "the short convolution's cache length")}


def read_recurrent(cfg, family, kinds, attention, notes):
    readers = {"gdn": lambda: read_gdn(cfg, notes),
               "kda": lambda: read_kda(cfg, notes),
               "mamba2": lambda: read_mamba2(cfg, family, notes),
               "mamba1": lambda: read_mamba1(cfg, notes),
               "lightning": lambda: read_lightning(cfg, attention),
               "shortconv": lambda: read_shortconv(cfg)}
    return {kind: Recurrent(kind, readers[kind]()) for kind in RECURRENT_KINDS if kind in kinds}


def read_window(cfg, family, kinds, notes):
    """(sliding window, chunk size) with the families' transformers defaults."""
    window = chunk = None
    if "sliding" in kinds:
        window = cfg.get("sliding_window")
        if window is None and family in ("gemma2", "gemma3"):
            window = 4096
            notes.assume(f"sliding_window absent: {window}, the {family.capitalize()} config "
                         "class default")
        if window is None:
            window = need(cfg, "sliding_window", "layer_types has sliding layers")
    if "chunked" in kinds:
        chunk = cfg.get("attention_chunk_size")
        if chunk is None:
            chunk = need(cfg, "attention_chunk_size", "layer_types has chunked layers")
    return window, chunk


def read_mtp_layers(cfg):
    """MTP/NextN draft layers the checkpoint carries (DeepSeek/GLM/Nemotron: num_nextn_predict_
    layers; Qwen3-Next/Qwen3.5: mtp_num_hidden_layers)."""
    return int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0)


def parse_model(source, notes, allow_unknown=False):
    cfg, wrapper = text_config(source.config)
    if wrapper and wrapper != "text_config":
        notes.assume(f"multimodal wrapper: the language model is read from {wrapper}")
    model_type = cfg.get("model_type") if cfg.get("model_type") is not None else \
        source.config.get("model_type")
    if cfg.get("layers_block_type") and cfg.get("num_hidden_layers") is None:
        num_layers = len(cfg["layers_block_type"])
    elif isinstance(cfg.get("hybrid_override_pattern"), str) and \
            cfg.get("num_hidden_layers") is None:
        num_layers = len(cfg["hybrid_override_pattern"])
    else:
        num_layers = need(cfg, "num_hidden_layers")
    torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if torch_dtype is None:
        torch_dtype = "bfloat16"
        notes.warn("config-field-missing",
                   "config.json has no 'torch_dtype'; assumed bfloat16 for 'auto' and the "
                   "conv state")
    rule, layers = read_layers(cfg, model_type, num_layers, notes, allow_unknown)
    kinds = {k for mixers in layers for k in mixers}
    architectures = list(source.config.get("architectures") or cfg.get("architectures") or [])
    model = Model(
        name=source.label, family=rule["reader"], attention=Attention(), layers=layers,
        torch_dtype=str(torch_dtype).replace("torch.", ""),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        architectures=architectures, model_type=source.config.get("model_type") or model_type,
        mtp_layers=read_mtp_layers(cfg), config_ssm_dtype=cfg.get("mamba_ssm_dtype"),
        rule=dict(rule, model_type=model_type))
    family = model.family
    if model.max_position_embeddings is None and family in ("gemma3",):
        model.max_position_embeddings = 131072
        notes.assume("max_position_embeddings absent: 131,072, the Gemma3TextConfig default")
    if model.max_position_embeddings is None and cfg.get("model_max_length"):
        model.max_position_embeddings = int(cfg["model_max_length"])
        notes.assume(f"max_position_embeddings absent: the context is model_max_length "
                     f"{fmt_int(model.max_position_embeddings)}, the next key the engines read "
                     f"for it ({CITE['sg_context_len']})")
    if model.max_position_embeddings is None:
        notes.warn("config-field-missing", "config.json has no 'max_position_embeddings'; "
                   "the concurrency table uses only the given/default context lengths")
    if any(k in ATTENTION_KINDS for k in kinds) or not kinds & set(RECURRENT_KINDS):
        model.attention = read_attention(cfg, notes)
    model.sliding_window, model.chunk_size = read_window(cfg, family, kinds, notes)
    model.recurrent = read_recurrent(cfg, family, kinds, model.attention, notes)
    return model, cfg


# ---------------------------------------------------------------------------------------
# Checkpoint files: quantization metadata, safetensors headers


def checkpoint_kv_quant(source, cfg):
    """The KV dtype a checkpoint asks for, and where that was read; (None, None) if none."""
    quant = (source.quant_file or {}).get("quantization") or {}
    algo = quant.get("kv_cache_quant_algo")
    where = "hf_quant_config.json kv_cache_quant_algo"
    if algo is None:
        qc = cfg.get("quantization_config") or {}
        algo = qc.get("kv_cache_quant_algo")
        where = "config.json quantization_config.kv_cache_quant_algo"
        scheme = qc.get("kv_cache_scheme")
        if algo is None and isinstance(scheme, dict):
            # compressed-tensors: {"num_bits": 8, "type": "float"}
            where = "config.json quantization_config.kv_cache_scheme"
            if scheme.get("num_bits") == 8 and scheme.get("type", "float") == "float":
                algo = "FP8"
            elif scheme.get("num_bits") == 4 and scheme.get("type", "float") == "float":
                algo = "NVFP4"
    if algo is None:
        return None, None
    algo = str(algo).upper()
    if algo == "FP8":
        return "fp8_e4m3", f"{where} = \"FP8\""
    if algo == "NVFP4":
        return "nvfp4", f"{where} = \"NVFP4\""
    return None, f"{where} = \"{algo}\" (not a KV dtype this calculator knows)"


def read_safetensors_header(path):
    """The JSON header of a .safetensors file: 8-byte little-endian length, then JSON."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * MIB:
            raise ValueError(f"header length {length} is implausible")
        header = json.loads(f.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return length, header


# Tensor-name parts of the mixers that DP attention replicates on every DP rank.
ATTENTION_SIDE_PARTS = (".self_attn.", ".linear_attn.", ".mixer.", ".attention.", ".attn.")


@dataclass
class Weights:
    files: int = 0
    bytes: int = 0
    attention_bytes: int = 0  # tensor data of attention / linear-attention / SSM mixers
    tensor_names: list = field(default_factory=list)
    unreadable: list = field(default_factory=list)


def _tensor_bytes(entry):
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if isinstance(offsets, list) and len(offsets) == 2:
        return int(offsets[1]) - int(offsets[0])
    return 0


def scan_safetensors(ckpt):
    """Size of the weights (tensor data bytes) and the tensor names, from the files' headers."""
    weights = Weights()
    for path in sorted(ckpt.glob("*.safetensors")):
        weights.files += 1
        size = path.stat().st_size
        try:
            length, header = read_safetensors_header(path)
        except (OSError, ValueError) as e:
            weights.unreadable.append(f"{path.name} ({e})")
            weights.bytes += size
            continue
        weights.bytes += size - 8 - length
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            weights.tensor_names.append(name)
            if any(part in name for part in ATTENTION_SIDE_PARTS):
                weights.attention_bytes += _tensor_bytes(entry)
    return weights


def has_kv_scales(tensor_names):
    # modelopt writes self_attn.k_proj.k_scale, compressed-tensors self_attn.k_scale.
    names = [n.rsplit(".", 1)[-1] for n in tensor_names]
    return "k_scale" in names and "v_scale" in names


def attention_params_estimate(model, cfg):
    """Parameters of the mixers DP attention replicates, from config.json alone (an estimate
    for presets and bare configs: projections only, no norms or biases)."""
    hidden = cfg.get("hidden_size") or 0
    att, total = model.attention, 0
    heads = cfg.get("num_attention_heads") or 0
    if att.style == "mla":
        q_rank = cfg.get("q_lora_rank") or 0
        qk = (cfg.get("qk_nope_head_dim") or 0) + (att.qk_rope_head_dim or 0)
        q = hidden * q_rank + q_rank * heads * qk if q_rank else hidden * heads * qk
        kv = hidden * (att.kv_lora_rank + att.qk_rope_head_dim) + att.kv_lora_rank * heads * (
            (cfg.get("qk_nope_head_dim") or 0) + (cfg.get("v_head_dim") or 0))
        per_layer = q + kv + heads * (cfg.get("v_head_dim") or 0) * hidden
    else:
        gate = 2 if cfg.get("attn_output_gate") else 1
        per_layer = hidden * heads * att.head_dim * (gate + 1) + \
            2 * hidden * att.num_kv_heads * att.head_dim
    total += per_layer * sum(model.count(k) for k in ATTENTION_KINDS)
    gdn = model.recurrent.get("gdn")
    if gdn:
        d = gdn.dims
        k_dim, v_dim = d["key_heads"] * d["key_dim"], d["value_heads"] * d["value_dim"]
        total += (hidden * (2 * k_dim + 2 * v_dim + 2 * d["value_heads"]) + v_dim * hidden) * \
            model.count("gdn")
    for kind in ("mamba2", "mamba1"):
        rec = model.recurrent.get(kind)
        if rec:
            inner = rec.dims["intermediate"]
            total += (hidden * 2 * inner + inner * hidden) * model.count(kind)
    kda = model.recurrent.get("kda")
    if kda:  # q, k, v, gate and output projections
        total += 5 * hidden * kda.dims["heads"] * kda.dims["head_dim"] * model.count("kda")
    conv = model.recurrent.get("shortconv")
    if conv:  # LFM2 ShortConv: in_proj (3 x hidden) and out_proj
        total += 4 * hidden * conv.dims["hidden"] * model.count("shortconv")
    return total


# ---------------------------------------------------------------------------------------
# Memory per GPU for the KV pool: given, or probed with nvidia-smi and the weights' size


# What a pool's GiB stand for. Stated (kv_memory_gib): the pool's size as the engine reports it,
# its tensors (SGLang's 'KV size'). Derived (probed, planned): the memory available for the pool
# (SGLang's rest_memory), which the engine sizes its pool from. They differ for DeepSeek-V3.2 in
# SGLang, whose profile counts 708 bytes a layer and pool stores 788 plus a padding page.
POOL_IS_KV_SIZE = "kv_size"
POOL_IS_AVAILABLE = "available"
POOL_IS_WORDS = {POOL_IS_KV_SIZE: "its size as the engine reports it",
                 POOL_IS_AVAILABLE: "memory available for the pool"}


@dataclass
class Memory:
    source: str  # "given", "probed" or "unknown"
    pool_gib: float = None
    pool_is: str = None  # POOL_IS_KV_SIZE or POOL_IS_AVAILABLE
    gpus: list = None
    probe_failure: str = None  # why nvidia-smi gave nothing
    tp: int = 1
    gpu_total_mib: int = None
    mem_fraction: float = None
    mem_fraction_source: str = None
    weights_bytes: int = None
    weights_source: str = None
    weights_per_gpu_bytes: int = None
    activation_reserve_gib: float = None
    activation_reserve_source: str = None
    exhausted: bool = False
    unreadable: list = field(default_factory=list)  # safetensors files sized by file size

    @property
    def pool_bytes(self):
        return None if self.pool_gib is None else int(self.pool_gib * GIB)

    def to_json(self):
        out = {"source": self.source, "pool_gib": self.pool_gib, "pool_bytes": self.pool_bytes,
               "pool_is": self.pool_is}
        if self.gpus is not None:
            out["gpus"] = self.gpus
        if self.source == "probed":
            out.update({"gpu_total_mib": self.gpu_total_mib, "mem_fraction": self.mem_fraction,
                        "mem_fraction_source": self.mem_fraction_source,
                        "weights_bytes": self.weights_bytes,
                        "weights_source": self.weights_source,
                        "weights_per_gpu_bytes": self.weights_per_gpu_bytes,
                        "activation_reserve_gib": self.activation_reserve_gib,
                        "activation_reserve_source": self.activation_reserve_source})
        return out


NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total,memory.used,memory.free",
                    "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text):
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            continue
        try:
            index, total = int(fields[0]), int(fields[-3])
            used, free = int(fields[-2]), int(fields[-1])
        except ValueError:
            continue  # "[N/A]" and the like
        gpus.append({"index": index, "name": ",".join(fields[1:-3]).strip(),
                     "memory_total_mib": total, "memory_used_mib": used,
                     "memory_free_mib": free})
    return gpus


def probe_gpus():
    """(gpus, None) from nvidia-smi, or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no kv_memory_gib and no nvidia-smi on PATH: max tokens are not computed"
    try:
        done = subprocess.run([exe] + NVIDIA_SMI_QUERY, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed ({e})"
    gpus = parse_nvidia_smi(done.stdout)
    if done.returncode != 0 or not gpus:
        said = (done.stderr or done.stdout).strip()[:200]
        return None, f"nvidia-smi gave no GPU memory (exit {done.returncode}: {said})"
    return gpus, None


@dataclass
class WeightsSize:
    bytes: int = None
    source: str = None
    attention_bytes: int = None  # replicated by DP attention
    attention_source: str = None
    unreadable: list = field(default_factory=list)


def weights_size(params, source, weights, model=None, cfg=None):
    """The whole checkpoint's size and how it was found; bytes is None when nothing tells."""
    size = WeightsSize()
    if params["weights_gib"] is not None:
        size.bytes, size.source = int(params["weights_gib"] * GIB), "given"
    elif weights is not None and weights.files:
        files = "file" if weights.files == 1 else "files"
        size.bytes = weights.bytes
        size.source = f"probed: tensor data of {weights.files} *.safetensors {files} in " \
                      f"{source.label}"
        size.unreadable = weights.unreadable
    elif source.preset:
        preset = PRESETS[source.preset]
        size.bytes = int(preset["weights_gib"] * GIB)
        size.source = f"assumed: ~{preset['weights_gib']} GiB, " + preset.get(
            "weights_how", f"the size of the official {preset['name']} checkpoint")
    if size.source and size.source.startswith("probed") and weights.attention_bytes:
        size.attention_bytes = weights.attention_bytes
        size.attention_source = "tensor data of the attention/SSM mixers in the safetensors"
    elif model is not None and cfg is not None:
        size.attention_bytes = attention_params_estimate(model, cfg) * 2
        size.attention_source = "estimated from config.json at 2 bytes per parameter"
    return size


def weights_per_gpu(size, gpus, dp):
    """Experts and MLPs shard over all GPUs; under DP attention each DP rank holds the attention
    side whole across its gpus / dp GPUs."""
    if size.bytes is None:
        return None
    if dp == 1 or not size.attention_bytes:
        return size.bytes // gpus
    return size.bytes // gpus + size.attention_bytes * (dp - 1) // gpus


# The engines' defaults for the share of GPU memory that weights + cache may take.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# SGLang ServerArgs._handle_gpu_memory_settings: by GPU memory (MiB, nvidia-smi memory.total),
# (below, chunked_prefill_size, cuda_graph_max_bs below TP 4, cuda_graph_max_bs from TP 4).
SGLANG_GPU_CLASSES = ((20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80),
                      (60 * 1024, 4096, 32, 160), (90 * 1024, 8192, 256, 512),
                      (160 * 1024, 8192, 256, 512), (None, 16384, 512, 512))


@dataclass
class MemFraction:
    value: float
    source: str  # the rule, with the arithmetic that gave value


def sglang_reserved_mib(gpu_mib, tp, dp, dp_attention, speculative):
    """SGLang _handle_gpu_memory_settings: MiB kept out of mem_fraction_static for activations
    (chunked prefill), CUDA graphs, large TP, DP attention and a speculative draft model."""
    chunk, bs = next((c, small if tp < 4 else large) for limit, c, small, large
                     in SGLANG_GPU_CLASSES if limit is None or gpu_mib < limit)
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp / 8 * 1024
    if dp_attention:
        reserved += bs * dp * 3
        if bs > 300:
            reserved += bs * dp * 1.5
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative:
        reserved += 2 * 1024
    return reserved, chunk, bs


def sglang_vlm_factor(vision):
    """SGLang adjust_mem_fraction_for_vlm: 0.95 x (1 - 0.1 x (ViT size / ViT-L size - 1)), the
    second factor clamped to [0.8, 1.05]; layers and width default to ViT-L's 24 and 1024 when
    the vision config does not name them (Qwen's says depth, not num_hidden_layers)."""
    ratio = (vision.get("num_hidden_layers") or 24) * (vision.get("hidden_size") or 1024) ** 2 \
        / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def sglang_mem_fraction(gpu_mib, tp, dp=1, dp_attention=False, vision=None, speculative=False):
    """SGLang's --mem-fraction-static default for this GPU and parallelism."""
    reserved, chunk, bs = sglang_reserved_mib(gpu_mib, tp, dp, dp_attention, speculative)
    base = round((gpu_mib - reserved) / gpu_mib, 3)
    how = (f"SGLang default: round(({fmt_num(Fraction(gpu_mib).limit_denominator(100))} MiB - "
           f"{fmt_num(Fraction(reserved).limit_denominator(10))} MiB reserved) / GPU, 3) = {base} "
           f"(chunked_prefill_size {chunk}, cuda_graph_max_bs {bs}, TP {tp}"
           + (f", DP attention {dp}" if dp_attention else "") + (", speculative" if speculative
                                                                 else "") + ")")
    if vision is None:
        return MemFraction(base, f"{how}; {CITE['sg_mem_fraction']}")
    factor = sglang_vlm_factor(vision)
    return MemFraction(base * factor, f"{how} x {factor:.4f} for the vision encoder "
                                      f"(adjust_mem_fraction_for_vlm) = {base * factor:.4f}; "
                                      f"{CITE['sg_mem_fraction']}")


def vllm_mem_fraction():
    return MemFraction(VLLM_GPU_MEMORY_UTILIZATION,
                       f"vLLM default --gpu-memory-utilization {VLLM_GPU_MEMORY_UTILIZATION} "
                       f"({CITE['vl_cache_config']})")


def engine_mem_fraction(params, engine, gpu_mib, tp, dp=1, dp_attention=False, vision=None):
    if params["mem_fraction"] is not None:
        return MemFraction(float(params["mem_fraction"]), "given")
    if engine == "vllm":
        return vllm_mem_fraction()
    return sglang_mem_fraction(gpu_mib, tp, dp, dp_attention, vision, params["mtp"])


def resolve_memory(params, source, weights, engine, tp, dp=1, model=None, cfg=None):
    """The GiB per GPU that the KV pool (and recurrent state) may use, and how it was found."""
    if params["kv_memory_gib"] is not None:
        return Memory("given", float(params["kv_memory_gib"]), POOL_IS_KV_SIZE, tp=tp)
    gpus, failure = probe_gpus()
    if gpus is None:
        return Memory("unknown", probe_failure=failure, tp=tp)
    memory = Memory("unknown", gpus=gpus, tp=tp,
                    gpu_total_mib=min(g["memory_total_mib"] for g in gpus[:tp]))
    size = weights_size(params, source, weights, model, cfg)
    memory.weights_bytes, memory.weights_source = size.bytes, size.source
    memory.unreadable = size.unreadable
    if memory.weights_bytes is None:
        return memory
    memory.weights_per_gpu_bytes = weights_per_gpu(size, tp, dp)
    frac = engine_mem_fraction(params, engine, memory.gpu_total_mib, tp, dp, dp > 1,
                               vision_config(source))
    memory.mem_fraction, memory.mem_fraction_source = frac.value, frac.source
    memory.activation_reserve_gib, memory.activation_reserve_source = activation_reserve(
        params, engine)
    per_gpu_gib = memory.weights_bytes / tp / GIB if dp == 1 else \
        memory.weights_per_gpu_bytes / GIB
    # SGLang works in GiB floats: rest = total * mem_fraction - weights (after loading).
    pool_gib = (memory.gpu_total_mib / 1024 * memory.mem_fraction - per_gpu_gib
                - memory.activation_reserve_gib)
    memory.exhausted = pool_gib <= 0
    memory.source, memory.pool_is = "probed", POOL_IS_AVAILABLE
    memory.pool_gib = 0.0 if memory.exhausted else pool_gib
    return memory


def activation_reserve(params, engine):
    reserve = params["activation_reserve_gib"]
    if reserve is None:
        return DEFAULT_ACTIVATION_RESERVE_GIB[engine], f"assumed ({engine} default)"
    return reserve, "given"


# ---------------------------------------------------------------------------------------
# The inputs of one sizing, gathered once


@dataclass
class Inputs:
    """Everything the arithmetic reads: the model, the deployment and the engine's settings."""
    source: Source
    model: Model
    tp: int
    engine: str
    page_size: int
    ssm_dtype: str  # the parameter: "auto" or a dtype
    mamba_ratio: float  # SGLang --mamba-full-memory-ratio
    contexts: list
    memory: Memory
    dtypes: dict  # requested name ("auto", "bf16", ...) -> the dtype it resolves to
    dp: int = 1
    attention_backend: str = "auto"
    mtp: bool = False
    ckpt_quant: str = None  # the KV dtype the checkpoint asks for
    quant_where: str = None  # where that was read
    weights: Weights = None
    cfg: dict = None
    gpu_name: str = None

    @property
    def attn_tp(self):
        """SGLang get_attention_tp_size: tp // dp with DP attention."""
        return self.tp // self.dp


BLACKWELL_NAMES = ("B100", "B200", "B300", "GB200", "GB300", "RTX PRO 6000", "RTX 50",
                   "BLACKWELL")


def is_blackwell(gpu_name):
    return gpu_name is not None and any(n in gpu_name.upper() for n in BLACKWELL_NAMES)


def resolve_kv_dtype(name, model, ckpt_quant, engine="sglang", gpu_name=None):
    """`auto` is what the engines pick: the checkpoint's KV dtype, else the model's dtype (a
    float32 config runs as bf16 for Gemma, fp16 otherwise); DeepSeek-V3.2 has its own rule."""
    if name != "auto":
        return name
    if model.is_dsa:
        # vLLM DeepseekV32ForCausalLM.verify_and_update_config turns auto into fp8_ds_mla;
        # SGLang picks fp8_e4m3 on Blackwell (major >= 10), bfloat16 otherwise.
        if engine == "vllm" or is_blackwell(gpu_name):
            return "fp8_e4m3"
        return "bf16"
    if ckpt_quant:
        return ckpt_quant
    return model_dtype(model)


def model_dtype(model):
    """The dtype the engines run the model in with --dtype auto (SGLang _get_and_verify_dtype:
    a float32 config runs as bf16 for Gemma, fp16 otherwise)."""
    if model.torch_dtype in ("float32", "float"):
        return "bf16" if str(model.model_type or "").startswith("gemma") else "fp16"
    return TORCH_TO_KV.get(model.torch_dtype, "bf16")


def context_lengths(params, model):
    if params["context"]:
        return sorted(set(params["context"]))
    contexts = list(DEFAULT_CONTEXTS)
    if model.max_position_embeddings:
        contexts.append(model.max_position_embeddings)
    return sorted(set(contexts))


def default_page_size(params, engine, model):
    if params["page_size"]:
        return params["page_size"]
    if model.is_dsa:
        return DSA_PAGE_SIZE
    return DEFAULT_PAGE_SIZE[engine]


def gather_inputs(params, notes, source=None, parsed=None):
    source = source or resolve_source(params)
    model, cfg = parsed or parse_model(source, notes, params["allow_unknown"])
    engine = params["engine"]
    weights = scan_safetensors(source.checkpoint) if source.checkpoint else None
    ckpt_quant, quant_where = checkpoint_kv_quant(source, cfg)
    requested = list(dict.fromkeys(params["kv_dtype"]))
    return Inputs(
        source=source, model=model, tp=params["tp"], dp=params["dp"], engine=engine,
        page_size=default_page_size(params, engine, model), ssm_dtype=params["ssm_dtype"],
        mamba_ratio=float(params["mamba_full_memory_ratio"]),
        contexts=context_lengths(params, model), memory=None,
        dtypes={name: resolve_kv_dtype(name, model, ckpt_quant, engine) for name in requested},
        attention_backend=params["attention_backend"], mtp=params["mtp"], ckpt_quant=ckpt_quant,
        quant_where=quant_where, weights=weights, cfg=cfg)


# ---------------------------------------------------------------------------------------
# The arithmetic: numbers only, each step as the engine takes it


def kv_heads_per_gpu(num_kv_heads, tp):
    """vLLM ModelConfig.get_num_kv_heads / SGLang ModelConfig.get_num_kv_heads: with fewer KV
    heads than GPUs each GPU holds one replicated head."""
    return max(1, num_kv_heads // tp)


def elements_per_token_per_layer(model, tp):
    """Cached values per token in one attention layer on one GPU (the plain row)."""
    att = model.attention
    if att.style == "mla":
        # MLA caches the latent (kv_lora_rank) plus the decoupled rope key; it is not split
        # across TP ranks (SGLang MLATokenToKVPool, vLLM MLAAttentionSpec).
        return att.kv_lora_rank + att.qk_rope_head_dim
    return kv_heads_per_gpu(att.num_kv_heads, tp) * (att.head_dim + att.v_head_dim)


def dsa_row_bytes(att, dtype, engine, backend):
    """The MLA row DeepSeek-V3.2 stores: with FP8, the latent in FP8 plus one fp32 scale per 128
    values plus the rope part in bf16 = 512 + 16 + 128 = 656 bytes (vLLM MLAAttentionSpec
    fp8_ds_mla; SGLang calculate_mla_kv_cache_dim, except with the trtllm NSA backend)."""
    if dtype.startswith("fp8") and not (engine == "sglang" and backend == "trtllm"):
        rank = att.kv_lora_rank
        return Fraction(rank + rank // DSA_QUANT_BLOCK * 4 + att.qk_rope_head_dim * 2)
    return (att.kv_lora_rank + att.qk_rope_head_dim) * DTYPE_BYTES[dtype]


def indexer_bytes(att):
    """The DSA indexer key per token and layer: FP8 values plus an fp32 scale per 128 (SGLang
    NSATokenToKVPool index_k_with_scale_buffer; vLLM DeepseekV32IndexerCache, uint8)."""
    return Fraction(att.index_head_dim + att.index_head_dim // DSA_QUANT_BLOCK * 4)


@dataclass
class RowBytes:
    """One token in one attention layer on one GPU."""
    profiled: Fraction  # what SGLang's get_cell_size_per_token counts
    allocated: Fraction  # what the pool's tensors hold
    main: Fraction  # the K+V (or MLA) row alone
    indexer: Fraction = Fraction(0)


def row_bytes(inp, dtype):
    att = inp.model.attention
    plain = elements_per_token_per_layer(inp.model, inp.attn_tp) * DTYPE_BYTES[dtype]
    if not inp.model.is_dsa:
        return RowBytes(plain, plain, plain)
    index = indexer_bytes(att)
    main = dsa_row_bytes(att, dtype, inp.engine, inp.attention_backend)
    return RowBytes(plain + index, main + index, main, index)


def bytes_per_token(model, tp, dtype, kinds=("full",)):
    """Per GPU, K+V (or the MLA latent), summed over the layers of the given kinds."""
    layers = sum(model.count(k) for k in kinds)
    return elements_per_token_per_layer(model, tp) * layers * DTYPE_BYTES[dtype]


def naive_bytes_per_token(model, dtype):
    """The figure that puts every KV head on every GPU (what TP-unaware calculators print)."""
    att = model.attention
    per_layer = att.num_kv_heads * (att.head_dim + att.v_head_dim)
    return per_layer * model.count("full") * DTYPE_BYTES[dtype]


def sglang_swa_pool(inp):
    """SGLang keeps a separate sliding-window pool only for the hybrid-SWA architectures
    (model_config is_hybrid_swa_model: Llama-4, GPT-OSS, MiMo-V2, Step-3.5, ...), and turns it
    off for GPT-OSS on the trtllm_mha backend; everyone else (Gemma-2/3, Mistral, Qwen2) caches
    every token in every layer."""
    archs = set(inp.model.architectures)
    if not archs & SGLANG_HYBRID_SWA_ARCHS:
        return False
    return not ("GptOssForCausalLM" in archs and inp.attention_backend == "trtllm")


SGLANG_HYBRID_SWA_ARCHS = {"Llama4ForConditionalGeneration", "GptOssForCausalLM",
                           "MiMoV2FlashForCausalLM", "MiMoV2MTP", "Step3p5ForCausalLM",
                           "Step3p5MTP", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"}


def per_token_layers(inp):
    """Attention layers whose cache grows with every token in the engine's pool."""
    model = inp.model
    full = model.count("full")
    windowed = model.count("sliding") + model.count("chunked")
    if model.recurrent_layers():
        return full
    if not full:
        return windowed  # every layer windowed: the pool is sized per token over them
    if inp.engine == "sglang" and not sglang_swa_pool(inp):
        return full + windowed
    return full


# Recurrent state ------------------------------------------------------------------------


@dataclass
class StateDtypes:
    conv: str
    ssm: str
    how: str


def state_dtypes(inp):
    """SGLang mamba2_state_dtype: conv bfloat16 (SGLANG_MAMBA_CONV_DTYPE), SSM from config
    mamba_ssm_dtype else float32; vLLM MambaStateDtypeCalculator: conv = the model dtype
    (--mamba-cache-dtype auto), SSM = conv (--mamba-ssm-cache-dtype auto)."""
    model = inp.model
    if inp.engine == "sglang":
        conv = "bfloat16"
        if inp.ssm_dtype != "auto":
            return StateDtypes(conv, inp.ssm_dtype, "given")
        if model.config_ssm_dtype in ("float32", "bfloat16", "float16"):
            return StateDtypes(conv, model.config_ssm_dtype, "config.json mamba_ssm_dtype")
        return StateDtypes(conv, "float32", "SGLang default")
    conv = KV_TO_TORCH[model_dtype(model)]
    if inp.ssm_dtype != "auto":
        return StateDtypes(conv, inp.ssm_dtype, "given")
    return StateDtypes(conv, conv, "vLLM default (the model dtype)")


def extra_groups_for_head_shards(ngroups, tp):
    """SGLang/vLLM mamba_utils: groups are replicated so each TP rank has the ones its heads
    need."""
    return 0 if ngroups % tp == 0 else tp - ngroups


def state_elements(rec, tp):
    """(conv elements, SSM elements) of one layer's state on one GPU: SGLang Mamba2StateShape /
    KimiLinearStateShape, vLLM MambaStateShapeCalculator (gated_delta_net, kda, mamba2, mamba1,
    linear_attention, short_conv)."""
    d = rec.dims
    if rec.kind == "kda":
        # q, k and v each keep (heads x head_dim / TP, kernel - 1) of conv state.
        proj = d["heads"] * d["head_dim"] // tp
        return 3 * proj * (d["conv_kernel"] - 1), (d["heads"] // tp) * d["head_dim"] ** 2
    if rec.kind == "shortconv":
        # SGLang passes state_size 0 to Mamba2StateShape: no SSM state, only the conv's.
        return (d["hidden"] // tp) * (d["conv_kernel"] - 1), 0
    if rec.kind == "gdn":
        conv_dim = d["key_heads"] * d["key_dim"] * 2 + d["value_heads"] * d["value_dim"]
        return (conv_dim // tp) * (d["conv_kernel"] - 1), \
            (d["value_heads"] // tp) * d["value_dim"] * d["key_dim"]
    if rec.kind == "mamba2":
        groups = d["n_groups"] + extra_groups_for_head_shards(d["n_groups"], tp)
        conv_dim = d["intermediate"] + 2 * groups * d["state"]
        return (conv_dim // tp) * (d["conv_kernel"] - 1), \
            (d["heads"] // tp) * d["head_dim"] * d["state"]
    if rec.kind == "mamba1":
        inner = d["intermediate"] // tp
        return inner * (d["conv_kernel"] - 1), inner * d["state"]
    return 0, (d["heads"] // tp) * d["head_dim"] * d["head_dim"]


def conv_width(rec):
    d = rec.dims
    if rec.kind == "kda":
        return 3 * d["heads"] * d["head_dim"]
    if rec.kind == "shortconv":
        return d["hidden"]
    if rec.kind == "gdn":
        return d["key_heads"] * d["key_dim"] * 2 + d["value_heads"] * d["value_dim"]
    if rec.kind == "mamba2":
        return d["intermediate"] + 2 * d["n_groups"] * d["state"]
    return d.get("intermediate", 0)


def recurrent_states(inp, dtypes):
    """Per kind: layers and the bytes of its state per request on one GPU."""
    model, tp = inp.model, inp.attn_tp
    out = {}
    for kind, rec in model.recurrent.items():
        conv, ssm = state_elements(rec, tp)
        # vLLM kda_state_dtype keeps the KDA recurrent state in float32 whatever the flags say.
        ssm_dtype = "float32" if kind == "kda" and inp.engine == "vllm" else dtypes.ssm
        conv_bytes = int(conv * DTYPE_BYTES[dtypes.conv])
        ssm_bytes = int(ssm * DTYPE_BYTES[ssm_dtype])
        layers = model.count(kind)
        out[kind] = {"layers": layers, "conv_elements_per_layer": conv,
                     "ssm_elements_per_layer": ssm, "conv_dtype": dtypes.conv,
                     "ssm_dtype": ssm_dtype, "conv_bytes_per_layer": conv_bytes,
                     "ssm_bytes_per_layer": ssm_bytes,
                     "bytes_per_layer": conv_bytes + ssm_bytes,
                     "conv_bytes": conv_bytes * layers, "ssm_bytes": ssm_bytes * layers,
                     "bytes_per_request": (conv_bytes + ssm_bytes) * layers}
    return out


def state_summary(model, states):
    """The fixed `state` result key: totals over the recurrent kinds (per request, per GPU)."""
    if not states:
        return {"layers": 0, "conv_bytes": 0, "ssm_bytes": 0, "bytes_per_request": 0}
    first_kind = next(iter(states))
    first = states[first_kind]
    summary = {"layers": sum(s["layers"] for s in states.values())}
    if len(states) == 1:
        summary.update({"conv_dim": conv_width(model.recurrent[first_kind]),
                        "conv_elements_per_layer": first["conv_elements_per_layer"],
                        "ssm_elements_per_layer": first["ssm_elements_per_layer"]})
    summary.update({"conv_dtype": first["conv_dtype"], "ssm_dtype": first["ssm_dtype"],
                    "conv_bytes": sum(s["conv_bytes"] for s in states.values()),
                    "ssm_bytes": sum(s["ssm_bytes"] for s in states.values()),
                    "bytes_per_request": sum(s["bytes_per_request"] for s in states.values())})
    return summary


# SGLang's pool ----------------------------------------------------------------------------


def sglang_state_split(rest_gib, state_bytes, ratio):
    """SGLang ModelRunner.handle_max_mamba_cache: state gets r/(1+r) of the pool, in whole
    slots; the same float arithmetic (GiB floats, floor division) as the engine."""
    mamba_state_memory_raw = rest_gib * ratio / (1 + ratio)
    slots = int((mamba_state_memory_raw * GIB) // state_bytes)
    return slots, rest_gib - slots * state_bytes / GIB


def sglang_tokens(rest_gib, cell_size, page_size):
    """SGLang profile_max_num_token: int(rest_memory * (1 << 30)) // cell_size, then page-aligned
    in init_memory_pool."""
    tokens = int(rest_gib * GIB) // int(cell_size)
    return tokens // page_size * page_size


def sglang_swa_split(tokens_all_layers, num_layers, full_layers, swa_layers, page_size):
    """SGLang set_num_tokens_hybrid_swa: the pool profiled over all layers is re-divided so
    sliding layers get swa_full_tokens_ratio x the full layers' tokens."""
    total = tokens_all_layers * num_layers
    ratio = SGLANG_SWA_FULL_TOKENS_RATIO
    full = int(total / (ratio * swa_layers + full_layers))
    swa = int(full * ratio)
    return full // page_size * page_size, swa // page_size * page_size


def sglang_max_running(tokens, context_len):
    """SGLang init_memory: max_running_requests default when not given."""
    return min(max(int(tokens / context_len * 512), 2048), 4096)


@dataclass
class Capacity:
    max_tokens: int
    all_to_kv_tokens: int
    detail: dict
    concurrent: dict  # context -> requests per DP rank


def sglang_capacity(inp, dtype, state_bytes):
    model, page, pool_gib = inp.model, inp.page_size, inp.memory.pool_gib
    row = row_bytes(inp, dtype)
    full = model.count("full")
    windowed = model.count("sliding") + model.count("chunked")
    layers = per_token_layers(inp)
    detail = {}
    if state_bytes:
        slots, rest_gib = sglang_state_split(pool_gib, state_bytes, inp.mamba_ratio)
        tokens = sglang_tokens(rest_gib, row.profiled * layers, page)
        detail = {"state_slots": slots, "state_pool_bytes": slots * state_bytes,
                  "kv_pool_bytes": int(rest_gib * GIB)}
    elif windowed and sglang_swa_pool(inp) and full:
        all_layers = sglang_tokens(pool_gib, row.profiled * (full + windowed), page)
        tokens, swa_tokens = sglang_swa_split(all_layers, full + windowed, full, windowed, page)
        detail = {"swa_tokens": swa_tokens, "swa_full_tokens_ratio": SGLANG_SWA_FULL_TOKENS_RATIO}
    elif windowed and sglang_swa_pool(inp):
        tokens = sglang_tokens(pool_gib, row.profiled * windowed, page)
        detail = {"swa_tokens": tokens}
    elif model.is_dsa:
        tokens, detail = dsa_pool(inp, row, layers)
    else:
        tokens = sglang_tokens(pool_gib, row.profiled * layers, page)
    context_len = model.max_position_embeddings or max(inp.contexts)
    running = sglang_max_running(tokens, context_len)
    if state_bytes:
        running = min(running, detail["state_slots"] // SGLANG_STATE_SLOTS_PER_REQUEST)
    detail["max_running_requests"] = running
    if model.is_dsa:  # no recurrent state: all memory already goes to KV, read as given
        return Capacity(tokens, tokens, detail, concurrency(tokens, inp.contexts))
    return Capacity(tokens, all_to_kv(inp, dtype, row, layers), detail,
                    concurrency(tokens, inp.contexts))


def sglang_pool_tensor_bytes(tokens, bytes_per_token, page_size):
    """What SGLang's pool tensors take, and its log prints as 'KV size': tokens + one padding
    page of rows (MLATokenToKVPool / NSATokenToKVPool buffers of size + page_size; the indexer
    keys in (size + page_size + 1) // page_size pages)."""
    return int((tokens + page_size) * bytes_per_token)


def sglang_tokens_within(pool_bytes, bytes_per_token, page_size):
    """The most page-aligned tokens whose tensors, padding page included, fit pool_bytes."""
    pages = int(Fraction(pool_bytes) / bytes_per_token) // page_size - 1
    return max(0, pages * page_size)


def sglang_available_gib_for(tokens, profiled_bytes_per_token):
    """The least memory available for the pool (GiB, to 4 decimals, rounded up) from which
    SGLang's profile allocates `tokens`: int(rest x 2^30) // cell size >= tokens."""
    return math.ceil(tokens * profiled_bytes_per_token / GIB * 10000) / 10000


def dsa_pool(inp, row, layers):
    """DeepSeek-V3.2 in SGLang: the profile divides the memory available for the pool by the
    plain 576-byte MLA row + the indexer key (get_cell_size_per_token: 708 bytes a layer), while
    NSATokenToKVPool stores the FP8 row with its scales (calculate_mla_kv_cache_dim: 656 + 132 =
    788) in size + page_size rows. A pool's GiB read both ways: as the KV size SGLang's log
    prints (the tensors: the tokens whose rows, padding page included, fit it; PR #11309's log:
    #tokens 975424, KV size 43.67 GB), and as the memory available for the pool (what SGLang's
    profile allocates from it, its tensors then past it). (max tokens, detail): the max tokens
    of the reading memory.pool_is names, with the memory SGLang sizes them from and the KV size
    their tensors take."""
    page, pool = inp.page_size, inp.memory.pool_bytes
    allocated, profiled = row.allocated * layers, row.profiled * layers
    kv_size = sglang_tokens_within(pool, allocated, page)
    available = sglang_tokens(inp.memory.pool_gib, profiled, page)
    tokens = kv_size if inp.memory.pool_is == POOL_IS_KV_SIZE else available
    return tokens, {"pool_is": inp.memory.pool_is,
                    "profiled_bytes_per_token": json_number(profiled),
                    "max_tokens_from_kv_size": kv_size,
                    "max_tokens_from_available": available,
                    "available_gib_for_max_tokens": sglang_available_gib_for(tokens, profiled),
                    "kv_size_bytes": sglang_pool_tensor_bytes(tokens, allocated, page)}


def all_to_kv(inp, dtype, row, layers):
    bpt = row.allocated * layers
    if not bpt:
        return 0
    page = inp.page_size
    return int(Fraction(inp.memory.pool_bytes) / bpt) // page * page


# vLLM's block pool --------------------------------------------------------------------------


@dataclass
class VllmSpec:
    """One KV-cache spec of vLLM (kv_cache_interface): the layers that share it."""
    kind: str  # "full", "sliding", "chunked" or "mamba"
    name: str
    token_bytes: Fraction  # per token and layer; for mamba, the state of one layer
    count: int
    window: int = None
    block: int = 16
    page: Fraction = None


def vllm_specs(inp, dtype, states):
    model = inp.model
    row = row_bytes(inp, dtype)
    full = model.count("full") + (model.mtp_layers if inp.mtp else 0)
    specs = []
    if full:
        specs.append(VllmSpec("full", "mla" if model.attention.style == "mla" else "full",
                              row.main, full))
        if model.is_dsa:
            specs.append(VllmSpec("full", "dsa_indexer", row.indexer, full))
    if model.count("sliding"):
        specs.append(VllmSpec("sliding", "sliding", row.main, model.count("sliding"),
                              model.sliding_window))
    if model.count("chunked"):
        specs.append(VllmSpec("chunked", "chunked", row.main, model.count("chunked"),
                              model.chunk_size))
    for kind, state in states.items():
        specs.append(VllmSpec("mamba", kind, Fraction(state["bytes_per_layer"]), state["layers"]))
    return specs


def vllm_blocks_per_request(spec, context):
    """Blocks one request holds at `context` tokens: the specs' max_memory_usage_bytes."""
    if spec.kind == "full":
        return cdiv(context, spec.block)
    if spec.kind == "sliding":
        tokens = min(spec.window - 1 + VLLM_MAX_NUM_BATCHED_TOKENS, context)
        return cdiv(tokens, spec.block) + 1
    if spec.kind == "chunked":
        return cdiv(min(spec.window + VLLM_MAX_NUM_BATCHED_TOKENS, context), spec.block)
    return 1


def vllm_align_mamba(specs, block, detail):
    """HybridAttentionMambaModelConfig: attention block size raised to a multiple of 16 whose
    page holds one mamba state; the mamba page padded to the attention page."""
    attn = [s for s in specs if s.kind != "mamba"]
    mamba = [s for s in specs if s.kind == "mamba"]
    if not (attn and mamba):
        return block
    one_token = attn[0].token_bytes
    needed = 16 * math.ceil(max(s.token_bytes for s in mamba) / (16 * one_token))
    if needed > block:
        detail["attention_block_size_raised_to"] = needed
        block = needed
    for s in mamba:
        detail.setdefault("mamba_page_padding", {})[s.name] = json_number(
            block * one_token - s.token_bytes)
        s.page = block * one_token
        s.block = block
    return block


def vllm_groups(specs):
    """_get_kv_cache_groups_uniform_page_size: group_size = the fewest layers of one spec (or
    the most, when they differ by under 1.5x), each spec split into ceil(n / group_size)."""
    counts = [s.count for s in specs]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    return group_size, [cdiv(s.count, group_size) for s in specs]


def vllm_capacity(inp, dtype, states):
    specs = vllm_specs(inp, dtype, states)
    detail = {}
    block = vllm_align_mamba(specs, inp.page_size, detail)
    for s in specs:
        if s.kind != "mamba":
            s.block, s.page = block, block * s.token_bytes
    pool = Fraction(inp.memory.pool_bytes)
    if len({(s.kind, s.token_bytes, s.window) for s in specs}) == 1:
        # One spec for every layer: get_num_blocks(available // page // num_layers).
        layers = sum(s.count for s in specs)
        num_blocks = int(pool // specs[0].page) // layers
        groups, tokens = [1], num_blocks * block
        per_request = {c: vllm_blocks_per_request(specs[0], c) for c in inp.contexts}
        detail["kv_cache_groups"] = [{"spec": specs[0].name, "layers": layers}]
    elif all(s.kind == "full" for s in specs):
        # UniformTypeKVCacheSpecs: one group, page = the sum of every layer's page.
        num_blocks = int(pool // sum(s.page * s.count for s in specs))
        groups, tokens = [1], num_blocks * block
        per_request = {c: cdiv(c, block) for c in inp.contexts}
        detail["kv_cache_groups"] = [{"spec": "+".join(s.name for s in specs),
                                      "layers": specs[0].count}]
    else:
        page = max(s.page for s in specs)
        for s in specs:
            if page % s.page:
                raise InputError(f"vLLM cannot unify the page sizes of this model ({s.name}: "
                                 f"{fmt_num(s.page)} bytes vs {fmt_num(page)})", "engine", "vllm")
            s.block = int(s.block * (page / s.page))
            s.page = page
        group_size, groups = vllm_groups(specs)
        num_blocks = int(pool // page) // group_size
        tokens = num_blocks // sum(groups) * min(s.block for s in specs)
        per_request = {c: sum(g * vllm_blocks_per_request(s, c) for s, g in zip(specs, groups))
                       for c in inp.contexts}
        detail["kv_cache_groups"] = [{"spec": s.name, "groups": g, "layers_per_group": group_size,
                                      "layers": s.count} for s, g in zip(specs, groups)]
    detail.update({"block_size": block, "num_blocks": num_blocks,
                   "blocks_per_request": {str(c): n for c, n in per_request.items()}})
    row = row_bytes(inp, dtype)
    concurrent = {str(c): round(num_blocks / n, 2) for c, n in per_request.items()}
    return Capacity(tokens, all_to_kv(inp, dtype, row, per_token_layers(inp)), detail, concurrent)


def vllm_tokens(pool_bytes, per_layer_bytes, layers, block_size):
    """vLLM kv_cache_utils get_num_blocks: available // page_size // num_layers blocks of
    block_size tokens (page_size = block_size x bytes per token of one layer)."""
    page = Fraction(per_layer_bytes) * block_size
    blocks = int(Fraction(pool_bytes) / page) // layers
    return blocks * block_size


# Putting one dtype together ----------------------------------------------------------------


def concurrency(tokens, contexts):
    return {str(c): round(tokens / c, 2) for c in contexts}


def json_number(x):
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def capacity(inp, dtype, state_bytes, states):
    if inp.engine == "sglang":
        return sglang_capacity(inp, dtype, state_bytes)
    return vllm_capacity(inp, dtype, states)


def draft_detail(inp, dtype, tokens):
    """MTP/NextN draft layers with speculative decoding on: each a full-attention layer."""
    model = inp.model
    if not (inp.mtp and model.mtp_layers):
        return None
    row = row_bytes(inp, dtype)
    draft = {"layers": model.mtp_layers,
             "bytes_per_token": json_number(row.allocated * model.mtp_layers)}
    if inp.engine == "sglang" and tokens is not None:
        # The draft worker's own pool: num_nextn_predict_layers layers x the target's tokens
        # (draft_runner_cache_size), allocated after the target's pool.
        draft["pool_bytes"] = int(tokens * row.allocated * model.mtp_layers)
    return draft


def kv_entry(inp, dtype, state_bytes, states):
    """One dtype's column of the result: bytes per token and what fits in the pool."""
    model, tp = inp.model, inp.attn_tp
    row = row_bytes(inp, dtype)
    layers = per_token_layers(inp)
    bpt = row.allocated * layers
    entry = {"dtype": dtype, "bytes_per_element": json_number(DTYPE_BYTES[dtype]),
             "bytes_per_token": json_number(bpt),
             "per_layer_bytes_per_token": json_number(row.allocated),
             "max_tokens": None, "concurrent_requests": None}
    if model.attention.style == "mha" and tp > 1 and model.count("full"):
        entry["naive_bytes_per_token"] = json_number(naive_bytes_per_token(model, dtype))
    for kind, window in (("sliding", model.sliding_window), ("chunked", model.chunk_size)):
        if model.count(kind):
            prefix = "sliding_window" if kind == "sliding" else "chunked"
            per_token = row.main * model.count(kind)
            entry[f"{prefix}_bytes_per_token"] = json_number(per_token)
            entry[f"{prefix}_bytes_per_request"] = json_number(per_token * window)
    pool_bytes = inp.memory.pool_bytes
    if pool_bytes is None or not bpt:
        return entry
    cap = capacity(inp, dtype, state_bytes, states)
    entry["max_tokens"] = cap.max_tokens
    entry["concurrent_requests"] = cap.concurrent
    entry["all_to_kv_tokens"] = cap.all_to_kv_tokens
    entry["all_to_kv_concurrent_requests"] = concurrency(cap.all_to_kv_tokens, inp.contexts)
    if inp.dp > 1:
        entry["deployment_concurrent_requests"] = {
            c: round(n * inp.dp, 2) for c, n in cap.concurrent.items()}
    if "naive_bytes_per_token" in entry:
        entry["naive_max_tokens"] = int(pool_bytes // Fraction(entry["naive_bytes_per_token"]))
    if cap.detail:
        entry["engine_split"] = cap.detail
    draft = draft_detail(inp, dtype, cap.max_tokens)
    if draft:
        entry["mtp_draft"] = draft
    return entry


# ---------------------------------------------------------------------------------------
# Calibration against an engine's own log


SGLANG_KV_LINE = re.compile(
    r"KV Cache is allocated\.\s*#tokens:\s*([\d,]+),\s*K size:\s*([\d.]+)\s*GB,"
    r"\s*V size:\s*([\d.]+)\s*GB")
# Newer SGLang prints the pool's total (with the DSA indexer) as one figure.
SGLANG_KV_TOTAL_LINE = re.compile(
    r"KV Cache is allocated\.\s*#tokens:\s*([\d,]+),\s*KV size:\s*([\d.]+)\s*GB")
SGLANG_MAMBA_LINE = re.compile(r"max_mamba_cache_size:\s*([\d,]+)")
VLLM_TOKENS_LINE = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
VLLM_MEMORY_LINE = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")


def read_calibration_text(value):
    """calibrate_log is the log text itself, or the path of a log file on the host."""
    if "\n" not in value and len(value) < 4096:
        path = Path(value).expanduser()
        try:
            if path.is_file():
                return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            pass
    return value


def _count(match):
    return int(match.group(1).replace(",", ""))


def parse_calibration(text, page_size):
    """What the engine said it allocated: tokens and bytes per token. None if no line matched.
    SGLang prints GB meaning GiB, and its pool holds #tokens + page_size slots (the padding
    slot); vLLM prints the memory in GiB and the tokens separately."""
    m = SGLANG_KV_LINE.search(text)
    total = SGLANG_KV_TOTAL_LINE.search(text)
    if m or total:
        tokens = _count(m or total)
        slots = tokens + page_size
        if m:
            k_gib, v_gib = float(m.group(2)), float(m.group(3))
            observed = {"engine": "sglang", "tokens": tokens, "k_gib": k_gib, "v_gib": v_gib}
            kv_gib = k_gib + v_gib
        else:
            kv_gib = float(total.group(2))
            observed = {"engine": "sglang", "tokens": tokens, "kv_gib": kv_gib}
        observed.update({"pool_slots": slots, "kv_bytes": int(kv_gib * GIB),
                         "bytes_per_token": kv_gib * GIB / slots})
        mamba = SGLANG_MAMBA_LINE.search(text)
        if mamba:
            observed["state_slots"] = _count(mamba)
        return observed
    tokens = VLLM_TOKENS_LINE.search(text)
    memory = VLLM_MEMORY_LINE.search(text)
    if not (tokens or memory):
        return None
    observed = {"engine": "vllm"}
    if tokens:
        observed["tokens"] = _count(tokens)
    if memory:
        observed["kv_gib"] = float(memory.group(1))
        observed["kv_bytes"] = int(observed["kv_gib"] * GIB)
    if tokens and memory:
        observed["bytes_per_token"] = observed["kv_gib"] * GIB / observed["tokens"]
    return observed


def calibrate(observed, kv_results):
    """Set the observed figures beside the modelled ones of the closest requested dtype."""
    result = dict(observed)
    bpt = observed.get("bytes_per_token")
    if not bpt:
        return result
    name, entry = min(kv_results.items(),
                      key=lambda kv: abs(math.log(bpt / float(kv[1]["bytes_per_token"]))))
    modelled = float(entry["bytes_per_token"])
    result.update({"closest_dtype": name, "modelled_bytes_per_token": entry["bytes_per_token"],
                   "bytes_per_token_ratio": round(bpt / modelled, 4)})
    if entry.get("max_tokens") and observed.get("tokens"):
        result["modelled_max_tokens"] = entry["max_tokens"]
        result["tokens_ratio"] = round(observed["tokens"] / entry["max_tokens"], 4)
    split = entry.get("engine_split") or {}
    if "max_tokens_from_kv_size" in split and observed.get("kv_bytes") and observed.get("tokens"):
        # The log's KV size is the pool's tensors: how many tokens they hold, and the memory
        # available for the pool that SGLang's profile sized them from.
        page = observed["pool_slots"] - observed["tokens"]
        per_token = Fraction(entry["bytes_per_token"])
        result["tokens_within_logged_kv_size"] = sglang_tokens_within(observed["kv_bytes"],
                                                                      per_token, page)
        result["implied_available_gib"] = round(
            observed["tokens"] * split["profiled_bytes_per_token"] / GIB, 4)
    slots = entry.get("engine_split", {}).get("state_slots")
    if slots is not None and "state_slots" in observed:
        result["modelled_state_slots"] = slots
    return result


# ---------------------------------------------------------------------------------------
# The explanations: warnings and assumptions, written from the numbers above


def explain_auto(inp, notes):
    if "auto" not in inp.dtypes:
        return
    if inp.model.is_dsa:
        why = ("vLLM turns auto into its fp8_ds_mla row for DeepSeek-V3.2 (" +
               CITE["vl_models_config"] + " DeepseekV32ForCausalLM.verify_and_update_config)"
               if inp.engine == "vllm" else
               "SGLang picks fp8_e4m3 for DeepSeek NSA on Blackwell (compute capability >= 10) "
               "and bfloat16 otherwise (" + CITE["sg_server_args"] + ")")
    else:
        why = inp.quant_where or ("no KV quantization in the checkpoint, so the model's dtype "
                                  f"({inp.model.torch_dtype})")
    notes.assume(f"auto = {inp.dtypes['auto']}: {why}")


def explain_fp8_scales(inp, notes):
    fp8 = sorted({d for d in inp.dtypes.values() if d.startswith("fp8")})
    if not fp8 and inp.ckpt_quant != "fp8_e4m3" or inp.model.is_dsa:
        return  # DeepSeek-V3.2's FP8 row carries its own scales
    why = f"FP8 KV requested ({', '.join(fp8)})" if fp8 else "the checkpoint asks for FP8 KV"
    weights = inp.weights
    if weights is not None and weights.files:
        if has_kv_scales(weights.tensor_names):
            return
        notes.warn("fp8-kv-no-scales",
                   f"{why} but none of the {weights.files} *.safetensors files has "
                   "k_scale/v_scale tensors: the engine uses scale 1.0 and values outside the "
                   "FP8 range clip")
    else:
        notes.warn("fp8-kv-no-scales",
                   f"{why} and no checkpoint files to check for k_scale/v_scale: unless the "
                   "checkpoint carries them the engine uses scale 1.0 and values can clip")


def fp8_scales_calibrated(inp):
    weights = inp.weights
    return bool(weights is not None and weights.files and has_kv_scales(weights.tensor_names))


def explain_heads(inp, notes):
    model, tp = inp.model, inp.attn_tp
    att = model.attention
    if att.style == "mla":
        latent = att.kv_lora_rank + att.qk_rope_head_dim
        notes.assume(f"MLA: each layer caches one latent of kv_lora_rank + qk_rope_head_dim = "
                     f"{att.kv_lora_rank} + {att.qk_rope_head_dim} = {latent} values per "
                     "token, the same on every GPU (not split by TP)")
        return
    if not sum(model.count(k) for k in ATTENTION_KINDS):
        return
    kv_heads = att.num_kv_heads
    heads = kv_heads_per_gpu(kv_heads, tp)
    label = "tp" if inp.dp == 1 else "attention TP"
    notes.assume(f"KV heads per GPU = max(1, num_key_value_heads // {label}) = max(1, {kv_heads} "
                 f"// {tp}) = {heads} (vLLM and SGLang ModelConfig.get_num_kv_heads)")
    if kv_heads < tp:
        notes.warn("kv-heads-replicated",
                   f"{kv_heads} KV heads across TP {tp}: each GPU holds 1 replicated head "
                   f"({tp // kv_heads} GPUs share each head), so per-GPU KV is 1 head's worth, "
                   f"not {kv_heads}")
    elif kv_heads % tp:
        notes.warn("tp-not-divisible", f"{kv_heads} KV heads do not divide over TP {tp}; the "
                   "engines refuse this layout")


def explain_dp(inp, notes):
    if inp.dp == 1:
        return
    notes.assume(f"DP attention: attention TP = tp / dp = {inp.tp} / {inp.dp} = {inp.attn_tp}; "
                 "each of the dp ranks keeps its own KV pool and runs its own requests, so the "
                 "deployment serves dp x the per-GPU requests (SGLang get_attention_tp_size; vLLM "
                 "--data-parallel-size with expert parallel and TP tp / dp)")


def explain_dsa(inp, notes):
    att = inp.model.attention
    if not inp.model.is_dsa:
        return
    notes.assume(f"DSA (DeepSeek-V3.2): every MLA layer also caches the lightning indexer's key, "
                 f"{att.index_head_dim} FP8 values + {att.index_head_dim // DSA_QUANT_BLOCK} fp32 "
                 f"scale = {fmt_num(indexer_bytes(att))} bytes per token ({CITE['sg_mixin']} "
                 f"get_cell_size_per_token; {CITE['vl_deepseek']} Indexer/DeepseekV32IndexerCache)")
    fp8 = any(d.startswith("fp8") for d in inp.dtypes.values())
    if fp8:
        trtllm = inp.engine == "sglang" and inp.attention_backend == "trtllm"
        notes.assume(
            "DSA with FP8 KV: " + (
                "SGLang's trtllm NSA backend keeps the plain 576-byte FP8 row" if trtllm else
                f"the row is the FP8 latent + {att.kv_lora_rank // DSA_QUANT_BLOCK} fp32 scales + "
                f"the bf16 rope part = {fmt_num(dsa_row_bytes(att, 'fp8_e4m3', 'vllm', 'auto'))} "
                f"bytes, not {att.kv_lora_rank + att.qk_rope_head_dim} ({CITE['vl_iface']} "
                f"MLAAttentionSpec fp8_ds_mla; {CITE['sg_mixin']} calculate_mla_kv_cache_dim, "
                "all SGLang NSA backends but trtllm)"))
    notes.assume(f"DSA page size {DSA_PAGE_SIZE} tokens in both engines (SGLang forces "
                 "page_size 64 for DeepSeek NSA; vLLM's FlashMLA sparse backend uses 64-token "
                 "blocks)")
    if inp.engine == "sglang" and inp.dp == 1 and inp.tp > 1:
        notes.warn("dp-attention-default",
                   f"SGLang turns on DP attention with dp = tp for DeepSeek NSA "
                   f"({CITE['sg_server_args']}): each of the {inp.tp} GPUs then keeps its own "
                   f"pool and requests; pass dp={inp.tp} to size that deployment")


def explain_dsa_pool(inp, kv, notes):
    """DeepSeek-V3.2 in SGLang: which reading of the pool max_tokens follows, with the other
    beside it; pool-overshoot only where the pool is the memory available, which SGLang's
    tensors outgrow."""
    for name, entry in kv.items():
        split = entry.get("engine_split") or {}
        if "max_tokens_from_kv_size" not in split:
            continue
        notes.assume(dsa_pool_sentence(inp, name, entry, split))
        if split["pool_is"] != POOL_IS_AVAILABLE or not entry["max_tokens"] or \
                split["profiled_bytes_per_token"] == entry["bytes_per_token"]:
            continue
        extra = split["kv_size_bytes"] - inp.memory.pool_bytes
        notes.warn("pool-overshoot",
                   f"{name}: SGLang sizes DeepSeek-V3.2's pool at "
                   f"{fmt_num(split['profiled_bytes_per_token'])} bytes/token (plain MLA row + "
                   f"indexer) but its tensors hold {fmt_num(entry['bytes_per_token'])}: the "
                   f"{fmt_int(entry['max_tokens'])} tokens it allocates from the "
                   f"{inp.memory.pool_gib:.2f} GiB available for the pool take "
                   f"{split['kv_size_bytes'] / GIB:.2f} GiB with the padding page, "
                   f"{extra / GIB:.2f} GiB more, out of the headroom ({CITE['sg_mixin']} "
                   f"get_cell_size_per_token vs calculate_mla_kv_cache_dim; {CITE['sg_nsa_pool']})")


def dsa_pool_sentence(inp, name, entry, split):
    pool, page = inp.memory.pool_gib, inp.page_size
    tensors = (f"its tensors hold {fmt_num(entry['bytes_per_token'])} bytes a token in tokens + "
               f"one {page}-token padding page (MLA rows: size + page_size; indexer keys: (size "
               f"+ page_size + 1) // page_size pages; {CITE['sg_nsa_pool']})")
    profile = (f"{fmt_num(split['profiled_bytes_per_token'])} bytes a token ({CITE['sg_mixin']} "
               "get_cell_size_per_token, profile_max_num_token)")
    if split["pool_is"] == POOL_IS_KV_SIZE:
        return (f"{name}: kv_memory_gib = {pool} GiB is the pool's KV size, what SGLang's log "
                f"prints for DeepSeek-V3.2: {tensors}, so max tokens = the most {page}-aligned "
                f"tokens with {fmt_num(entry['bytes_per_token'])} x (tokens + {page}) <= the pool "
                f"= {fmt_int(entry['max_tokens'])}; SGLang's profile sizes the pool from the "
                f"memory available for it at {profile} and gets there from "
                f"{split['available_gib_for_max_tokens']} GiB; {pool} GiB available would give "
                f"{fmt_int(split['max_tokens_from_available'])} tokens (max_tokens_from_available)")
    return (f"{name}: the {pool:.2f} GiB available for the pool sized as SGLang's profile does: "
            f"int(GiB x 2^30) // {profile}, aligned down to {page} = "
            f"{fmt_int(entry['max_tokens'])} tokens; {tensors} = "
            f"{split['kv_size_bytes'] / GIB:.2f} GiB, the KV size its log prints; a KV size of "
            f"{pool:.2f} GiB holds {fmt_int(split['max_tokens_from_kv_size'])} tokens "
            "(max_tokens_from_kv_size)")


def explain_windows(inp, notes):
    model = inp.model
    for kind, size, what in (("sliding", model.sliding_window, "sliding-window"),
                             ("chunked", model.chunk_size, "chunked-attention")):
        n = model.count(kind)
        if not n:
            continue
        if per_token_layers(inp) > model.count("full") or not model.count("full"):
            notes.assume(
                f"the {n} {what} layers cache every token in {inp.engine}'s pool: SGLang keeps a "
                "separate sliding-window pool only for its hybrid-SWA architectures "
                f"({CITE['sg_model_config']} is_hybrid_swa_model; Gemma-2/3 run with "
                f"disable_hybrid_swa_memory, {CITE['sg_server_args']})"
                if inp.engine == "sglang" and model.count("full") else
                f"no full-attention layers: the {what} layers are sized as a per-token pool, as "
                "the engines allocate them")
            continue
        span = "window" if kind == "sliding" else "chunk"
        notes.assume(f"the {n} {what} layers hold at most {fmt_int(size)} tokens ({span}) per "
                     "request; they are left out of bytes/token and reported apart")


def explain_layers(inp, notes):
    model = inp.model
    explain_heads(inp, notes)
    explain_dp(inp, notes)
    if model.recurrent_layers():
        names = ", ".join(f"{model.count(k)} {KIND_NAMES[k]}" for k in model.recurrent)
        if set(model.recurrent) == {"gdn"}:
            notes.assume(f"only the {model.count('full')} full-attention layers cache K/V per "
                         f"token; the {model.count('gdn')} linear-attention layers hold a fixed "
                         "recurrent state per request")
        else:
            notes.assume(f"only the {model.count('full')} attention layers cache K/V per token; "
                         f"the recurrent layers ({names}) hold a fixed state per request")
    explain_windows(inp, notes)
    explain_dsa(inp, notes)
    mlp_only = sum(1 for mixers in model.layers if not mixers)
    if mlp_only:
        notes.assume(f"{plural(mlp_only, 'layer')} of the hybrid pattern are MLP/MoE only and "
                     "cache nothing")


def explain_memory(memory, notes):
    if memory.probe_failure is not None:
        notes.warn("memory-unknown", f"{memory.probe_failure}; pass kv_memory_gib=GIB")
        return
    if memory.gpus is None:
        return
    tp, gpus = memory.tp, memory.gpus
    if len(gpus) < tp:
        notes.warn("gpu-count-below-tp", f"TP {tp} but nvidia-smi lists "
                   f"{plural(len(gpus), 'GPU')}; sizing with the GPUs present")
    for gpu in gpus[:tp]:
        if gpu["memory_used_mib"] > 1024:
            notes.warn("gpu-memory-in-use",
                       f"GPU {gpu['index']} already has {fmt_int(gpu['memory_used_mib'])} MiB in "
                       "use: an engine started now gets that much less (not subtracted here)")
    for bad in memory.unreadable:
        notes.warn("safetensors-unreadable", f"{bad}: header unreadable, counted by file size")
    if memory.weights_bytes is None:
        notes.warn("memory-unknown", "GPU memory probed but the weights' size is unknown: pass "
                   "weights_gib=GIB (checkpoint size) or kv_memory_gib=GIB")


def explain_pool(memory, notes):
    if memory.source != "probed":
        return
    weights_gib = memory.weights_bytes / GIB
    frac, reserve, tp = memory.mem_fraction, memory.activation_reserve_gib, memory.tp
    total = fmt_int(memory.gpu_total_mib)
    if memory.exhausted:
        notes.warn("memory-exhausted", f"{total} MiB x {frac} - weights {weights_gib:.2f} GiB / TP "
                   f"{tp} - reserve {reserve} GiB leaves nothing for the KV cache")
    notes.assume(f"KV pool per GPU = GPU memory x mem_fraction - weights / TP - activation "
                 f"reserve = {total} MiB (probed) x {frac:.4g} - {weights_gib:.2f} GiB "
                 f"({memory.weights_source}) / {tp} - {reserve} GiB "
                 f"({memory.activation_reserve_source}) = {memory.pool_gib:.2f} GiB available "
                 f"for the pool (SGLang's rest memory); "
                 f"mem_fraction: {memory.mem_fraction_source}")


def explain_naive(inp, kv, notes):
    """TP-unaware calculators put every KV head on every GPU; say what that would claim."""
    model, tp = inp.model, inp.attn_tp
    heads = kv_heads_per_gpu(model.attention.num_kv_heads, tp)
    if model.attention.style != "mha" or tp == 1 or model.attention.num_kv_heads == heads \
            or not model.count("full"):
        return
    figures = []
    for name, entry in kv.items():
        text = f"{fmt_num(entry['naive_bytes_per_token'])} bytes/token at {name}"
        if entry.get("naive_max_tokens") is not None:
            text += f" ({fmt_int(entry['naive_max_tokens'])} tokens with all memory to KV)"
        figures.append(text)
    notes.assume(f"counting all {model.attention.num_kv_heads} KV heads on every GPU would give "
                 f"{', '.join(figures)}: wrong under TP {tp}, where each GPU caches "
                 f"{plural(heads, 'head')} (naive_* in the result)")


STATE_FORMULAS = {
    "gdn": "conv ((2 x key heads x key dim + value heads x value dim) // TP) x (kernel - 1) + "
           "SSM value heads/TP x value dim x key dim",
    "kda": "conv 3 x (heads x head dim // TP) x (kernel - 1) for q, k, v + SSM heads/TP x "
           "head dim x head dim",
    "shortconv": "conv (hidden // TP) x (conv_L_cache - 1), no SSM state",
    "mamba2": "conv ((intermediate + 2 x groups x state) // TP) x (kernel - 1) + SSM heads/TP x "
              "head dim x state",
    "mamba1": "conv (intermediate // TP) x (kernel - 1) + SSM (intermediate // TP) x state",
    "lightning": "heads/TP x head dim x head dim",
}


def explain_state(inp, states, dtypes, notes):
    if not states:
        return
    for kind, state in states.items():
        if kind == "gdn" and len(states) == 1:
            d = inp.model.recurrent["gdn"].dims
            notes.assume(f"recurrent state per request and GPU = {state['layers']} linear layers "
                         f"x (conv ({conv_width(inp.model.recurrent['gdn'])} // TP) x (kernel - "
                         f"1) {state['conv_dtype']} + SSM heads/TP x {d['value_dim']} x "
                         f"{d['key_dim']} {state['ssm_dtype']}) = "
                         f"{fmt_int(state['bytes_per_request'])} bytes")
            continue
        notes.assume(f"{KIND_NAMES[kind]} state per request and GPU = {state['layers']} layers x "
                     f"({STATE_FORMULAS[kind]}) = {state['layers']} x "
                     f"{fmt_int(state['bytes_per_layer'])} = "
                     f"{fmt_int(state['bytes_per_request'])} bytes")
    engine_rule = (f"{CITE['sg_mamba']} Mamba2StateShape.create / mamba2_state_dtype"
                   if inp.engine == "sglang" else
                   f"{CITE['vl_mamba']} MambaStateShapeCalculator / MambaStateDtypeCalculator")
    notes.assume(f"state shapes and dtypes follow {engine_rule}; attention TP {inp.attn_tp}; "
                 f"conv {dtypes.conv}, SSM {dtypes.ssm} ({dtypes.how})")
    if "kda" in states:
        notes.assume("KDA state: " + (
            f"{CITE['sg_kimi']} (q, k, v conv states + one (heads, head dim, head dim) "
            "recurrent state, in mamba2_state_dtype)" if inp.engine == "sglang" else
            f"{CITE['vl_kda']} (q, k, v conv states in the model dtype, the recurrent state "
            "always float32)"))
    if "shortconv" in states:
        notes.assume("short-convolution state: " + (
            CITE["sg_lfm2"] + " (Mamba2StateShape with state_size 0: conv state only, bf16)"
            if inp.engine == "sglang" else CITE["vl_shortconv"] + " (the model dtype)"))
    if inp.engine == "vllm" and inp.ssm_dtype == "auto" and inp.model.config_ssm_dtype and \
            inp.model.config_ssm_dtype != dtypes.ssm:
        notes.warn("ssm-dtype-default", f"config.json asks for mamba_ssm_dtype "
                   f"{inp.model.config_ssm_dtype} but vLLM's --mamba-ssm-cache-dtype auto keeps "
                   f"{dtypes.ssm}; pass ssm_dtype={inp.model.config_ssm_dtype} to size the "
                   "engine started with that flag")


def explain_engine(inp, state_bytes, notes):
    model, memory, page = inp.model, inp.memory, inp.page_size
    if memory.pool_gib is None:
        return
    if inp.engine == "sglang" and model.is_dsa:
        pass  # explain_dsa_pool says which reading of the pool max tokens follow
    elif inp.engine == "sglang":
        notes.assume("max tokens follow SGLang: int(pool_GiB x 2^30) // bytes_per_token, "
                     f"aligned down to page_size {page} ({CITE['sg_mixin']} "
                     "profile_max_num_token, init_memory)")
        if state_bytes:
            ratio = inp.mamba_ratio
            notes.assume(f"SGLang splits the pool: state slots get mamba_full_memory_ratio / "
                         f"(1 + ratio) = {ratio}/{1 + ratio} of it (handle_max_mamba_cache), KV "
                         "the rest; 'all memory to KV' is the figure without state")
        windowed = model.count("sliding") + model.count("chunked")
        if windowed and model.count("full") and sglang_swa_pool(inp):
            notes.assume("SGLang hybrid SWA pool: tokens profiled over all layers, then split so "
                         f"sliding layers get swa_full_tokens_ratio {SGLANG_SWA_FULL_TOKENS_RATIO}"
                         f" x the full layers' tokens (set_num_tokens_hybrid_swa)")
    else:
        notes.assume(
            f"max tokens follow vLLM: blocks of {page} tokens (raised where a mamba state needs "
            "it, see engine_split); num_blocks = pool // page bytes // "
            "layers per group, max tokens = num_blocks // KV cache groups x block size (the "
            f"'GPU KV cache size' line); concurrent requests = num_blocks / blocks one request "
            f"holds, sliding and chunked groups keeping their window + "
            f"{fmt_int(VLLM_MAX_NUM_BATCHED_TOKENS)} batched tokens, each mamba group one block "
            f"({CITE['vl_utils']} get_kv_cache_groups, get_kv_cache_config_from_groups, "
            f"_report_kv_cache_config, get_max_concurrency_for_kv_cache_config; "
            f"{CITE['vl_iface']} max_memory_usage_bytes)")
        if model.recurrent_layers():
            notes.assume("vLLM hybrid attention + mamba: the attention block size is raised to a "
                         "multiple of 16 whose page holds one layer's state and the state page "
                         f"padded to it ({CITE['vl_models_config']} "
                         "HybridAttentionMambaModelConfig; newer vLLM aligns to the kernel block "
                         "size instead)")
    notes.assume("concurrent requests = max_tokens / context, for contexts "
                 f"{', '.join(fmt_int(c) for c in inp.contexts)}" if inp.engine == "sglang" else
                 "concurrent requests at contexts "
                 f"{', '.join(fmt_int(c) for c in inp.contexts)} per vLLM's block accounting")


def explain_mtp(inp, kv, notes):
    model = inp.model
    if not model.mtp_layers:
        return
    if not inp.mtp:
        notes.assume(f"the checkpoint carries {plural(model.mtp_layers, 'MTP/NextN draft layer')}; "
                     "not counted (pass mtp=true when serving with speculative decoding)")
        return
    if inp.engine == "vllm":
        notes.assume(f"MTP on: vLLM registers the {plural(model.mtp_layers, 'draft layer')} as "
                     "attention layers of the same KV cache config, so they share the block pool "
                     "(counted in max_tokens)")
        return
    for name, entry in kv.items():
        draft = entry.get("mtp_draft") or {}
        if "pool_bytes" in draft:
            notes.warn("draft-kv-outside-pool",
                       f"{name}: SGLang's draft worker allocates its own pool of "
                       f"{plural(model.mtp_layers, 'layer')} x {fmt_int(entry['max_tokens'])} "
                       f"tokens = {draft['pool_bytes'] / GIB:.2f} GiB after the target's pool, "
                       f"out of the headroom ({CITE['sg_mixin']} profile_max_num_token "
                       "is_draft_worker, draft_runner_cache_size)")


def explain_state_slots(inp, state_bytes, kv, notes):
    if inp.engine != "sglang" or not state_bytes or inp.memory.pool_gib is None:
        return
    for name, entry in kv.items():
        split = entry.get("engine_split")
        if not split or "state_slots" not in split:
            continue
        cap = split["max_running_requests"]
        for c, n in entry["concurrent_requests"].items():
            if n > cap:
                notes.warn("state-slots-limit",
                           f"{name}: at {fmt_int(c)}-token contexts the KV fits {n:.2f} requests "
                           f"but SGLang runs at most {cap} ({split['state_slots']} state slots "
                           f"// {SGLANG_STATE_SLOTS_PER_REQUEST})")


def explain_dtype_support(inp, notes):
    if inp.model.is_dsa:
        for name, dtype in inp.dtypes.items():
            if dtype not in ("bf16", "fp8_e4m3"):
                notes.warn("dtype-unsupported", f"{name}: DeepSeek-V3.2 runs with bf16 or "
                           "fp8_e4m3 KV only in both engines; the figures are the plain row")
    if inp.engine == "sglang" and "lightning" in inp.model.recurrent:
        raise InputError("engine sglang has no MiniMax lightning-attention model; size it with "
                         "engine=vllm (MiniMaxText01ForCausalLM)", "engine", "sglang")
    if inp.engine == "sglang" and "mamba1" in inp.model.recurrent:
        notes.warn("engine-support-unverified", "SGLang's Mamba-1 (Jamba) support was not found "
                   "in the mamba_utils.py read; the state uses vLLM's mamba1_state_shape")


def explain_calibration(calibration, engine, notes):
    if calibration["engine"] != engine:
        notes.warn("calibration-engine-mismatch",
                   f"calibrate_log is from {calibration['engine']} but engine={engine}; "
                   "comparing anyway")
    ratio = calibration.get("bytes_per_token_ratio")
    if ratio is None:
        return
    bpt, modelled = calibration["bytes_per_token"], calibration["modelled_bytes_per_token"]
    if abs(bpt / float(modelled) - 1) > 0.05:
        notes.warn("calibration-mismatch",
                   f"the log implies {bpt:,.0f} bytes/token; the closest modelled dtype "
                   f"({calibration['closest_dtype']}) has {fmt_num(modelled)}: ratio "
                   f"{bpt / float(modelled):.3f}")


# ---------------------------------------------------------------------------------------
# Putting it together: mode=size


def kinds_breakdown(inp, states, kv):
    """Per layer kind: its count, bytes per token (with its window or chunk) or, for recurrent
    kinds, the state per request split into its components. Bytes are per GPU."""
    model = inp.model
    out = []
    pooled = per_token_layers(inp)
    for kind in ATTENTION_KINDS:
        n = model.count(kind)
        if not n:
            continue
        item = {"kind": KIND_NAMES[kind], "count": n, "caches_every_token": kind == "full" or (
            pooled > model.count("full") or not model.count("full"))}
        if kind != "full":
            item["sliding_window" if kind == "sliding" else "chunk_size"] = \
                model.sliding_window if kind == "sliding" else model.chunk_size
        per_layer, total = {}, {}
        for name, dtype in inp.dtypes.items():
            row = row_bytes(inp, dtype)
            one = row.allocated if kind == "full" else row.main
            per_layer[name] = json_number(one)
            total[name] = json_number(one * n)
        item["bytes_per_token_per_layer"] = per_layer
        item["bytes_per_token"] = total
        if kind == "full" and model.is_dsa:
            item["row"] = {name: {"mla_row": json_number(row_bytes(inp, d).main),
                                  "indexer_key": json_number(row_bytes(inp, d).indexer)}
                           for name, d in inp.dtypes.items()}
        if kind != "full":
            span = model.sliding_window if kind == "sliding" else model.chunk_size
            item["bytes_per_request"] = {name: json_number(Fraction(b) * span)
                                         for name, b in total.items()}
        out.append(item)
    for kind, state in states.items():
        out.append({"kind": KIND_NAMES[kind], "count": state["layers"],
                    "state_per_request": {"conv_bytes": state["conv_bytes"],
                                          "ssm_bytes": state["ssm_bytes"],
                                          "bytes": state["bytes_per_request"]},
                    "state_per_layer": {"conv_elements": state["conv_elements_per_layer"],
                                        "ssm_elements": state["ssm_elements_per_layer"],
                                        "conv_dtype": state["conv_dtype"],
                                        "ssm_dtype": state["ssm_dtype"],
                                        "bytes": state["bytes_per_layer"]}})
    mlp_only = sum(1 for mixers in model.layers if not mixers)
    if mlp_only:
        out.append({"kind": "mlp_only", "count": mlp_only})
    if model.mtp_layers:
        out.append({"kind": "mtp_draft", "count": model.mtp_layers, "counted": inp.mtp})
    return out


def compute(params):
    """The whole calculation: returns the result document (the fixed keys plus detail)."""
    if params["mode"] == "plan":
        return plan(params)
    notes = Notes()
    inp = gather_inputs(params, notes)
    model = inp.model
    explain_dtype_support(inp, notes)
    inp.memory = resolve_memory(params, inp.source, inp.weights, inp.engine, inp.tp, inp.dp,
                                model, inp.cfg)
    if inp.memory.gpus:
        inp.gpu_name = inp.memory.gpus[0]["name"]
        inp.dtypes = {name: resolve_kv_dtype(name, model, inp.ckpt_quant, inp.engine,
                                             inp.gpu_name) for name in inp.dtypes}
    dtypes = state_dtypes(inp) if model.recurrent else None
    states = recurrent_states(inp, dtypes) if model.recurrent else {}
    state = state_summary(model, states)
    kv = {name: kv_entry(inp, dtype, state["bytes_per_request"], states)
          for name, dtype in inp.dtypes.items()}
    calibration = None
    if params["calibrate_log"]:
        text = read_calibration_text(params["calibrate_log"])
        observed = parse_calibration(text, inp.page_size)
        calibration = calibrate(observed, kv) if observed is not None else None

    explain_auto(inp, notes)
    explain_fp8_scales(inp, notes)
    explain_layers(inp, notes)
    if not per_token_layers(inp):
        notes.warn("no-per-token-layers", "no layer caches K/V per token (only recurrent "
                   "state): max tokens are not computed")
    explain_memory(inp.memory, notes)
    explain_pool(inp.memory, notes)
    explain_naive(inp, kv, notes)
    if inp.memory.source == "given":
        pool = inp.memory.pool_gib
        notes.assume(f"KV pool per GPU = kv_memory_gib = {pool} GiB = int({pool} x 2^30) = "
                     f"{fmt_int(inp.memory.pool_bytes)} bytes (given: the pool's size as the "
                     "engine reports it, recurrent state included)")
    explain_state(inp, states, dtypes, notes)
    explain_engine(inp, state["bytes_per_request"], notes)
    explain_mtp(inp, kv, notes)
    explain_dsa_pool(inp, kv, notes)
    explain_state_slots(inp, state["bytes_per_request"], kv, notes)
    if params["calibrate_log"] and calibration is None:
        notes.warn("calibration-unparsed",
                   "calibrate_log has neither SGLang's 'KV Cache is allocated. #tokens: N, "
                   "K size: X GB, V size: Y GB' nor vLLM's 'GPU KV cache size: N tokens' line")
    elif calibration is not None:
        explain_calibration(calibration, inp.engine, notes)
    return result_document(inp, state, states, kv, calibration, notes)


def result_document(inp, state, states, kv, calibration, notes):
    model, tp = inp.model, inp.attn_tp
    att = model.attention
    result = {
        "mode": "size",
        "model": {"name": model.name, "source": inp.source.kind, "preset": inp.source.preset,
                  "architectures": model.architectures, "model_type": model.model_type,
                  "family": model.family, "rule": model.rule, "attention": att.style,
                  "sparse_attention": "dsa" if model.is_dsa else None,
                  "torch_dtype": model.torch_dtype,
                  "max_position_embeddings": model.max_position_embeddings},
        "tp": inp.tp,
        "dp": inp.dp,
        "attention_tp": inp.attn_tp,
        "engine": inp.engine,
        "page_size": inp.page_size,
        "layers": {"total": len(model.layers), "full_attention": model.count("full"),
                   "sliding_window": model.count("sliding"),
                   "linear": model.recurrent_layers()},
        "kv_heads_per_gpu": 1 if att.style == "mla" else kv_heads_per_gpu(att.num_kv_heads, tp),
        "kv": kv,
        "state": state,
        "kinds": kinds_breakdown(inp, states, kv),
        "memory": inp.memory.to_json(),
        "contexts": inp.contexts,
    }
    if att.style == "mha":
        result["kv_heads_total"] = att.num_kv_heads
        result["head_dim"] = att.head_dim
        result["v_head_dim"] = att.v_head_dim
    if model.count("chunked"):
        result["layers"]["chunked"] = model.count("chunked")
    if model.sliding_window:
        result["sliding_window"] = model.sliding_window
    if model.chunk_size:
        result["attention_chunk_size"] = model.chunk_size
    if model.mtp_layers:
        result["mtp"] = {"layers": model.mtp_layers, "counted": inp.mtp}
    if calibration is not None:
        result["calibration"] = calibration
    result["warnings"] = notes.warnings
    result["assumptions"] = notes.assumptions
    return result


# ---------------------------------------------------------------------------------------
# The report


def render_layers(result):
    layers, m = result["layers"], result["model"]
    attention = " (MLA + DSA indexer)" if m.get("sparse_attention") == "dsa" else \
        " (MLA)" if m["attention"] == "mla" else ""
    parts = [f"{layers['full_attention']} full attention{attention}"]
    for item in result["kinds"]:
        kind = item["kind"]
        if kind == "sliding_attention":
            parts.append(f"{item['count']} sliding window ({fmt_int(item['sliding_window'])} "
                         "tokens)")
        elif kind == "chunked_attention":
            parts.append(f"{item['count']} chunked ({fmt_int(item['chunk_size'])} tokens)")
        elif kind == "gated_delta_net":
            parts.append(f"{item['count']} linear attention")
        elif kind in ("mamba2", "mamba1", "lightning_attention", "kimi_delta_attention",
                      "short_conv"):
            parts.append(f"{item['count']} {kind.replace('_', ' ')}")
        elif kind == "mlp_only":
            parts.append(f"{item['count']} MLP/MoE only")
    line = f"layers: {layers['total']} = {' + '.join(parts)}"
    if result.get("mtp"):
        mtp = result["mtp"]
        line += f"; {plural(mtp['layers'], 'MTP draft layer')} " + \
            ("counted" if mtp["counted"] else "not counted")
    return line


def render_report(result):
    m, mem = result["model"], result["memory"]
    origin = f"preset {m['preset']}" if m["preset"] else m["source"]
    dp = f" - DP attention {result['dp']}" if result.get("dp", 1) > 1 else ""
    lines = [f"kv_calc: {m['name']} ({origin}) - TP {result['tp']}{dp} - engine "
             f"{result['engine']}", render_layers(result), f"layer rule: {m['rule']['how']}"]
    if m["attention"] == "mla":
        lines.append("KV per GPU: one MLA latent per token and layer (not split by TP)")
    elif result["layers"]["full_attention"] or result["layers"].get("sliding_window") or \
            result["layers"].get("chunked"):
        lines.append(f"KV heads per GPU: {result['kv_heads_per_gpu']} (of "
                     f"{result['kv_heads_total']}, TP {result['attention_tp']})")
    if mem["pool_gib"] is not None:
        lines.append(f"KV pool per GPU: {mem['pool_gib']:.2f} GiB = {fmt_int(mem['pool_bytes'])} "
                     f"bytes ({mem['source']}: {POOL_IS_WORDS[mem['pool_is']]})")
    else:
        lines.append("KV pool per GPU: unknown (pass kv_memory_gib)")
    lines.append("")
    lines.extend(render_table(result, "max_tokens", "concurrent_requests"))
    if result["engine"] == "sglang" and result["state"]["bytes_per_request"] \
            and mem["pool_gib"] is not None:
        lines.append("")
        lines.append("all memory to KV (no recurrent-state slots):")
        lines.extend(render_table(result, "all_to_kv_tokens", "all_to_kv_concurrent_requests"))
    if any("deployment_concurrent_requests" in e for e in result["kv"].values()):
        lines.append("")
        lines.append(f"whole deployment ({result['dp']} DP ranks, each with its own pool):")
        lines.extend(render_table(result, "max_tokens", "deployment_concurrent_requests"))
    lines.extend(render_state(result))
    lines.extend(render_windows(result))
    lines.extend(render_engine(result))
    lines.extend(render_calibration(result))
    lines.append("")
    lines.extend(f"warning [{w['code']}]: {w['message']}" for w in result["warnings"])
    lines.extend(f"assumption: {a}" for a in result["assumptions"])
    return "\n".join(lines) + "\n"


def render_table(result, tokens_key, requests_key):
    contexts = result["contexts"]
    header = ["dtype", "bytes/token", "max tokens"] + [f"req@{fmt_int(c)}" for c in contexts]
    rows = []
    for name, entry in result["kv"].items():
        label = name if name == entry["dtype"] else f"{name} ({entry['dtype']})"
        tokens = entry.get(tokens_key)
        requests = entry.get(requests_key) or {}
        rows.append([label, fmt_num(entry["bytes_per_token"]),
                     "-" if tokens is None else fmt_int(tokens)]
                    + [f"{requests[str(c)]:,.2f}" if str(c) in requests else "-"
                       for c in contexts])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    out = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
    return out


def render_state(result):
    state = result["state"]
    if not state["bytes_per_request"]:
        return []
    kinds = [k for k in result["kinds"] if "state_per_request" in k]
    names = ", ".join(f"{k['count']} {k['kind'].replace('_', ' ')}" for k in kinds)
    lines = ["", f"recurrent state: {fmt_int(state['bytes_per_request'])} bytes/request per GPU "
             f"= conv {fmt_int(state['conv_bytes'])} ({state['conv_dtype']}) + SSM "
             f"{fmt_int(state['ssm_bytes'])} ({state['ssm_dtype']}), "
             + (f"{state['layers']} linear layers" if [k["kind"] for k in kinds] ==
                ["gated_delta_net"] else f"layers: {names}")]
    # The state split does not depend on the KV dtype: print it once.
    splits = [e["engine_split"] for e in result["kv"].values()
              if "state_slots" in (e.get("engine_split") or {})]
    if splits:
        split = splits[0]
        lines.append(f"state pool (SGLang split): {fmt_int(split['state_slots'])} slots = "
                     f"{fmt_int(split['state_pool_bytes'])} bytes; KV gets "
                     f"{fmt_int(split['kv_pool_bytes'])} bytes; at most "
                     f"{fmt_int(split['max_running_requests'])} running requests")
    return lines


def render_windows(result):
    lines = []
    for key, what in (("sliding_window", "sliding-window"), ("chunked", "chunked")):
        for name, entry in result["kv"].items():
            if f"{key}_bytes_per_token" not in entry:
                continue
            text = (f"{what} layers ({name}): {fmt_num(entry[f'{key}_bytes_per_token'])} "
                    f"bytes/token, at most {fmt_num(entry[f'{key}_bytes_per_request'])} "
                    "bytes/request")
            swa = (entry.get("engine_split") or {}).get("swa_tokens")
            if swa is not None:
                text += f"; SGLang SWA pool {fmt_int(swa)} tokens"
            lines.append(text)
    return [""] + lines if lines else []


def render_engine(result):
    lines = []
    for name, entry in result["kv"].items():
        split = entry.get("engine_split") or {}
        if "num_blocks" in split:
            groups = ", ".join(
                f"{g['spec']} x{g.get('groups', 1)}" for g in split["kv_cache_groups"])
            lines.append(f"vLLM ({name}): {fmt_int(split['num_blocks'])} blocks of "
                         f"{split['block_size']} tokens; KV cache groups: {groups}")
        if "max_tokens_from_kv_size" in split:
            lines.append(render_dsa_pool(result, name, entry, split))
        draft = entry.get("mtp_draft")
        if draft:
            text = f"MTP draft ({name}): {plural(draft['layers'], 'layer')}, " \
                   f"{fmt_num(draft['bytes_per_token'])} bytes/token"
            if "pool_bytes" in draft:
                text += f"; SGLang draft pool {draft['pool_bytes'] / GIB:.2f} GiB"
            lines.append(text)
    return [""] + lines if lines else []


def render_dsa_pool(result, name, entry, split):
    pool, page = result["memory"]["pool_gib"], result["page_size"]
    profiled, stored = fmt_num(split["profiled_bytes_per_token"]), fmt_num(entry["bytes_per_token"])
    if split["pool_is"] == POOL_IS_KV_SIZE:
        return (f"SGLang ({name}): {pool:.2f} GiB read as its log's KV size: "
                f"{fmt_int(entry['max_tokens'])} tokens + a {page}-token padding page x {stored} "
                f"bytes; its profile ({profiled} bytes/token) gets there from "
                f"{split['available_gib_for_max_tokens']} GiB available; {pool:.2f} GiB "
                f"available would give {fmt_int(split['max_tokens_from_available'])} tokens")
    return (f"SGLang ({name}): {pool:.2f} GiB available, sized at {profiled} bytes/token: "
            f"{fmt_int(entry['max_tokens'])} tokens, whose tensors ({stored} bytes/token, with "
            f"a {page}-token padding page) take {split['kv_size_bytes'] / GIB:.2f} GiB, its log's "
            f"KV size; a KV size of {pool:.2f} GiB holds "
            f"{fmt_int(split['max_tokens_from_kv_size'])} tokens")


def render_calibration(result):
    cal = result.get("calibration")
    if not cal:
        return []
    text = f"calibration ({cal['engine']}): "
    if cal.get("tokens") is not None:
        text += f"{fmt_int(cal['tokens'])} tokens"
    if cal.get("bytes_per_token"):
        text += (f", {cal['bytes_per_token']:,.1f} bytes/token observed vs "
                 f"{fmt_num(cal['modelled_bytes_per_token'])} modelled ({cal['closest_dtype']}): "
                 f"ratio {cal['bytes_per_token_ratio']:.4f}")
    if cal.get("tokens_ratio") is not None:
        text += (f"; modelled max tokens {fmt_int(cal['modelled_max_tokens'])} "
                 f"(observed/modelled {cal['tokens_ratio']:.4f})")
    if cal.get("tokens_within_logged_kv_size") is not None:
        text += (f"; the log's KV size holds {fmt_int(cal['tokens_within_logged_kv_size'])} "
                 f"tokens, sized from {cal['implied_available_gib']} GiB available for the pool")
    return ["", text]


# ---------------------------------------------------------------------------------------
# mode=plan: which GPU count, parallel layout and KV dtype serve a workload


@dataclass
class Workload:
    context: int
    concurrency: int
    gpu_memory_gib: float
    gpu_source: str
    gpu_name: str = None
    counts: list = field(default_factory=list)  # GPU counts to consider
    gpu_mib: float = None  # what SGLang's memory rules read (nvidia-smi memory.total)

    @property
    def long_context(self):
        return self.context >= LONG_CONTEXT_TOKENS


def plan_gpus(params):
    """The workload's GPUs: memory each, how it was found, their name, the counts to consider."""
    probed, failure = (None, None)
    if params["gpu_memory_gib"] is None or params["gpus"] is None:
        probed, failure = probe_gpus()
    if params["gpu_memory_gib"] is not None:
        memory, how = float(params["gpu_memory_gib"]), "given"
        mib = memory * 1024
    elif probed:
        mib = min(g["memory_total_mib"] for g in probed)
        memory, how = mib / 1024, f"probed: {fmt_int(mib)} MiB ({probed[0]['name']})"
    else:
        raise InputError(f"mode=plan needs the memory per GPU: pass gpu_memory_gib=GIB ({failure})",
                         "gpu_memory_gib")
    counts = params["gpus"] or ([len(probed)] if probed else [1, 2, 4, 8])
    return Workload(0, params["concurrency"], memory, how, probed[0]["name"] if probed else None,
                    sorted(set(counts)), mib)


# Fields whose presence makes a model mixture-of-experts.
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def is_moe(cfg):
    return any(cfg.get(k) for k in MOE_FIELDS)


@dataclass
class Layout:
    """GPUs and how the engine spreads the model over them: plain TP over every GPU; DP
    attention (one model over all GPUs, attention split in dp groups, experts over all: SGLang
    --enable-dp-attention, vLLM --data-parallel-size with --enable-expert-parallel); or dp
    replicas of a TP gpus/dp model."""
    gpus: int
    dp: int
    mode: str  # "tp", "dp_attention" or "replicas"
    engine: str = "sglang"

    @property
    def attn_tp(self):
        return self.gpus // self.dp

    @property
    def instance_tp(self):
        """TP of one engine instance (SGLang --tp, vLLM --tensor-parallel-size)."""
        if self.mode == "replicas" or (self.mode == "dp_attention" and self.engine == "vllm"):
            return self.gpus // self.dp
        return self.gpus

    def describe(self):
        if self.mode == "tp":
            return f"TP {self.gpus}"
        if self.mode == "replicas":
            return f"{self.dp} replicas of TP {self.gpus // self.dp}"
        if self.engine == "vllm":
            return f"DP {self.dp} x TP {self.gpus // self.dp}, expert parallel"
        return f"TP {self.gpus}, DP attention {self.dp}"


def plan_layouts(n, engine, moe, forced_dp_attention=False):
    """The layouts an engine runs on n GPUs: DP splits a MoE model's attention (SGLang models
    that split attention by get_attention_tp_size, vLLM with expert parallelism); a dense
    model's DP runs as full replicas (SGLang models/llama.py shards by the plain TP size; vLLM
    DP of a dense model). Where SGLang turns DP attention on by itself, plain TP is not run."""
    layouts = [] if forced_dp_attention and n > 1 else [Layout(n, 1, "tp", engine)]
    for dp in range(2, n + 1):
        if n % dp == 0:
            layouts.append(Layout(n, dp, "dp_attention" if moe else "replicas", engine))
    return layouts


def layout_refusal(model, attn_tp):
    """Why an engine refuses this attention TP, or None."""
    att = model.attention
    if att.style == "mha" and att.num_kv_heads > attn_tp and att.num_kv_heads % attn_tp:
        return f"{att.num_kv_heads} KV heads do not divide over attention TP {attn_tp}"
    for rec in model.recurrent.values():
        if rec.kind == "shortconv":
            if rec.dims["hidden"] % attn_tp:
                return (f"{rec.dims['hidden']} short-convolution channels do not divide over "
                        f"attention TP {attn_tp}")
            continue
        heads = rec.dims.get("value_heads") or rec.dims.get("heads") or 0
        if heads % attn_tp:
            return f"{heads} {KIND_NAMES[rec.kind]} heads do not divide over attention TP {attn_tp}"
    return None


def layout_weights_per_gpu(size, layout):
    if layout.mode == "replicas":
        return size.bytes // layout.attn_tp
    return weights_per_gpu(size, layout.gpus, layout.dp)


@dataclass
class PlanModel:
    """What the planner read once: the model, its checkpoint, its weights and KV-scale facts."""
    source: Source
    model: Model
    cfg: dict
    weights: Weights
    size: WeightsSize
    scales: dict
    ckpt_quant: str = None


def plan_inputs(params, pm, layout, pool_gib, dtype_name, dtype, ctx):
    """The sizing of one engine instance's rank: a replica is a TP gpus/dp model of its own."""
    replicas = layout.mode == "replicas"
    tp = layout.attn_tp if replicas else layout.gpus
    return Inputs(
        source=pm.source, model=pm.model, tp=tp, dp=1 if replicas else layout.dp,
        engine=params["engine"], page_size=default_page_size(params, params["engine"], pm.model),
        ssm_dtype=params["ssm_dtype"], mamba_ratio=float(params["mamba_full_memory_ratio"]),
        contexts=[ctx], memory=Memory("given", pool_gib, POOL_IS_AVAILABLE, tp=tp),
        dtypes={dtype_name: dtype},
        attention_backend=params["attention_backend"], mtp=params["mtp"], weights=pm.weights,
        cfg=pm.cfg, ckpt_quant=pm.ckpt_quant)


def plan_candidate(inp, layout, per_gpu, frac, work):
    """One layout and KV dtype: the figures the plan lists."""
    model, ctx = inp.model, work.context
    dtypes = state_dtypes(inp) if model.recurrent else None
    states = recurrent_states(inp, dtypes) if model.recurrent else {}
    state = state_summary(model, states)
    name, dtype = next(iter(inp.dtypes.items()))
    entry = kv_entry(inp, dtype, state["bytes_per_request"], states)
    per_rank = exact_requests(inp.engine, entry, ctx)
    running = (entry.get("engine_split") or {}).get("max_running_requests")
    if inp.engine == "sglang" and running is not None:
        per_rank = min(per_rank, running)
    requests = round(per_rank * layout.dp, 2)
    return {"gpus": layout.gpus, "mode": layout.mode, "layout": layout.describe(),
            "tp": layout.instance_tp, "dp": layout.dp, "attention_tp": layout.attn_tp,
            "kv_dtype": name, "dtype": dtype, "mem_fraction": round(frac.value, 4),
            "mem_fraction_source": frac.source,
            "weights_per_gpu_gib": round(per_gpu / GIB, 2),
            "kv_pool_gib": round(inp.memory.pool_gib, 2),
            "bytes_per_token": entry["bytes_per_token"],
            "state_bytes_per_request": state["bytes_per_request"],
            "max_tokens_per_rank": entry.get("max_tokens"),
            "requests_per_rank": round(per_rank, 2),
            "whole_requests_per_rank": max(1, int(per_rank)), "concurrent_requests": requests,
            "headroom_requests": round(requests - work.concurrency, 2),
            "headroom": round(requests / work.concurrency - 1, 4)}


def exact_requests(engine, entry, ctx):
    """Requests of ctx tokens one rank holds, unrounded (kv_entry rounds them for show)."""
    if not entry.get("max_tokens"):
        return 0.0
    split = entry.get("engine_split") or {}
    if engine == "vllm":
        return split["num_blocks"] / split["blocks_per_request"][str(ctx)]
    return entry["max_tokens"] / ctx


def plan_candidates(params, pm, work):
    """Every layout x KV dtype: the rows that serve at least one request at the context, and
    the rest with why not (refused by the engine, or infeasible)."""
    engine = params["engine"]
    reserve, _ = activation_reserve(params, engine)
    vision = vision_config(pm.source)
    fits, rejected = [], []
    # SGLang turns on DP attention with dp = tp for DeepSeek NSA (server_args).
    forced = engine == "sglang" and pm.model.is_dsa
    for n in work.counts:
        for layout in plan_layouts(n, engine, is_moe(pm.cfg), forced):
            frac = engine_mem_fraction(params, engine, work.gpu_mib, layout.instance_tp,
                                       layout.dp, layout.mode == "dp_attention", vision)
            per_gpu = layout_weights_per_gpu(pm.size, layout)
            pool_gib = work.gpu_memory_gib * frac.value - per_gpu / GIB - reserve
            why = layout_refusal(pm.model, layout.attn_tp)
            kind = "refused"
            if why is None and pool_gib <= 0:
                why, kind = (f"{per_gpu / GIB:.2f} GiB of weights per GPU leave no "
                             f"KV pool ({work.gpu_memory_gib:.2f} GiB x {frac.value:.4g} - "
                             f"weights - {reserve} GiB reserve)"), "infeasible"
            for name in dict.fromkeys(params["kv_dtype"]):
                row = {"gpus": n, "mode": layout.mode, "layout": layout.describe(),
                       "dp": layout.dp, "kv_dtype": name, "kind": kind, "reason": why}
                if why:
                    rejected.append(row)
                    continue
                dtype = resolve_kv_dtype(name, pm.model, pm.ckpt_quant, engine, work.gpu_name)
                inp = plan_inputs(params, pm, layout, pool_gib, name, dtype, work.context)
                cand = plan_candidate(inp, layout, per_gpu, frac, work)
                if cand["concurrent_requests"] < 1:
                    row.update(kind="infeasible", reason=(
                        f"not one {fmt_int(work.context)}-token request fits "
                        f"({cand['concurrent_requests']:.2f})"))
                    rejected.append(row)
                else:
                    fits.append(cand)
    return fits, rejected


QUANTIZED_KV = ("fp8_e4m3", "fp8_e5m2", "nvfp4")


def kv_scale_facts(source, cfg, weights, model):
    """What the checkpoint read says of quantized KV, and only that: the quantization config's
    KV dtype (hf_quant_config.json or config.json, as size mode reads it) and whether its
    safetensors carry k_scale/v_scale; nothing is claimed of a checkpoint not read."""
    if model.is_dsa:
        return {"status": "row-scales", "declared_kv_dtype": None,
                "fact": "DeepSeek-V3.2's FP8 KV row stores its own fp32 scale per 128 values "
                        "(vLLM fp8_ds_mla, SGLang calculate_mla_kv_cache_dim): it needs no "
                        "k_scale/v_scale from the checkpoint"}
    ckpt_quant, where = checkpoint_kv_quant(source, cfg)
    read_files = weights is not None and weights.files
    scales = read_files and has_kv_scales(weights.tensor_names)
    if ckpt_quant:
        status = "declared"
        fact = f"the checkpoint declares {ckpt_quant} KV ({where})"
        if read_files:
            fact += ("; its safetensors carry k_scale/v_scale" if scales else
                     f"; none of its {plural(weights.files, '*.safetensors file')} has "
                     "k_scale/v_scale tensors")
    elif scales:
        status, fact = "calibrated", (f"the checkpoint's safetensors carry k_scale/v_scale "
                                      f"({plural(weights.files, 'file')} read)")
    elif read_files:
        status, fact = "absent", (f"none of the checkpoint's "
                                  f"{plural(weights.files, '*.safetensors file')} has "
                                  "k_scale/v_scale tensors and its quantization config declares "
                                  "no KV dtype: FP8 KV would run with scale 1.0")
    else:
        status = "unknown"
        fact = ("no checkpoint read (" + ("a preset" if source.preset else "a config only") +
                "): whether FP8 KV scales exist is not known; pass model_dir to read them")
    return {"status": status, "fact": fact, "declared_kv_dtype": ckpt_quant}


def accuracy_rule(pool, work, scales, reasons):
    """Unquantized KV at long context unless the checkpoint declares or calibrates FP8 KV."""
    quantized = [c for c in pool if c["dtype"] in QUANTIZED_KV]
    plain = [c for c in pool if c["dtype"] not in QUANTIZED_KV]
    trusted = scales["status"] in ("declared", "calibrated", "row-scales")
    if quantized and plain and work.long_context and not trusted:
        reasons.append(f"accuracy rule: {scales['fact']}; at {fmt_int(work.context)} tokens "
                       f"(long context, >= {fmt_int(LONG_CONTEXT_TOKENS)}) prefer unquantized "
                       "KV, which serves the workload")
        return plain
    if quantized and plain:
        reasons.append("quantized KV allowed: " + (scales["fact"] if trusted else
                                                   "the workload is short-context"))
    elif quantized and work.long_context and not trusted:
        reasons.append(f"only quantized KV serves the workload; {scales['fact']}")
    return pool


def pick_candidate(fits, work, scales, notes):
    """The plan's choice and its reasons, rule by rule: serve the workload; then the accuracy
    rule; then the fewest GPUs; then the most concurrent requests (plain TP on a tie)."""
    reasons = []
    pool = [c for c in fits if c["concurrent_requests"] >= work.concurrency]
    if not pool:
        notes.warn("workload-not-met", f"no candidate serves {work.concurrency} concurrent "
                   f"{fmt_int(work.context)}-token requests; picking the most requests")
        pool = list(fits)
    else:
        reasons.append(f"{len(pool)} of {len(fits)} candidates serve {work.concurrency} "
                       f"concurrent {fmt_int(work.context)}-token requests")
    pool = accuracy_rule(pool, work, scales, reasons)
    fewest = min(c["gpus"] for c in pool)
    pool = [c for c in pool if c["gpus"] == fewest]
    reasons.append(f"fewest GPUs among those: {fewest}")
    best = max(pool, key=lambda c: (c["concurrent_requests"], -c["dp"]))
    reasons.append(f"most concurrent requests among those: {best['concurrent_requests']:.2f} "
                   f"with {best['layout']}, KV {best['kv_dtype']}")
    return best, reasons


# The engines' --kv-cache-dtype spelling of each dtype when it is not what auto gives.
# SGLang's choices (server_args.py): auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1.
KV_DTYPE_FLAGS = {"sglang": {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3",
                             "fp8_e5m2": "fp8_e5m2", "nvfp4": "fp4_e2m1"},
                  "vllm": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
                           "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "nvfp4": "nvfp4"}}


def fraction_flag(value):
    return f"{value:.4f}".rstrip("0").rstrip(".")


def launch_flags(engine, pick, pm, work):
    """The pick as the engine's command line, to paste: its parallelism, KV dtype, context,
    memory fraction and the requests it holds (SGLang's --max-running-requests is the total
    under DP attention, each rank taking its share; vLLM's --max-num-seqs is per DP rank)."""
    auto = resolve_kv_dtype("auto", pm.model, pm.ckpt_quant, engine, work.gpu_name)
    kv = "auto" if pick["dtype"] == auto else KV_DTYPE_FLAGS[engine].get(pick["dtype"], "auto")
    per_rank = pick["whole_requests_per_rank"]
    model = str(pm.source.checkpoint) if pm.source.checkpoint else (
        pm.source.label if pm.source.preset else "MODEL")
    if engine == "sglang":
        flags = ["--tp", str(pick["tp"])]
        if pick["dp"] > 1:
            flags += ["--dp", str(pick["dp"])]
        if pick["mode"] == "dp_attention":
            flags.append("--enable-dp-attention")
        running = per_rank * pick["dp"] if pick["mode"] == "dp_attention" else per_rank
        flags += ["--kv-cache-dtype", kv, "--context-length", str(work.context),
                  "--mem-fraction-static", fraction_flag(pick["mem_fraction"]),
                  "--max-running-requests", str(running)]
        command = ["python3", "-m", "sglang.launch_server", "--model-path", model] + flags
    else:
        flags = ["--tensor-parallel-size", str(pick["tp"])]
        if pick["dp"] > 1:
            flags += ["--data-parallel-size", str(pick["dp"])]
        if pick["mode"] == "dp_attention":
            flags.append("--enable-expert-parallel")
        flags += ["--kv-cache-dtype", kv, "--max-model-len", str(work.context),
                  "--gpu-memory-utilization", fraction_flag(pick["mem_fraction"]),
                  "--max-num-seqs", str(per_rank)]
        command = ["vllm", "serve", model] + flags
    return {"engine": engine, "flags": flags, "command": " ".join(command)}


def read_plan_model(params, notes):
    source = resolve_source(params)
    model, cfg = parse_model(source, notes, params["allow_unknown"])
    weights = scan_safetensors(source.checkpoint) if source.checkpoint else None
    size = weights_size(params, source, weights, model, cfg)
    if size.bytes is None:
        raise InputError("mode=plan needs the weights' size: a model_dir with *.safetensors, "
                         "weights_gib=GIB, or a preset", "weights_gib")
    ckpt_quant, _ = checkpoint_kv_quant(source, cfg)
    return PlanModel(source, model, cfg, weights, size,
                     kv_scale_facts(source, cfg, weights, model), ckpt_quant)


def plan(params):
    notes = Notes()
    pm = read_plan_model(params, notes)
    work = plan_gpus(params)
    work.context = max(params["context"]) if params["context"] else (
        pm.model.max_position_embeddings or DEFAULT_CONTEXTS[0])
    probe = Inputs(source=pm.source, model=pm.model, tp=1, engine=params["engine"], page_size=1,
                   ssm_dtype=params["ssm_dtype"], mamba_ratio=0.9, contexts=[work.context],
                   memory=None, dtypes={}, weights=pm.weights)
    explain_dtype_support(probe, notes)
    fits, rejected = plan_candidates(params, pm, work)
    result = plan_document(params, pm, work, fits, rejected)
    if fits:
        best, reasons = pick_candidate(fits, work, pm.scales, notes)
        result["pick"], result["reasons"] = best, reasons
        result["launch"] = launch_flags(params["engine"], best, pm, work)
        plain = [c for c in fits if c["mode"] == "tp" and c["gpus"] == best["gpus"]
                 and c["kv_dtype"] == best["kv_dtype"]]
        if best["mode"] != "tp" and plain:
            result["best_plain_tp"] = plain[0]
            reasons.append(f"with plain TP {plain[0]['tp']} the same KV dtype serves "
                           f"{plain[0]['concurrent_requests']:.2f}")
    else:
        notes.warn("nothing-fits", "no GPU count, layout and KV dtype fits the model and one "
                   f"{fmt_int(work.context)}-token request")
    explain_plan(params, pm, work, notes)
    result["warnings"], result["assumptions"] = notes.warnings, notes.assumptions
    return result


def plan_document(params, pm, work, fits, rejected):
    model = pm.model
    return {
        "mode": "plan",
        "model": {"name": model.name, "source": pm.source.kind, "preset": pm.source.preset,
                  "family": model.family, "rule": model.rule,
                  "architectures": model.architectures, "model_type": model.model_type,
                  "moe": is_moe(pm.cfg)},
        "engine": params["engine"],
        "workload": {"context": work.context, "concurrency": work.concurrency,
                     "long_context": work.long_context},
        "gpu": {"memory_gib": round(work.gpu_memory_gib, 2), "source": work.gpu_source,
                "counts": work.counts},
        "mem_fraction": params["mem_fraction"] if params["mem_fraction"] is not None else
        f"{params['engine']} default, per candidate",
        "weights": {"bytes": pm.size.bytes, "source": pm.size.source,
                    "attention_bytes": pm.size.attention_bytes,
                    "attention_source": pm.size.attention_source},
        "fp8_kv_scales": pm.scales["status"],
        "fp8_kv_scales_fact": pm.scales["fact"],
        "candidates": fits,
        "rejected": rejected,
        "pick": None,
        "reasons": [],
    }


def explain_plan(params, pm, work, notes):
    reserve, reserve_how = activation_reserve(params, params["engine"])
    size = pm.size
    notes.assume(f"KV pool per GPU = {work.gpu_memory_gib:.2f} GiB ({work.gpu_source}) x the "
                 "candidate's mem_fraction - weights per GPU - "
                 f"{reserve} GiB activation reserve ({reserve_how}); mem_fraction: " + (
                     "given" if params["mem_fraction"] is not None else
                     f"{params['engine']}'s own default for the GPU and layout (each row's "
                     "mem_fraction_source)"))
    notes.assume("layouts: " + (
        "a mixture-of-experts model runs DP as DP attention (attention split in dp groups, "
        "experts over every GPU)" if is_moe(pm.cfg) else
        "a dense model runs DP as full replicas, each a TP gpus/dp model with all the weights") +
        (" (SGLang: models that split attention by get_attention_tp_size; models/llama.py "
         "shards by the plain TP size)" if params["engine"] == "sglang" else
         " (vLLM: --data-parallel-size, with --enable-expert-parallel for MoE)"))
    if size.attention_bytes and is_moe(pm.cfg):
        notes.assume(f"weights {size.bytes / GIB:.2f} GiB ({size.source}); under DP attention "
                     "each rank also holds the attention side whole: weights per GPU = weights / "
                     "GPUs + attention side x (dp - 1) / GPUs, attention side "
                     f"{size.attention_bytes / GIB:.2f} GiB ({size.attention_source})")
    else:
        notes.assume(f"weights {size.bytes / GIB:.2f} GiB ({size.source}), split over each "
                     "instance's TP")
    notes.assume("concurrent requests = per-rank requests at the context (SGLang: capped by its "
                 "max_running_requests) x dp; headroom = requests / concurrency - 1")
    notes.assume(f"FP8 KV scales: {pm.scales['fact']}")
    if params["engine"] == "sglang" and pm.model.is_dsa:
        notes.assume("SGLang turns on DP attention with dp = tp for DeepSeek NSA "
                     f"({CITE['sg_server_args']}): plain TP is not among the layouts")
        if any(d.startswith("fp8") for d in params["kv_dtype"]) and \
                params["attention_backend"] != "trtllm":
            notes.warn("pool-overshoot", "SGLang sizes DeepSeek-V3.2's pool at 576 + 132 bytes "
                       "per token and layer but stores the 656-byte FP8 row: an FP8 row's "
                       "tensors take 788/708 of its KV pool column (the memory available for "
                       "the pool, which SGLang sizes from), out of the headroom "
                       f"({CITE['sg_mixin']} get_cell_size_per_token vs "
                       "calculate_mla_kv_cache_dim)")
    if pm.scales["status"] == "absent":
        notes.warn("fp8-kv-no-scales", pm.scales["fact"])
    if pm.model.mtp_layers and not params["mtp"]:
        notes.assume(f"{plural(pm.model.mtp_layers, 'MTP draft layer')} not counted (mtp=false)")


def render_plan(result):
    work, gpu = result["workload"], result["gpu"]
    m = result["model"]
    lines = [f"kv_calc plan: {m['name']} - engine {result['engine']} - "
             f"{work['concurrency']} x {fmt_int(work['context'])}-token requests",
             f"GPU memory {gpu['memory_gib']:.2f} GiB each ({gpu['source']}); GPU counts "
             f"{', '.join(str(c) for c in gpu['counts'])}; layer rule: {m['rule']['how']}",
             f"FP8 KV scales: {result['fp8_kv_scales_fact']}", ""]
    header = ["gpus", "layout", "kv", "mem_frac", "weights/GPU GiB", "KV pool GiB",
              "max tokens/rank", f"req@{fmt_int(work['context'])}", "headroom"]
    rows = [[str(c["gpus"]), c["layout"],
             c["kv_dtype"] if c["kv_dtype"] == c["dtype"] else f"{c['kv_dtype']} ({c['dtype']})",
             f"{c['mem_fraction']:.4g}", f"{c['weights_per_gpu_gib']:.2f}",
             f"{c['kv_pool_gib']:.2f}", fmt_int(c["max_tokens_per_rank"] or 0),
             f"{c['concurrent_requests']:,.2f}", f"{c['headroom']:+.0%}"]
            for c in result["candidates"]]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        lines.append("  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    for rej in result["rejected"]:
        lines.append(f"{rej['kind']}: {rej['gpus']} GPUs, {rej['layout']}, KV {rej['kv_dtype']}: "
                     f"{rej['reason']}")
    pick = result.get("pick")
    lines.append("")
    if pick:
        lines.append(f"pick: {pick['gpus']} GPUs, {pick['layout']}, KV {pick['kv_dtype']}: "
                     f"{pick['concurrent_requests']:,.2f} concurrent "
                     f"{fmt_int(work['context'])}-token requests")
        lines.extend(f"reason: {r}" for r in result["reasons"])
        lines.append(f"mem_fraction: {pick['mem_fraction_source']}")
        lines.append(f"launch: {result['launch']['command']}")
    else:
        lines.append("pick: none fits")
    lines.append("")
    lines.extend(f"warning [{w['code']}]: {w['message']}" for w in result["warnings"])
    lines.extend(f"assumption: {a}" for a in result["assumptions"])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Running as a job


def write_result(path, result):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def usage():
    return ("usage: python3 kv_calc.py KEY=VALUE ...   (ferry passes FERRY_PARAMS instead)\n"
            "  e.g. python3 kv_calc.py model=qwen3.5-397b-a17b tp=8 kv_memory_gib=17.4\n"
            "       python3 kv_calc.py mode=plan model=qwen3.5-397b-a17b-nvfp4 gpus=8 "
            "gpu_memory_gib=95.59 context=262144\n"
            f"keys: {', '.join(PARAM_TYPES)}\n"
            f"presets: {', '.join(sorted(PRESETS))}\n")


def error_result(error):
    """The result a bad-input run leaves: what was wrong, and the field and value it is about."""
    return {"error": {"kind": "bad-input", "message": str(error), "field": error.field,
                      "value": error.value}}


def main(argv=None, environ=None):
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage())
        return 0
    result_path = environ.get("FERRY_RESULT")
    try:
        params = load_params(environ, argv)
        result = compute(params)
    except InputError as e:
        sys.stderr.write(f"kv_calc: error: {e}\n")
        if not environ.get("FERRY_PARAMS"):
            sys.stderr.write(usage())
        if result_path:
            write_result(result_path, error_result(e))
        return 2
    sys.stdout.write(render_plan(result) if result["mode"] == "plan" else render_report(result))
    if result_path:
        write_result(result_path, result)
    return 0


# ---------------------------------------------------------------------------------------
# Presets: the fields of each model's config.json that the arithmetic reads, with the values
# of the official Hugging Face checkpoints (unless a comment says otherwise). weights_gib is
# approximate (the official checkpoint's size) and only used when memory is probed or planned
# without a model_dir.

PRESETS = {
    "qwen3.5-397b-a17b": {
        "name": "Qwen/Qwen3.5-397B-A17B",
        "weights_gib": 739.0,  # 397B params x 2 bytes (BF16)
        "config": {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "vision_config": {"depth": 27, "hidden_size": 1152},
            "text_config": {
                "model_type": "qwen3_5_moe_text",
                "dtype": "bfloat16",
                "hidden_size": 4096,
                "num_hidden_layers": 60,
                "num_attention_heads": 32,
                "num_key_value_heads": 2,
                "head_dim": 256,
                "full_attention_interval": 4,
                "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 128,
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 64,
                "linear_value_head_dim": 128,
                "num_experts": 512,
                "max_position_embeddings": 262144,
            },
        },
    },
    "qwen3-next-80b-a3b": {
        "name": "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "weights_gib": 149.0,  # 80B x 2 bytes
        "config": {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "torch_dtype": "bfloat16",
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_value_head_dim": 128,
            "num_experts": 512,
            "max_position_embeddings": 262144,
        },
    },
    "llama-3.1-8b": {
        "name": "meta-llama/Llama-3.1-8B-Instruct",
        "weights_gib": 15.0,  # 8.03B x 2 bytes
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
        },
    },
    "llama-3.1-70b": {
        "name": "meta-llama/Llama-3.1-70B-Instruct",
        "weights_gib": 131.4,  # 70.6B x 2 bytes
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "torch_dtype": "bfloat16",
            "hidden_size": 8192,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
        },
    },
    "deepseek-v3": {
        "name": "deepseek-ai/DeepSeek-V3",
        "weights_gib": 642.0,  # the FP8 checkpoint (671B + MTP layer)
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "torch_dtype": "bfloat16",
            "hidden_size": 7168,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "max_position_embeddings": 163840,
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                    "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]},
        },
    },
    "gpt-oss-120b": {
        "name": "openai/gpt-oss-120b",
        "weights_gib": 60.8,  # MXFP4 experts, BF16 rest
        "config": {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "torch_dtype": "bfloat16",
            "hidden_size": 2880,
            "num_hidden_layers": 36,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
            "num_local_experts": 128,
            "max_position_embeddings": 131072,
            "quantization_config": {"quant_method": "mxfp4"},
        },
    },
    "qwen3.5-397b-a17b-nvfp4": {
        "name": "nvidia/Qwen3.5-397B-A17B-NVFP4",
        # Estimated from the config, not a published size: 386.5B expert parameters at NVFP4
        # (4 bits + one FP8 scale per 16 = 0.5625 bytes) + ~10.5B attention, linear-attention,
        # embedding and shared-expert parameters in BF16; the MTP layer is only loaded with
        # speculative decoding.
        "weights_gib": 218.0,
        "weights_how": "estimated from the config (NVFP4 experts, BF16 rest, no MTP layer)",
        "config": {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            # The export declares FP8 KV (hf_quant_config.json kv_cache_quant_algo).
            "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                    "kv_cache_quant_algo": "FP8"},
            "vision_config": {"depth": 27, "hidden_size": 1152},
            "text_config": {
                "model_type": "qwen3_5_moe_text",
                "dtype": "bfloat16",
                "hidden_size": 4096,
                "num_hidden_layers": 60,
                "num_attention_heads": 32,
                "num_key_value_heads": 2,
                "head_dim": 256,
                "attn_output_gate": True,
                "full_attention_interval": 4,
                "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 128,
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 64,
                "linear_value_head_dim": 128,
                "mamba_ssm_dtype": "float32",
                "mtp_num_hidden_layers": 1,
                "num_experts": 512,
                "max_position_embeddings": 262144,
            },
        },
    },
    "deepseek-v3.2-exp": {
        "name": "deepseek-ai/DeepSeek-V3.2-Exp",
        "weights_gib": 642.0,  # the FP8 checkpoint, as DeepSeek-V3
        "config": {
            "architectures": ["DeepseekV32ForCausalLM"],
            "model_type": "deepseek_v32",
            "torch_dtype": "bfloat16",
            "hidden_size": 7168,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "index_head_dim": 128,
            "index_n_heads": 64,
            "index_topk": 2048,
            "num_nextn_predict_layers": 1,
            "n_routed_experts": 256,
            "max_position_embeddings": 163840,
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                    "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]},
        },
    },
    "gemma-2-9b": {
        "name": "google/gemma-2-9b-it",
        "weights_gib": 17.2,  # 9.24B x 2 bytes (the engines run the float32 config as bf16)
        "config": {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "torch_dtype": "float32",
            "hidden_size": 3584,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "sliding_window": 4096,
            "max_position_embeddings": 8192,
        },
    },
    "gemma-3-27b": {
        "name": "google/gemma-3-27b-it",
        "weights_gib": 51.0,  # 27.4B x 2 bytes
        # As published: no sliding_window_pattern, layer_types or max_position_embeddings;
        # transformers' Gemma3TextConfig defaults fill them in.
        "config": {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "torch_dtype": "bfloat16",
            "text_config": {
                "model_type": "gemma3_text",
                "head_dim": 128,
                "hidden_size": 5376,
                "num_hidden_layers": 62,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "sliding_window": 1024,
            },
        },
    },
    "llama-4-scout": {
        "name": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "weights_gib": 203.0,  # 109B x 2 bytes
        "config": {
            "architectures": ["Llama4ForConditionalGeneration"],
            "model_type": "llama4",
            "text_config": {
                "model_type": "llama4_text",
                "torch_dtype": "bfloat16",
                "hidden_size": 5120,
                "num_hidden_layers": 48,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "attention_chunk_size": 8192,
                "no_rope_layers": [],
                "num_local_experts": 16,
                "max_position_embeddings": 10485760,
            },
        },
    },
    "mistral-7b-v0.1": {
        "name": "mistralai/Mistral-7B-v0.1",
        "weights_gib": 13.5,  # 7.24B x 2 bytes
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "sliding_window": 4096,
            "max_position_embeddings": 32768,
        },
    },
    "qwen2.5-7b": {
        "name": "Qwen/Qwen2.5-7B-Instruct",
        "weights_gib": 14.2,  # 7.62B x 2 bytes
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "torch_dtype": "bfloat16",
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 32768,
            "sliding_window": 131072,
            "use_sliding_window": False,
            "max_window_layers": 28,
        },
    },
    "nemotron-h-8b": {
        "name": "nvidia/Nemotron-H-8B-Base-8K",
        "weights_gib": 15.2,  # 8.2B x 2 bytes
        # The NemotronHConfig defaults, which describe this checkpoint.
        "config": {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 52,
            "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mamba_num_heads": 128,
            "mamba_head_dim": 64,
            "n_groups": 8,
            "ssm_state_size": 128,
            "conv_kernel": 4,
            "max_position_embeddings": 8192,
        },
    },
    "nemotron-3-nano-30b-a3b": {
        "name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B",
        "weights_gib": 58.5,  # 31.6B x 2 bytes
        "config": {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "torch_dtype": "bfloat16",
            "hidden_size": 2688,
            "num_hidden_layers": 52,
            "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            "n_routed_experts": 128,
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "mamba_num_heads": 64,
            "mamba_head_dim": 64,
            "n_groups": 8,
            "ssm_state_size": 128,
            "conv_kernel": 4,
            "max_position_embeddings": 262144,
        },
    },
    "falcon-h1": {
        "name": "FalconH1Config defaults",
        "weights_gib": 14.0,  # ~7.5B x 2 bytes for these dimensions
        # The config class defaults (SGLang configs/falcon_h1.py FalconH1Config), not a
        # published checkpoint: every layer runs attention and Mamba-2 side by side.
        "config": {
            "architectures": ["FalconH1ForCausalLM"],
            "model_type": "falcon_h1",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "mamba_d_ssm": 1024,
            "mamba_n_heads": 128,
            "mamba_d_head": "auto",
            "mamba_n_groups": 1,
            "mamba_d_state": 256,
            "mamba_d_conv": 4,
            "max_position_embeddings": 8192,
        },
    },
    "granite-4.0-h-small": {
        "name": "ibm-granite/granite-4.0-h-small",
        "weights_gib": 60.0,  # 32B x 2 bytes
        "config": {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 40,
            "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"]
            + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "mamba_n_heads": 128,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 128,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "num_local_experts": 72,
            "max_position_embeddings": 131072,
        },
    },
    "jamba-mini-1.7": {
        "name": "ai21labs/AI21-Jamba-Mini-1.7",
        "weights_gib": 96.9,  # 52B x 2 bytes
        "config": {
            "architectures": ["JambaForCausalLM"],
            "model_type": "jamba",
            "torch_dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "num_experts": 16,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "max_position_embeddings": 262144,
        },
    },
    "minimax-text-01": {
        "name": "MiniMaxAI/MiniMax-Text-01",
        "weights_gib": 849.0,  # 456B x 2 bytes
        "config": {
            "architectures": ["MiniMaxText01ForCausalLM"],
            "model_type": "MiniMaxText01",
            "torch_dtype": "bfloat16",
            "hidden_size": 6144,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attn_type_list": ([0] * 7 + [1]) * 10,
            "num_local_experts": 32,
            "max_position_embeddings": 10240000,
        },
    },
}


def find_preset(name):
    """Case-insensitive; a Hugging Face "org/" prefix and an "-Instruct" suffix are ignored."""
    key = name.strip().lower().split("/")[-1]
    for candidate in (key, re.sub(r"-instruct(-\d+)?$", "", key)):
        if candidate in PRESETS:
            return candidate
    raise InputError(f"model: unknown preset '{name}'; presets: {', '.join(sorted(PRESETS))}",
                     "model", name)


if __name__ == "__main__":
    sys.exit(main())
