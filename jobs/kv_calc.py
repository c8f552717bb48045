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
    python3 jobs/kv_calc.py model=qwen3.5-397b-a17b tp=8 kv_memory_gib=17.4
Standard library only; runs on Python 3.8+.

Reading order: parameters, the model (config.json, checkpoint files), memory, the inputs of
one sizing gathered in `Inputs`, the arithmetic (numbers only), the explanations (warnings and
assumptions, built from the numbers), the result and its report, and the presets at the end.
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
    "model_dir": ("string", None),
    "config": ("json", None),
    "model": ("string", None),
    "tp": ("int", 1),
    "kv_dtype": ("list:string", ["bf16", "fp8_e4m3"]),
    "kv_memory_gib": ("float", None),
    "mem_fraction": ("float", 0.9),
    "weights_gib": ("float", None),
    "activation_reserve_gib": ("float", None),
    "context": ("list:int", None),
    "engine": ("string", "sglang"),
    "page_size": ("int", None),
    "ssm_dtype": ("string", "float32"),
    "mamba_full_memory_ratio": ("float", 0.9),
    "calibrate_log": ("string", None),
}
KV_DTYPE_CHOICES = ["auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
SSM_DTYPE_CHOICES = ["float32", "bfloat16", "float16"]
ENGINES = ["sglang", "vllm"]

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

DEFAULT_PAGE_SIZE = {"sglang": 1, "vllm": 16}
# SGLang keeps activations and CUDA graphs in the (1 - mem_fraction_static) headroom; vLLM
# profiles its activation peak inside gpu_memory_utilization, so something must be set aside.
DEFAULT_ACTIVATION_RESERVE_GIB = {"sglang": 0.0, "vllm": 2.0}
# SGLang ServerArgs.swa_full_tokens_ratio default.
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
# SGLang MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: with the radix cache on, running
# requests are capped at state slots // 3.
SGLANG_STATE_SLOTS_PER_REQUEST = 3
DEFAULT_CONTEXTS = [32768, 131072]


class InputError(Exception):
    """Bad or missing input: reported on stderr, exit 2, no result written."""


# ---------------------------------------------------------------------------------------
# Parameters


def _typed_value(name, kind, text):
    """`KEY=VALUE` from a by-hand command line, typed like ferry's `-p`."""
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "json":
            return json.loads(text)
        if kind.startswith("list:"):
            item = kind.split(":", 1)[1]
            parts = [p.strip() for p in text.split(",") if p.strip()]
            return [_typed_value(name, item, p) for p in parts]
        return text
    except ValueError:
        raise InputError(f"parameter '{name}' expects {kind}, got '{text}'")


def params_from_argv(argv):
    params = {}
    for arg in argv:
        if "=" not in arg:
            raise InputError(f"arguments are KEY=VALUE (got '{arg}'); keys: "
                             f"{', '.join(PARAM_TYPES)}")
        key, text = arg.split("=", 1)
        if key not in PARAM_TYPES:
            raise InputError(f"unknown parameter '{key}'; known: {', '.join(PARAM_TYPES)}")
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


def check_params(params):
    def want(cond, message):
        if not cond:
            raise InputError(message)

    tp = params["tp"]
    want(_is_count(tp, 1), f"tp must be a whole number >= 1 (got {tp!r})")
    dtypes = params["kv_dtype"]
    want(isinstance(dtypes, list) and dtypes, "kv_dtype must be a non-empty list")
    for d in dtypes:
        want(d in KV_DTYPE_CHOICES, f"kv_dtype: '{d}' is not one of {', '.join(KV_DTYPE_CHOICES)}")
    engine = params["engine"]
    want(engine in ENGINES, f"engine must be one of {', '.join(ENGINES)} (got {engine!r})")
    ssm = params["ssm_dtype"]
    want(ssm in SSM_DTYPE_CHOICES,
         f"ssm_dtype must be one of {', '.join(SSM_DTYPE_CHOICES)} (got {ssm!r})")
    for key in ("kv_memory_gib", "weights_gib", "activation_reserve_gib"):
        value = params[key]
        want(value is None or (isinstance(value, (int, float)) and value >= 0),
             f"{key} must be a number of GiB >= 0 (got {value!r})")
    frac = params["mem_fraction"]
    want(isinstance(frac, (int, float)) and 0 < frac <= 1,
         f"mem_fraction must be in (0, 1] (got {frac!r})")
    ratio = params["mamba_full_memory_ratio"]
    want(isinstance(ratio, (int, float)) and ratio > 0,
         f"mamba_full_memory_ratio must be > 0 (got {ratio!r})")
    page = params["page_size"]
    want(page is None or (isinstance(page, int) and page >= 1),
         f"page_size must be a whole number >= 1 (got {page!r})")
    contexts = params["context"]
    want(contexts is None or (isinstance(contexts, list) and contexts and all(
        isinstance(c, int) and c > 0 for c in contexts)),
        f"context must be a list of positive token counts (got {contexts!r})")
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
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}")
    except ValueError as e:
        raise InputError(f"{what} {path} is not valid JSON: {e}")
    if not isinstance(value, dict):
        raise InputError(f"{what} {path} does not hold a JSON object")
    return value


def resolve_source(params):
    given = [k for k in ("model_dir", "config", "model") if params.get(k) not in (None, "")]
    if not given:
        raise InputError(
            "no model given: pass model_dir=DIR (a checkpoint on this host), config=JSON "
            f"(its config.json), or model=NAME (presets: {', '.join(sorted(PRESETS))})")
    if len(given) > 1:
        raise InputError(f"give one of model_dir, config, model (got {', '.join(given)})")
    kind = given[0]
    if kind == "model_dir":
        ckpt = Path(params["model_dir"]).expanduser()
        if not ckpt.is_dir():
            raise InputError(f"model_dir {ckpt} is not a directory on this host")
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
                             f"got {type(config).__name__}")
        return Source("config", "config parameter", config)
    key = find_preset(params["model"])
    preset = PRESETS[key]
    return Source("preset", preset["name"], json.loads(json.dumps(preset["config"])), preset=key)


def text_config(config):
    """Multimodal wrappers keep the language model under text_config; fields it lacks (e.g.
    quantization_config, torch_dtype) fall back to the top level."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return dict(config)
    merged = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    merged.update(inner)
    return merged


@dataclass
class LinearAttention:
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int


@dataclass
class Model:
    name: str
    attention: str  # "mha" (incl. GQA/MQA) or "mla"
    layer_kinds: list  # per layer: "full", "sliding", "linear"
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    torch_dtype: str
    max_position_embeddings: int = None
    sliding_window: int = None
    kv_lora_rank: int = None
    qk_rope_head_dim: int = None
    linear: LinearAttention = None
    architectures: list = field(default_factory=list)
    model_type: str = None

    def count(self, kind):
        return sum(1 for k in self.layer_kinds if k == kind)


def need(cfg, key, what=None):
    """A field the arithmetic cannot do without."""
    value = cfg.get(key)
    if value is None:
        why = f" ({what})" if what else ""
        raise InputError(f"config.json has no '{key}'{why}; it is needed to size the KV cache")
    return value


def field_or_default(cfg, key, default, notes):
    value = cfg.get(key)
    if value is None:
        notes.warn("config-field-missing", f"config.json has no '{key}'; assumed {default}")
        return default
    return value


LAYER_KIND_NAMES = {
    "full_attention": "full", "attention": "full", "global_attention": "full",
    "sliding_attention": "sliding", "sliding_window": "sliding", "local_attention": "sliding",
    "linear_attention": "linear", "mamba": "linear", "gated_delta_net": "linear",
}


def classify_layers(cfg, num_layers, notes):
    """Which layers cache K/V for every token, which only a window, which hold a fixed state."""
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = []
        for i, t in enumerate(layer_types):
            kind = LAYER_KIND_NAMES.get(str(t).lower())
            if kind is None:
                raise InputError(f"config.json layer_types[{i}] = '{t}' is not a layer type this "
                                 f"calculator knows ({', '.join(LAYER_KIND_NAMES)})")
            kinds.append(kind)
        if len(kinds) != num_layers:
            notes.warn("config-inconsistent",
                       f"layer_types lists {len(kinds)} layers but num_hidden_layers is "
                       f"{num_layers}; using layer_types")
        return kinds
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        # Qwen3-Next / Qwen3.5: every interval-th layer is full attention, the rest linear.
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers)]
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window") is not False:
        pattern = cfg.get("sliding_window_pattern")
        if pattern:
            # Gemma 2/3: every pattern-th layer is global.
            return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)]
        max_pos = cfg.get("max_position_embeddings")
        if not max_pos or window < max_pos:
            notes.assume(f"sliding_window {window} with no layer_types or pattern: every layer is "
                         "taken as sliding-window (Mistral-style)")
            return ["sliding"] * num_layers
    return ["full"] * num_layers


def parse_model(source, notes):
    cfg = text_config(source.config)
    num_layers = need(cfg, "num_hidden_layers")
    torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if torch_dtype is None:
        torch_dtype = "bfloat16"
        notes.warn("config-field-missing",
                   "config.json has no 'torch_dtype'; assumed bfloat16 for 'auto' and the "
                   "conv state")
    kinds = classify_layers(cfg, num_layers, notes)
    model = Model(
        name=source.label, attention="mha", layer_kinds=kinds, num_kv_heads=0, head_dim=0,
        v_head_dim=0, torch_dtype=str(torch_dtype).replace("torch.", ""),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        architectures=list(cfg.get("architectures") or source.config.get("architectures") or []),
        model_type=source.config.get("model_type") or cfg.get("model_type"))
    if model.max_position_embeddings is None:
        notes.warn("config-field-missing", "config.json has no 'max_position_embeddings'; "
                   "the concurrency table uses only the given/default context lengths")

    if cfg.get("kv_lora_rank"):
        # MLA (DeepSeek-V2/V3): one compressed latent per token and layer.
        model.attention = "mla"
        model.kv_lora_rank = cfg["kv_lora_rank"]
        model.qk_rope_head_dim = need(cfg, "qk_rope_head_dim", "MLA rope dimension")
        model.num_kv_heads = 1
    else:
        heads = need(cfg, "num_attention_heads")
        model.num_kv_heads = field_or_default(cfg, "num_key_value_heads", heads, notes)
        head_dim = cfg.get("head_dim")
        if head_dim is None:
            hidden = need(cfg, "hidden_size", "head_dim is absent, so hidden_size is needed")
            head_dim = hidden // heads
            notes.assume(f"head_dim = hidden_size / num_attention_heads = {hidden} / {heads} = "
                         f"{head_dim} (config.json has no head_dim; transformers and the engines "
                         "derive it the same way)")
        model.head_dim = head_dim
        model.v_head_dim = cfg.get("v_head_dim") or head_dim

    if "sliding" in kinds:
        model.sliding_window = need(cfg, "sliding_window", "layer_types has sliding layers")
    if "linear" in kinds:
        model.linear = LinearAttention(
            key_heads=need(cfg, "linear_num_key_heads"),
            key_dim=need(cfg, "linear_key_head_dim"),
            value_heads=need(cfg, "linear_num_value_heads"),
            value_dim=need(cfg, "linear_value_head_dim"),
            conv_kernel=field_or_default(cfg, "linear_conv_kernel_dim", 4, notes))
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


@dataclass
class Weights:
    files: int = 0
    bytes: int = 0
    tensor_names: list = field(default_factory=list)
    unreadable: list = field(default_factory=list)


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
        weights.tensor_names.extend(k for k in header if k != "__metadata__")
    return weights


def has_kv_scales(tensor_names):
    # modelopt writes self_attn.k_proj.k_scale, compressed-tensors self_attn.k_scale.
    names = [n.rsplit(".", 1)[-1] for n in tensor_names]
    return "k_scale" in names and "v_scale" in names


# ---------------------------------------------------------------------------------------
# Memory per GPU for the KV pool: given, or probed with nvidia-smi and the weights' size


@dataclass
class Memory:
    source: str  # "given", "probed" or "unknown"
    pool_gib: float = None
    gpus: list = None
    probe_failure: str = None  # why nvidia-smi gave nothing
    tp: int = 1
    gpu_total_mib: int = None
    mem_fraction: float = None
    weights_bytes: int = None
    weights_source: str = None
    activation_reserve_gib: float = None
    activation_reserve_source: str = None
    exhausted: bool = False
    unreadable: list = field(default_factory=list)  # safetensors files sized by file size

    @property
    def pool_bytes(self):
        return None if self.pool_gib is None else int(self.pool_gib * GIB)

    def to_json(self):
        out = {"source": self.source, "pool_gib": self.pool_gib, "pool_bytes": self.pool_bytes}
        if self.gpus is not None:
            out["gpus"] = self.gpus
        if self.source == "probed":
            out.update({"gpu_total_mib": self.gpu_total_mib, "mem_fraction": self.mem_fraction,
                        "weights_bytes": self.weights_bytes,
                        "weights_source": self.weights_source,
                        "weights_per_gpu_bytes": self.weights_bytes // self.tp,
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


def weights_size(params, source, weights):
    """(bytes, how it was found, files sized by their length) for the whole checkpoint; bytes
    is None when nothing tells."""
    if params["weights_gib"] is not None:
        return int(params["weights_gib"] * GIB), "given", []
    if weights is not None and weights.files:
        files = "file" if weights.files == 1 else "files"
        return weights.bytes, (f"probed: tensor data of {weights.files} *.safetensors {files} "
                               f"in {source.label}"), weights.unreadable
    if source.preset:
        preset = PRESETS[source.preset]
        return int(preset["weights_gib"] * GIB), (
            f"assumed: ~{preset['weights_gib']} GiB, the size of the official {preset['name']} "
            "checkpoint"), []
    return None, None, []


def resolve_memory(params, source, weights, engine, tp):
    """The GiB per GPU that the KV pool (and recurrent state) may use, and how it was found."""
    if params["kv_memory_gib"] is not None:
        return Memory("given", float(params["kv_memory_gib"]), tp=tp)
    gpus, failure = probe_gpus()
    if gpus is None:
        return Memory("unknown", probe_failure=failure, tp=tp)
    memory = Memory("unknown", gpus=gpus, tp=tp,
                    gpu_total_mib=min(g["memory_total_mib"] for g in gpus[:tp]))
    memory.weights_bytes, memory.weights_source, memory.unreadable = weights_size(
        params, source, weights)
    if memory.weights_bytes is None:
        return memory
    memory.mem_fraction = float(params["mem_fraction"])
    memory.activation_reserve_gib = params["activation_reserve_gib"]
    memory.activation_reserve_source = "given"
    if memory.activation_reserve_gib is None:
        memory.activation_reserve_gib = DEFAULT_ACTIVATION_RESERVE_GIB[engine]
        memory.activation_reserve_source = f"assumed ({engine} default)"
    # SGLang works in GiB floats: rest = total * mem_fraction - weights (after loading).
    pool_gib = (memory.gpu_total_mib / 1024 * memory.mem_fraction
                - memory.weights_bytes / tp / GIB - memory.activation_reserve_gib)
    memory.exhausted = pool_gib <= 0
    memory.source = "probed"
    memory.pool_gib = 0.0 if memory.exhausted else pool_gib
    return memory


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
    ssm_dtype: str
    mamba_ratio: float  # SGLang --mamba-full-memory-ratio
    contexts: list
    memory: Memory
    dtypes: dict  # requested name ("auto", "bf16", ...) -> the dtype it resolves to
    ckpt_quant: str = None  # the KV dtype the checkpoint asks for
    quant_where: str = None  # where that was read
    weights: Weights = None


def resolve_kv_dtype(name, model, ckpt_quant):
    """`auto` is what the engines pick: the checkpoint's KV dtype, else the model's dtype."""
    if name != "auto":
        return name
    if ckpt_quant:
        return ckpt_quant
    return TORCH_TO_KV.get(model.torch_dtype, "bf16")


def context_lengths(params, model):
    if params["context"]:
        return sorted(set(params["context"]))
    contexts = list(DEFAULT_CONTEXTS)
    if model.max_position_embeddings:
        contexts.append(model.max_position_embeddings)
    return sorted(set(contexts))


def gather_inputs(params, notes):
    source = resolve_source(params)
    model, cfg = parse_model(source, notes)
    engine = params["engine"]
    weights = scan_safetensors(source.checkpoint) if source.checkpoint else None
    ckpt_quant, quant_where = checkpoint_kv_quant(source, cfg)
    requested = list(dict.fromkeys(params["kv_dtype"]))
    return Inputs(
        source=source, model=model, tp=params["tp"], engine=engine,
        page_size=params["page_size"] or DEFAULT_PAGE_SIZE[engine],
        ssm_dtype=params["ssm_dtype"], mamba_ratio=float(params["mamba_full_memory_ratio"]),
        contexts=context_lengths(params, model), memory=None,
        dtypes={name: resolve_kv_dtype(name, model, ckpt_quant) for name in requested},
        ckpt_quant=ckpt_quant, quant_where=quant_where, weights=weights)


# ---------------------------------------------------------------------------------------
# The arithmetic: numbers only, each step as the engine takes it


def kv_heads_per_gpu(num_kv_heads, tp):
    """vLLM ModelConfig.get_num_kv_heads / SGLang ModelConfig.get_num_kv_heads: with fewer KV
    heads than GPUs each GPU holds one replicated head."""
    return max(1, num_kv_heads // tp)


def elements_per_token_per_layer(model, tp):
    """Cached values per token in one attention layer on one GPU."""
    if model.attention == "mla":
        # MLA caches the latent (kv_lora_rank) plus the decoupled rope key; it is not split
        # across TP ranks (SGLang MLATokenToKVPool, vLLM MLAAttentionSpec).
        return model.kv_lora_rank + model.qk_rope_head_dim
    return kv_heads_per_gpu(model.num_kv_heads, tp) * (model.head_dim + model.v_head_dim)


def bytes_per_token(model, tp, dtype, kinds=("full",)):
    """Per GPU, K+V (or the MLA latent), summed over the layers of the given kinds."""
    layers = sum(model.count(k) for k in kinds)
    return elements_per_token_per_layer(model, tp) * layers * DTYPE_BYTES[dtype]


def naive_bytes_per_token(model, dtype):
    """The figure that puts every KV head on every GPU (what TP-unaware calculators print)."""
    per_layer = model.num_kv_heads * (model.head_dim + model.v_head_dim)
    return per_layer * model.count("full") * DTYPE_BYTES[dtype]


def sliding_bytes_per_request(model, tp, dtype):
    """Sliding-window layers hold at most `sliding_window` tokens per request."""
    if not model.count("sliding"):
        return 0
    return bytes_per_token(model, tp, dtype, ("sliding",)) * model.sliding_window


def recurrent_state(model, tp, ssm_dtype):
    """Per-request state of the linear-attention layers on one GPU (SGLang Mamba2StateShape /
    vLLM MambaStateShapeCalculator.gated_delta_net_state_shape)."""
    lin = model.linear
    layers = model.count("linear")
    if lin is None or layers == 0:
        return {"layers": 0, "conv_bytes": 0, "ssm_bytes": 0, "bytes_per_request": 0}
    conv_dim = lin.key_heads * lin.key_dim * 2 + lin.value_heads * lin.value_dim
    conv_elements = (conv_dim // tp) * (lin.conv_kernel - 1)
    ssm_elements = (lin.value_heads // tp) * lin.value_dim * lin.key_dim
    conv_dtype = TORCH_TO_KV.get(model.torch_dtype, "bf16")
    conv_per_layer = int(conv_elements * DTYPE_BYTES[conv_dtype])
    ssm_per_layer = int(ssm_elements * DTYPE_BYTES[ssm_dtype])
    return {
        "layers": layers,
        "conv_dim": conv_dim,
        "conv_elements_per_layer": conv_elements,
        "ssm_elements_per_layer": ssm_elements,
        "conv_dtype": model.torch_dtype,
        "ssm_dtype": ssm_dtype,
        "conv_bytes": conv_per_layer * layers,
        "ssm_bytes": ssm_per_layer * layers,
        "bytes_per_request": (conv_per_layer + ssm_per_layer) * layers,
    }


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


def vllm_tokens(pool_bytes, per_layer_bytes, layers, block_size):
    """vLLM kv_cache_utils get_num_blocks: available // page_size // num_layers blocks of
    block_size tokens (page_size = block_size x bytes per token of one layer)."""
    page = Fraction(per_layer_bytes) * block_size
    blocks = int(Fraction(pool_bytes) / page) // layers
    return blocks * block_size


@dataclass
class Capacity:
    max_tokens: int
    all_to_kv_tokens: int
    detail: dict


def sglang_capacity(inp, per_layer, state, pool_gib):
    model, page = inp.model, inp.page_size
    full, sliding = model.count("full"), model.count("sliding")
    if state["bytes_per_request"]:
        slots, rest_gib = sglang_state_split(pool_gib, state["bytes_per_request"], inp.mamba_ratio)
        detail = {"state_slots": slots,
                  "state_pool_bytes": slots * state["bytes_per_request"],
                  "kv_pool_bytes": int(rest_gib * GIB),
                  "max_running_requests": slots // SGLANG_STATE_SLOTS_PER_REQUEST}
        return sglang_tokens(rest_gib, per_layer * full, page), detail
    if sliding and full:
        tokens_all = sglang_tokens(pool_gib, per_layer * (full + sliding), 1)
        max_tokens, swa_tokens = sglang_swa_split(tokens_all, full + sliding, full, sliding, page)
        return max_tokens, {"swa_tokens": swa_tokens,
                            "swa_full_tokens_ratio": SGLANG_SWA_FULL_TOKENS_RATIO}
    return sglang_tokens(pool_gib, per_layer * full, page), {}


def capacity(inp, dtype, state):
    """Tokens of KV cache the engine allocates from the pool of each GPU."""
    model, page = inp.model, inp.page_size
    per_layer = elements_per_token_per_layer(model, inp.tp) * DTYPE_BYTES[dtype]
    bpt = per_layer * model.count("full")
    pool_bytes = inp.memory.pool_bytes
    all_to_kv = int(Fraction(pool_bytes) / bpt) // page * page if bpt else 0
    if inp.engine == "sglang":
        max_tokens, detail = sglang_capacity(inp, per_layer, state, inp.memory.pool_gib)
        return Capacity(max_tokens, all_to_kv, detail)
    max_tokens = vllm_tokens(pool_bytes, per_layer, model.count("full"), page)
    fixed = state["bytes_per_request"] + sliding_bytes_per_request(model, inp.tp, dtype)
    detail = {"fixed_bytes_per_request": json_number(fixed)} if fixed else {}
    return Capacity(max_tokens, all_to_kv, detail)


def concurrency(tokens, contexts):
    return {str(c): round(tokens / c, 2) for c in contexts}


def json_number(x):
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def kv_entry(inp, dtype, state):
    """One dtype's column of the result: bytes per token and what fits in the pool."""
    model, tp, contexts = inp.model, inp.tp, inp.contexts
    bpt = bytes_per_token(model, tp, dtype)
    entry = {"dtype": dtype, "bytes_per_element": json_number(DTYPE_BYTES[dtype]),
             "bytes_per_token": json_number(bpt),
             "per_layer_bytes_per_token": json_number(elements_per_token_per_layer(model, tp)
                                                      * DTYPE_BYTES[dtype]),
             "max_tokens": None, "concurrent_requests": None}
    if model.attention == "mha" and tp > 1:
        entry["naive_bytes_per_token"] = json_number(naive_bytes_per_token(model, dtype))
    if model.count("sliding"):
        entry["sliding_window_bytes_per_token"] = json_number(
            bytes_per_token(model, tp, dtype, ("sliding",)))
        entry["sliding_window_bytes_per_request"] = json_number(
            sliding_bytes_per_request(model, tp, dtype))
    pool_bytes = inp.memory.pool_bytes
    if pool_bytes is None or not bpt:
        return entry
    cap = capacity(inp, dtype, state)
    entry["max_tokens"] = cap.max_tokens
    entry["concurrent_requests"] = concurrency(cap.max_tokens, contexts)
    entry["all_to_kv_tokens"] = cap.all_to_kv_tokens
    entry["all_to_kv_concurrent_requests"] = concurrency(cap.all_to_kv_tokens, contexts)
    if "naive_bytes_per_token" in entry:
        entry["naive_max_tokens"] = int(pool_bytes // Fraction(entry["naive_bytes_per_token"]))
    if cap.detail:
        entry["engine_split"] = cap.detail
        fixed = cap.detail.get("fixed_bytes_per_request")
        if fixed:
            # vLLM takes sliding windows and states from the same block pool as the KV.
            entry["shared_pool_concurrent_requests"] = {
                str(c): round(pool_bytes / float(c * bpt + Fraction(fixed)), 2)
                for c in contexts}
    return entry


# ---------------------------------------------------------------------------------------
# Calibration against an engine's own log


SGLANG_KV_LINE = re.compile(
    r"KV Cache is allocated\.\s*#tokens:\s*([\d,]+),\s*K size:\s*([\d.]+)\s*GB,"
    r"\s*V size:\s*([\d.]+)\s*GB")
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
    if m:
        tokens = _count(m)
        k_gib, v_gib = float(m.group(2)), float(m.group(3))
        slots = tokens + page_size
        observed = {"engine": "sglang", "tokens": tokens, "k_gib": k_gib, "v_gib": v_gib,
                    "pool_slots": slots, "kv_bytes": int((k_gib + v_gib) * GIB),
                    "bytes_per_token": (k_gib + v_gib) * GIB / slots}
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
    slots = entry.get("engine_split", {}).get("state_slots")
    if slots is not None and "state_slots" in observed:
        result["modelled_state_slots"] = slots
    return result


# ---------------------------------------------------------------------------------------
# The explanations: warnings and assumptions, written from the numbers above


def explain_auto(inp, notes):
    if "auto" not in inp.dtypes:
        return
    why = inp.quant_where or ("no KV quantization in the checkpoint, so the model's dtype "
                              f"({inp.model.torch_dtype})")
    notes.assume(f"auto = {inp.dtypes['auto']}: {why}")


def explain_fp8_scales(inp, notes):
    fp8 = sorted({d for d in inp.dtypes.values() if d.startswith("fp8")})
    if not fp8 and inp.ckpt_quant != "fp8_e4m3":
        return
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


def explain_layers(model, tp, notes):
    if model.attention == "mla":
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        notes.assume(f"MLA: each layer caches one latent of kv_lora_rank + qk_rope_head_dim = "
                     f"{model.kv_lora_rank} + {model.qk_rope_head_dim} = {latent} values per "
                     "token, the same on every GPU (not split by TP)")
        return
    kv_heads = model.num_kv_heads
    heads = kv_heads_per_gpu(kv_heads, tp)
    notes.assume(f"KV heads per GPU = max(1, num_key_value_heads // tp) = max(1, {kv_heads} // "
                 f"{tp}) = {heads} (vLLM and SGLang ModelConfig.get_num_kv_heads)")
    if kv_heads < tp:
        notes.warn("kv-heads-replicated",
                   f"{kv_heads} KV heads across TP {tp}: each GPU holds 1 replicated head "
                   f"({tp // kv_heads} GPUs share each head), so per-GPU KV is 1 head's worth, "
                   f"not {kv_heads}")
    elif kv_heads % tp:
        notes.warn("tp-not-divisible", f"{kv_heads} KV heads do not divide over TP {tp}; the "
                   "engines refuse this layout")
    if model.count("linear"):
        notes.assume(f"only the {model.count('full')} full-attention layers cache K/V per token; "
                     f"the {model.count('linear')} linear-attention layers hold a fixed "
                     "recurrent state per request")
    if model.count("sliding"):
        notes.assume(f"the {model.count('sliding')} sliding-window layers hold at most "
                     f"{fmt_int(model.sliding_window)} tokens per request; they are left out of "
                     "bytes/token and reported apart")


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
                 f"reserve = {total} MiB (probed) x {frac} - {weights_gib:.2f} GiB "
                 f"({memory.weights_source}) / {tp} - {reserve} GiB "
                 f"({memory.activation_reserve_source}) = {memory.pool_gib:.2f} GiB")


def explain_naive(model, tp, kv, notes):
    """TP-unaware calculators put every KV head on every GPU; say what that would claim."""
    heads = kv_heads_per_gpu(model.num_kv_heads, tp)
    if model.attention != "mha" or tp == 1 or model.num_kv_heads == heads:
        return
    figures = []
    for name, entry in kv.items():
        text = f"{fmt_num(entry['naive_bytes_per_token'])} bytes/token at {name}"
        if entry.get("naive_max_tokens") is not None:
            text += f" ({fmt_int(entry['naive_max_tokens'])} tokens with all memory to KV)"
        figures.append(text)
    notes.assume(f"counting all {model.num_kv_heads} KV heads on every GPU would give "
                 f"{', '.join(figures)}: wrong under TP {tp}, where each GPU caches "
                 f"{plural(heads, 'head')} (naive_* in the result)")


def explain_state(inp, state, notes):
    if not state["bytes_per_request"]:
        return
    lin = inp.model.linear
    notes.assume(f"recurrent state per request and GPU = {state['layers']} linear layers x (conv "
                 f"({state['conv_dim']} // TP) x (kernel - 1) {state['conv_dtype']} + SSM heads/TP "
                 f"x {lin.value_dim} x {lin.key_dim} {state['ssm_dtype']}) = "
                 f"{fmt_int(state['bytes_per_request'])} bytes")


def explain_engine(inp, state, notes):
    model, memory, page = inp.model, inp.memory, inp.page_size
    if memory.pool_gib is None:
        return
    if inp.engine == "sglang":
        notes.assume("max tokens follow SGLang: int(pool_GiB x 2^30) // bytes_per_token, "
                     f"aligned down to page_size {page}")
        if state["bytes_per_request"]:
            ratio = inp.mamba_ratio
            notes.assume(f"SGLang splits the pool: state slots get mamba_full_memory_ratio / "
                         f"(1 + ratio) = {ratio}/{1 + ratio} of it (handle_max_mamba_cache), KV "
                         "the rest; 'all memory to KV' is the figure without state")
        if model.count("sliding") and model.count("full"):
            notes.assume("SGLang hybrid SWA pool: tokens profiled over all layers, then split so "
                         f"sliding layers get swa_full_tokens_ratio {SGLANG_SWA_FULL_TOKENS_RATIO}"
                         " x the full layers' tokens (set_num_tokens_hybrid_swa)")
    else:
        notes.assume(f"max tokens follow vLLM: pool // (block_size {page} x per-layer bytes) // "
                     f"layers blocks of {page} tokens (get_num_blocks)")
        if state["bytes_per_request"] or model.count("sliding"):
            notes.warn("engine-approximation",
                       "vLLM shares one block pool between full-attention KV, sliding windows "
                       "and recurrent states; max_tokens here gives the whole pool to the full-"
                       "attention layers, and shared_pool_concurrent_requests charges each "
                       "request its fixed bytes; vLLM's own 'GPU KV cache size' line differs by "
                       "version")
    notes.assume("concurrent requests = max_tokens / context, for contexts "
                 f"{', '.join(fmt_int(c) for c in inp.contexts)}")


def explain_state_slots(inp, state, kv, notes):
    if inp.engine != "sglang" or not state["bytes_per_request"] or inp.memory.pool_gib is None:
        return
    for name, entry in kv.items():
        split = entry.get("engine_split")
        if not split:
            continue
        cap = split["max_running_requests"]
        for c, n in entry["concurrent_requests"].items():
            if n > cap:
                notes.warn("state-slots-limit",
                           f"{name}: at {fmt_int(c)}-token contexts the KV fits {n:.2f} requests "
                           f"but SGLang runs at most {cap} ({split['state_slots']} state slots "
                           f"// {SGLANG_STATE_SLOTS_PER_REQUEST})")


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
# Putting it together


def compute(params):
    """The whole calculation: returns the result document (the fixed keys plus detail)."""
    notes = Notes()
    inp = gather_inputs(params, notes)
    model, tp = inp.model, inp.tp
    explain_auto(inp, notes)
    explain_fp8_scales(inp, notes)
    explain_layers(model, tp, notes)
    if model.count("full") == 0 and model.count("sliding"):
        # Every layer is sliding-window: the engines allocate them a per-token pool.
        model.layer_kinds = ["full" if k == "sliding" else k for k in model.layer_kinds]
        notes.assume("no full-attention layers: the sliding-window layers are sized as a "
                     "per-token pool, as the engines allocate them")
    if not model.count("full"):
        notes.warn("no-per-token-layers", "no layer caches K/V per token (only recurrent "
                   "state): max tokens are not computed")

    state = recurrent_state(model, tp, inp.ssm_dtype)
    inp.memory = resolve_memory(params, inp.source, inp.weights, inp.engine, tp)
    kv = {name: kv_entry(inp, dtype, state) for name, dtype in inp.dtypes.items()}
    calibration = None
    if params["calibrate_log"]:
        text = read_calibration_text(params["calibrate_log"])
        observed = parse_calibration(text, inp.page_size)
        calibration = calibrate(observed, kv) if observed is not None else None

    explain_memory(inp.memory, notes)
    explain_pool(inp.memory, notes)
    explain_naive(model, tp, kv, notes)
    if inp.memory.source == "given":
        pool = inp.memory.pool_gib
        notes.assume(f"KV pool per GPU = kv_memory_gib = {pool} GiB = int({pool} x 2^30) = "
                     f"{fmt_int(inp.memory.pool_bytes)} bytes (given)")
    explain_state(inp, state, notes)
    explain_engine(inp, state, notes)
    explain_state_slots(inp, state, kv, notes)
    if params["calibrate_log"] and calibration is None:
        notes.warn("calibration-unparsed",
                   "calibrate_log has neither SGLang's 'KV Cache is allocated. #tokens: N, "
                   "K size: X GB, V size: Y GB' nor vLLM's 'GPU KV cache size: N tokens' line")
    elif calibration is not None:
        explain_calibration(calibration, inp.engine, notes)
    return result_document(inp, state, kv, calibration, notes)


def result_document(inp, state, kv, calibration, notes):
    model, tp = inp.model, inp.tp
    result = {
        "model": {"name": model.name, "source": inp.source.kind, "preset": inp.source.preset,
                  "architectures": model.architectures, "model_type": model.model_type,
                  "attention": model.attention, "torch_dtype": model.torch_dtype,
                  "max_position_embeddings": model.max_position_embeddings},
        "tp": tp,
        "engine": inp.engine,
        "page_size": inp.page_size,
        "layers": {"total": len(model.layer_kinds), "full_attention": model.count("full"),
                   "sliding_window": model.count("sliding"), "linear": model.count("linear")},
        "kv_heads_per_gpu": 1 if model.attention == "mla"
        else kv_heads_per_gpu(model.num_kv_heads, tp),
        "kv": kv,
        "state": state,
        "memory": inp.memory.to_json(),
        "contexts": inp.contexts,
    }
    if model.attention == "mha":
        result["kv_heads_total"] = model.num_kv_heads
        result["head_dim"] = model.head_dim
        result["v_head_dim"] = model.v_head_dim
    if model.sliding_window:
        result["sliding_window"] = model.sliding_window
    if calibration is not None:
        result["calibration"] = calibration
    result["warnings"] = notes.warnings
    result["assumptions"] = notes.assumptions
    return result


# ---------------------------------------------------------------------------------------
# The report


def render_report(result):
    m, layers, mem = result["model"], result["layers"], result["memory"]
    origin = f"preset {m['preset']}" if m["preset"] else m["source"]
    lines = [f"kv_calc: {m['name']} ({origin}) - TP {result['tp']} - engine {result['engine']}"]
    mla = " (MLA)" if m["attention"] == "mla" else ""
    parts = [f"{layers['full_attention']} full attention{mla}"]
    if layers["linear"]:
        parts.append(f"{layers['linear']} linear attention")
    if layers["sliding_window"]:
        parts.append(f"{layers['sliding_window']} sliding window "
                     f"({fmt_int(result['sliding_window'])} tokens)")
    lines.append(f"layers: {layers['total']} = {' + '.join(parts)}")
    if m["attention"] == "mla":
        lines.append("KV per GPU: one MLA latent per token and layer (not split by TP)")
    else:
        lines.append(f"KV heads per GPU: {result['kv_heads_per_gpu']} (of "
                     f"{result['kv_heads_total']}, TP {result['tp']})")
    if mem["pool_gib"] is not None:
        lines.append(f"KV pool per GPU: {mem['pool_gib']:.2f} GiB = {fmt_int(mem['pool_bytes'])} "
                     f"bytes ({mem['source']})")
    else:
        lines.append("KV pool per GPU: unknown (pass kv_memory_gib)")
    lines.append("")
    lines.extend(render_table(result, "max_tokens", "concurrent_requests"))
    if result["engine"] == "sglang" and result["state"]["bytes_per_request"] \
            and mem["pool_gib"] is not None:
        lines.append("")
        lines.append("all memory to KV (no recurrent-state slots):")
        lines.extend(render_table(result, "all_to_kv_tokens", "all_to_kv_concurrent_requests"))
    if any("shared_pool_concurrent_requests" in e for e in result["kv"].values()):
        lines.append("")
        lines.append("requests when each also takes its state / sliding window from the pool:")
        lines.extend(render_table(result, "max_tokens", "shared_pool_concurrent_requests"))
    lines.extend(render_state(result))
    lines.extend(render_sliding(result))
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
    lines = ["", f"recurrent state: {fmt_int(state['bytes_per_request'])} bytes/request per GPU "
             f"= conv {fmt_int(state['conv_bytes'])} ({state['conv_dtype']}) + SSM "
             f"{fmt_int(state['ssm_bytes'])} ({state['ssm_dtype']}), {state['layers']} linear "
             "layers"]
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


def render_sliding(result):
    if not result["layers"]["sliding_window"]:
        return []
    lines = [""]
    for name, entry in result["kv"].items():
        text = (f"sliding-window layers ({name}): "
                f"{fmt_num(entry['sliding_window_bytes_per_token'])} bytes/token, at most "
                f"{fmt_num(entry['sliding_window_bytes_per_request'])} bytes/request")
        swa = (entry.get("engine_split") or {}).get("swa_tokens")
        if swa is not None:
            text += f"; SGLang SWA pool {fmt_int(swa)} tokens"
        lines.append(text)
    return lines


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
    return ["", text]


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
            f"keys: {', '.join(PARAM_TYPES)}\n"
            f"presets: {', '.join(sorted(PRESETS))}\n")


def main(argv=None, environ=None):
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage())
        return 0
    try:
        params = load_params(environ, argv)
        result = compute(params)
    except InputError as e:
        sys.stderr.write(f"kv_calc: error: {e}\n")
        if not environ.get("FERRY_PARAMS"):
            sys.stderr.write(usage())
        return 2
    sys.stdout.write(render_report(result))
    result_path = environ.get("FERRY_RESULT")
    if result_path:
        write_result(result_path, result)
    return 0


# ---------------------------------------------------------------------------------------
# Presets: the fields of each model's config.json that the arithmetic reads, with the values
# of the official Hugging Face checkpoints. weights_gib is approximate (the official
# checkpoint's size) and only used when memory is probed without a model_dir.

PRESETS = {
    "qwen3.5-397b-a17b": {
        "name": "Qwen/Qwen3.5-397B-A17B",
        "weights_gib": 739.0,  # 397B params x 2 bytes (BF16)
        "config": {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
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
            "max_position_embeddings": 131072,
            "quantization_config": {"quant_method": "mxfp4"},
        },
    },
}


def find_preset(name):
    """Case-insensitive; a Hugging Face "org/" prefix and an "-Instruct" suffix are ignored."""
    key = name.strip().lower().split("/")[-1]
    for candidate in (key, re.sub(r"-instruct(-\d+)?$", "", key)):
        if candidate in PRESETS:
            return candidate
    raise InputError(f"model: unknown preset '{name}'; presets: {', '.join(sorted(PRESETS))}")


if __name__ == "__main__":
    sys.exit(main())
