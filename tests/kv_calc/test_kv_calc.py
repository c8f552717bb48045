"""Unit tests for jobs/kv_calc.py: the arithmetic against the reference figures of issue 3,
the warnings, the config readers, memory probing with a fake nvidia-smi, calibration, and the
job run end to end as ferry runs it (FERRY_PARAMS / FERRY_RESULT); then (issue 15) each
family's rule against figures from the engines' code or published engine logs, the loud
failure on unknown layer kinds, the per-kind breakdown and the planner (mode=plan).

Run: cd tests/kv_calc && python3 -m unittest -v
"""

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

# Importing the job must not leave jobs/__pycache__ behind: jobs/ is embedded file by file.
sys.dont_write_bytecode = True

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = REPO / "jobs" / "kv_calc.py"
FIXTURES = HERE / "fixtures"
CKPT = FIXTURES / "qwen35-ckpt"
GIB = 1 << 30


def load_job():
    # Any failure here is an import error of the whole test module: ctest reports it as a
    # failure, never as a skip.
    spec = importlib.util.spec_from_file_location("kv_calc", str(JOB))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kv_calc = load_job()
sys.path.insert(0, str(FIXTURES))
import make_safetensors  # noqa: E402  (fixture writer, shared with the checked-in shards)


def fixture_config(name):
    return json.loads((FIXTURES / "configs" / (name + ".json")).read_text())


def params(**overrides):
    p = {key: default for key, (_, default) in kv_calc.PARAM_TYPES.items()}
    p.update(overrides)
    return kv_calc.check_params(p)


def run(**overrides):
    """compute() with nvidia-smi kept out of reach unless a test puts one on PATH."""
    with mock.patch.dict(os.environ, {"PATH": os.environ.get("KV_TEST_PATH", "/nonexistent")}):
        return kv_calc.compute(params(**overrides))


def codes(result):
    return [w["code"] for w in result["warnings"]]


def seed(**overrides):
    """The seed deployment: Qwen3.5-397B-A17B, TP 8, 17.4 GiB per GPU for the cache."""
    base = dict(config=fixture_config("qwen3.5-397b-a17b"), tp=8, kv_memory_gib=17.4,
                kv_dtype=["bf16", "fp8_e4m3", "nvfp4"])
    base.update(overrides)
    return run(**base)


class SeedDeploymentFigures(unittest.TestCase):
    """Issue 3, "Reference figures": Qwen3.5-397B-A17B with TP 8."""

    @classmethod
    def setUpClass(cls):
        cls.r = seed()

    def test_layers(self):
        self.assertEqual(self.r["layers"], {"total": 60, "full_attention": 15,
                                            "sliding_window": 0, "linear": 45})

    def test_one_kv_head_per_gpu(self):
        self.assertEqual(self.r["kv_heads_per_gpu"], 1)

    def test_bytes_per_token(self):
        kv = self.r["kv"]
        self.assertEqual(kv["fp8_e4m3"]["bytes_per_token"], 7680)
        self.assertEqual(kv["bf16"]["bytes_per_token"], 15360)
        self.assertEqual(kv["nvfp4"]["bytes_per_token"], 4320)

    def test_recurrent_state(self):
        state = self.r["state"]
        self.assertEqual(state["conv_bytes"], 414720)
        self.assertEqual(state["ssm_bytes"], 23592960)
        self.assertEqual(state["bytes_per_request"], 24007680)

    def test_pool_bytes(self):
        # SGLang turns GiB into bytes with int(rest_memory * (1 << 30)).
        self.assertEqual(self.r["memory"]["pool_bytes"], int(17.4 * GIB))
        self.assertEqual(self.r["memory"]["pool_bytes"], 18683107737)

    def test_all_memory_to_kv(self):
        kv = self.r["kv"]
        self.assertEqual(kv["fp8_e4m3"]["all_to_kv_tokens"], 2432696)
        self.assertEqual(kv["bf16"]["all_to_kv_tokens"], 1216348)
        self.assertEqual(kv["bf16"]["all_to_kv_concurrent_requests"]["262144"], 4.64)

    def test_sglang_split_is_max_tokens(self):
        kv = self.r["kv"]
        self.assertEqual(kv["fp8_e4m3"]["engine_split"]["state_slots"], 368)
        self.assertEqual(kv["bf16"]["engine_split"]["state_slots"], 368)
        self.assertEqual(kv["fp8_e4m3"]["max_tokens"], 1282328)
        self.assertEqual(kv["bf16"]["max_tokens"], 641164)
        self.assertEqual(kv["bf16"]["concurrent_requests"]["262144"], 2.45)

    def test_naive_figures_are_explained_away(self):
        kv = self.r["kv"]
        self.assertEqual(kv["fp8_e4m3"]["naive_bytes_per_token"], 15360)
        self.assertEqual(kv["bf16"]["naive_bytes_per_token"], 30720)
        self.assertEqual(kv["fp8_e4m3"]["naive_max_tokens"], 1216348)  # "1.22M"
        self.assertEqual(kv["bf16"]["naive_max_tokens"], 608174)  # "608K"
        naive = [a for a in self.r["assumptions"] if "on every GPU" in a]
        self.assertEqual(len(naive), 1)
        self.assertIn("1,216,348", naive[0])
        self.assertIn("608,174", naive[0])

    def test_default_contexts(self):
        self.assertEqual(self.r["contexts"], [32768, 131072, 262144])
        self.assertEqual(sorted(self.r["kv"]["bf16"]["concurrent_requests"]),
                         ["131072", "262144", "32768"])

    def test_layer_types_and_interval_agree(self):
        # The preset has only full_attention_interval; the fixture also has layer_types.
        preset = run(model="qwen3.5-397b-a17b", tp=8, kv_memory_gib=17.4)
        self.assertEqual(preset["layers"], self.r["layers"])
        self.assertEqual(preset["kv"]["fp8_e4m3"]["max_tokens"], 1282328)


class SglangArithmetic(unittest.TestCase):
    """The engine's own integer steps, one at a time."""

    def test_state_split(self):
        slots, rest_gib = kv_calc.sglang_state_split(17.4, 24007680, 0.9)
        self.assertEqual(slots, 368)  # int(17.4 * 0.9 / 1.9 GiB // 24,007,680)
        self.assertEqual(kv_calc.sglang_tokens(rest_gib, 7680, 1), 1282328)

    def test_page_alignment(self):
        self.assertEqual(kv_calc.sglang_tokens(17.4, 7680, 64), 2432696 // 64 * 64)

    def test_vllm_blocks(self):
        # 1 GiB, 1024 bytes per token and layer, 4 layers, blocks of 16 tokens.
        self.assertEqual(kv_calc.vllm_tokens(GIB, 1024, 4, 16), GIB // (16 * 1024) // 4 * 16)

    def test_kv_heads_per_gpu(self):
        self.assertEqual(kv_calc.kv_heads_per_gpu(2, 8), 1)
        self.assertEqual(kv_calc.kv_heads_per_gpu(8, 2), 4)
        self.assertEqual(kv_calc.kv_heads_per_gpu(8, 8), 1)

    def test_mamba_ratio_parameter(self):
        r = seed(mamba_full_memory_ratio=0.5, kv_dtype=["fp8_e4m3"])
        slots = int((17.4 * 0.5 / 1.5 * GIB) // 24007680)
        self.assertEqual(r["kv"]["fp8_e4m3"]["engine_split"]["state_slots"], slots)


class OtherReferenceModels(unittest.TestCase):

    def test_llama_8b_tp1_bf16(self):
        r = run(config=fixture_config("llama-3.1-8b"), tp=1, kv_dtype=["bf16"])
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 131072)
        self.assertEqual(r["layers"]["full_attention"], 32)
        self.assertEqual(r["kv_heads_per_gpu"], 8)
        self.assertEqual(r["state"]["bytes_per_request"], 0)
        self.assertTrue(any("head_dim = hidden_size / num_attention_heads" in a
                            for a in r["assumptions"]))

    def test_deepseek_v3_tp8(self):
        r = run(config=fixture_config("deepseek-v3"), tp=8)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 70272)
        self.assertEqual(r["kv"]["fp8_e4m3"]["bytes_per_token"], 35136)
        self.assertEqual(r["model"]["attention"], "mla")
        self.assertEqual(r["layers"]["full_attention"], 61)

    def test_mla_not_divided_by_tp(self):
        for tp in (1, 2, 8, 16):
            r = run(config=fixture_config("deepseek-v3"), tp=tp, kv_dtype=["bf16"])
            self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 70272, tp)
            self.assertNotIn("kv-heads-replicated", codes(r))
            self.assertNotIn("naive_bytes_per_token", r["kv"]["bf16"])

    def test_mla_nvfp4_matches_sglang_cell_size(self):
        # SGLang: cell // 2 + (kv_lora_rank + rope) // 16 * layers
        r = run(model="deepseek-v3", kv_dtype=["nvfp4"])
        self.assertEqual(r["kv"]["nvfp4"]["bytes_per_token"], 576 // 2 * 61 + 576 // 16 * 61)

    def test_presets_match_fixtures(self):
        for name in ("llama-3.1-8b", "deepseek-v3", "qwen3.5-397b-a17b"):
            a = run(model=name, tp=8)
            b = run(config=fixture_config(name), tp=8)
            self.assertEqual(a["kv"], b["kv"], name)
            self.assertEqual(a["layers"], b["layers"], name)

    def test_all_presets_load(self):
        for name in kv_calc.PRESETS:
            # SGLang has no MiniMax lightning-attention model: that preset is vLLM-only.
            engine = "vllm" if name == "minimax-text-01" else "sglang"
            r = run(model=name, tp=8, kv_memory_gib=40.0, engine=engine)
            self.assertGreater(r["kv"]["bf16"]["max_tokens"], 0, name)

    def test_preset_names_case_insensitive(self):
        r = run(model="Qwen/Qwen3.5-397B-A17B", tp=8)
        self.assertEqual(r["model"]["preset"], "qwen3.5-397b-a17b")
        self.assertEqual(run(model="LLAMA-3.1-8B-Instruct")["model"]["preset"], "llama-3.1-8b")

    def test_qwen3_next(self):
        r = run(model="qwen3-next-80b-a3b", tp=4, kv_dtype=["bf16"])
        self.assertEqual(r["layers"]["full_attention"], 12)
        self.assertEqual(r["layers"]["linear"], 36)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 12 * 1 * 512 * 2)
        conv = (16 * 128 * 2 + 32 * 128) // 4 * 3 * 2
        ssm = 32 // 4 * 128 * 128 * 4
        self.assertEqual(r["state"]["bytes_per_request"], 36 * (conv + ssm))

    def test_recurrent_only_model(self):
        cfg = {"num_hidden_layers": 4, "layer_types": ["linear_attention"] * 4,
               "torch_dtype": "bfloat16", "num_attention_heads": 8, "head_dim": 64,
               "linear_num_key_heads": 4, "linear_key_head_dim": 64,
               "linear_num_value_heads": 8, "linear_value_head_dim": 64,
               "linear_conv_kernel_dim": 4, "max_position_embeddings": 8192}
        r = run(config=cfg, kv_memory_gib=10.0)
        self.assertIn("no-per-token-layers", codes(r))
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 0)
        self.assertIsNone(r["kv"]["bf16"]["max_tokens"])
        self.assertGreater(r["state"]["bytes_per_request"], 0)

    def test_ssm_dtype(self):
        r = seed(ssm_dtype="bfloat16")
        self.assertEqual(r["state"]["ssm_bytes"], 23592960 // 2)
        self.assertEqual(r["state"]["conv_bytes"], 414720)


class SlidingWindow(unittest.TestCase):

    def test_gpt_oss_layers_reported_apart(self):
        r = run(model="gpt-oss-120b", tp=1, kv_dtype=["bf16"], kv_memory_gib=40.0)
        self.assertEqual(r["layers"], {"total": 36, "full_attention": 18, "sliding_window": 18,
                                       "linear": 0})
        kv = r["kv"]["bf16"]
        self.assertEqual(kv["bytes_per_token"], 18 * 8 * 128 * 2)  # full layers only
        self.assertEqual(kv["sliding_window_bytes_per_token"], 18 * 8 * 128 * 2)
        self.assertEqual(kv["sliding_window_bytes_per_request"], 128 * 18 * 8 * 128 * 2)
        self.assertEqual(r["sliding_window"], 128)

    def test_gpt_oss_sglang_swa_pool(self):
        r = run(model="gpt-oss-120b", tp=1, kv_dtype=["bf16"], kv_memory_gib=40.0)
        # profile over all 36 layers, then set_num_tokens_hybrid_swa with ratio 0.8
        all_layers = int(40.0 * GIB) // (36 * 8 * 128 * 2)
        full = int(all_layers * 36 / (0.8 * 18 + 18))
        self.assertEqual(r["kv"]["bf16"]["max_tokens"], full)
        self.assertEqual(r["kv"]["bf16"]["engine_split"]["swa_tokens"], int(full * 0.8))

    def test_gpt_oss_vllm_hybrid_groups(self):
        """vLLM kv_cache_utils @001cabc1 _get_kv_cache_groups_uniform_page_size: 18 full + 18
        sliding layers with equal pages -> group_size 18, two KV cache groups sharing one block
        pool; get_num_blocks = pool // page // 18; _report_kv_cache_config logs num_blocks // 2
        x 16 tokens; a request holds cdiv(context, 16) full blocks plus cdiv(min(128 - 1 + 8192,
        context), 16) + 1 sliding blocks (SlidingWindowSpec.max_memory_usage_bytes)."""
        r = run(model="gpt-oss-120b", tp=1, kv_dtype=["bf16"], kv_memory_gib=40.0,
                engine="vllm")
        kv = r["kv"]["bf16"]
        page = 16 * 8 * 128 * 2
        num_blocks = int(40.0 * GIB) // page // 18
        self.assertEqual(kv["engine_split"]["num_blocks"], num_blocks)
        self.assertEqual(kv["max_tokens"], num_blocks // 2 * 16)
        per_request = 131072 // 16 + (-(-(127 + 8192) // 16) + 1)
        self.assertEqual(kv["engine_split"]["blocks_per_request"]["131072"], per_request)
        self.assertEqual(kv["concurrent_requests"]["131072"], round(num_blocks / per_request, 2))
        self.assertNotIn("engine-approximation", codes(r))

    def test_sliding_window_pattern(self):
        cfg = dict(num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=64, sliding_window=1024, sliding_window_pattern=6,
                   max_position_embeddings=131072, torch_dtype="bfloat16")
        r = run(config=cfg)
        self.assertEqual(r["layers"]["full_attention"], 2)
        self.assertEqual(r["layers"]["sliding_window"], 10)


class ConfigReading(unittest.TestCase):

    def test_text_config_wrapper(self):
        inner = fixture_config("llama-3.1-8b")
        del inner["torch_dtype"]
        wrapped = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16",
                   "text_config": inner, "vision_config": {"num_hidden_layers": 99}}
        r = run(config=wrapped, kv_dtype=["auto"])
        self.assertEqual(r["layers"]["total"], 32)
        self.assertEqual(r["kv"]["auto"]["dtype"], "fp16")  # top-level dtype as fallback
        self.assertEqual(r["kv"]["auto"]["bytes_per_token"], 131072)

    def test_auto_from_hf_quant_config(self):
        r = run(model_dir=str(CKPT), tp=8, kv_dtype=["auto"])
        self.assertEqual(r["kv"]["auto"]["dtype"], "fp8_e4m3")
        self.assertEqual(r["kv"]["auto"]["bytes_per_token"], 7680)
        self.assertTrue(any("hf_quant_config.json" in a for a in r["assumptions"]))

    def test_auto_from_quantization_config(self):
        cfg = fixture_config("llama-3.1-8b")
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8",
                                      "kv_cache_quant_algo": "FP8"}
        r = run(config=cfg, kv_dtype=["auto"])
        self.assertEqual(r["kv"]["auto"]["dtype"], "fp8_e4m3")
        self.assertEqual(r["kv"]["auto"]["bytes_per_token"], 65536)

    def test_auto_from_compressed_tensors_kv_scheme(self):
        cfg = fixture_config("llama-3.1-8b")
        cfg["quantization_config"] = {"quant_method": "compressed-tensors",
                                      "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
        self.assertEqual(run(config=cfg, kv_dtype=["auto"])["kv"]["auto"]["dtype"], "fp8_e4m3")

    def test_auto_fp8_weights_do_not_mean_fp8_kv(self):
        r = run(config=fixture_config("deepseek-v3"), kv_dtype=["auto"])
        self.assertEqual(r["kv"]["auto"]["dtype"], "bf16")

    def test_config_as_path(self):
        path = str(FIXTURES / "configs" / "llama-3.1-8b.json")
        self.assertEqual(run(config=path)["kv"]["bf16"]["bytes_per_token"], 131072)

    def test_missing_kv_heads_warns_with_default(self):
        cfg = fixture_config("llama-3.1-8b")
        del cfg["num_key_value_heads"]
        r = run(config=cfg)
        missing = [w for w in r["warnings"] if w["code"] == "config-field-missing"]
        self.assertTrue(any("num_key_value_heads" in w["message"] and "32" in w["message"]
                            for w in missing))
        self.assertEqual(r["kv_heads_per_gpu"], 32)

    def test_missing_max_position_embeddings(self):
        cfg = fixture_config("llama-3.1-8b")
        del cfg["max_position_embeddings"]
        r = run(config=cfg)
        self.assertIn("config-field-missing", codes(r))
        self.assertEqual(r["contexts"], [32768, 131072])

    def test_missing_conv_kernel_defaults_to_4(self):
        cfg = fixture_config("qwen3.5-397b-a17b")
        del cfg["text_config"]["linear_conv_kernel_dim"]
        r = run(config=cfg, tp=8)
        self.assertTrue(any("linear_conv_kernel_dim" in w["message"] for w in r["warnings"]))
        self.assertEqual(r["state"]["conv_bytes"], 414720)

    def test_contexts_given(self):
        r = seed(context=[4096, 1000000, 4096])
        self.assertEqual(r["contexts"], [4096, 1000000])
        self.assertEqual(r["kv"]["bf16"]["concurrent_requests"]["4096"],
                         round(641164 / 4096, 2))


class Warnings(unittest.TestCase):

    def test_kv_heads_replicated(self):
        self.assertIn("kv-heads-replicated", codes(seed()))
        self.assertIn("kv-heads-replicated", codes(run(model="llama-3.1-70b", tp=16)))
        self.assertNotIn("kv-heads-replicated", codes(run(model="llama-3.1-70b", tp=8)))

    def test_fp8_no_scales_from_checkpoint(self):
        r = run(model_dir=str(CKPT), tp=8, kv_dtype=["fp8_e4m3"])
        w = [w for w in r["warnings"] if w["code"] == "fp8-kv-no-scales"]
        self.assertEqual(len(w), 1)
        self.assertIn("2 *.safetensors files", w[0]["message"])

    def test_fp8_implied_by_checkpoint(self):
        # Only bf16 asked for, but the checkpoint says its KV cache is FP8.
        r = run(model_dir=str(CKPT), tp=8, kv_dtype=["bf16"])
        self.assertIn("fp8-kv-no-scales", codes(r))

    def test_no_fp8_no_warning(self):
        r = run(model="llama-3.1-8b", kv_dtype=["bf16"])
        self.assertNotIn("fp8-kv-no-scales", codes(r))

    def test_scales_present_no_warning(self):
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp)
            (ckpt / "config.json").write_text((CKPT / "config.json").read_text())
            make_safetensors.write_file(ckpt / "model.safetensors", {
                "model.layers.3.self_attn.k_proj.weight": ("F8_E4M3", (4, 8)),
                "model.layers.3.self_attn.k_proj.k_scale": ("F32", ()),
                "model.layers.3.self_attn.v_proj.v_scale": ("F32", ()),
            })
            r = run(model_dir=str(ckpt), tp=8, kv_dtype=["fp8_e4m3"])
        self.assertNotIn("fp8-kv-no-scales", codes(r))

    def test_warnings_shape(self):
        for w in seed()["warnings"]:
            self.assertEqual(sorted(w), ["code", "message"])

    def test_state_slots_limit(self):
        r = seed(context=[1024], kv_dtype=["fp8_e4m3"])
        self.assertIn("state-slots-limit", codes(r))
        self.assertEqual(r["kv"]["fp8_e4m3"]["engine_split"]["max_running_requests"], 368 // 3)


class ProbedMemory(unittest.TestCase):
    """nvidia-smi is a fake script first on PATH; weights come from the fixture shards."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = Path(self.tmp.name)
        self.csv = FIXTURES / "nvidia-smi-h200x8.csv"
        self.fake_smi(self.csv.read_text())

    def tearDown(self):
        self.tmp.cleanup()

    def fake_smi(self, output):
        (self.bin / "out.csv").write_text(output)
        script = self.bin / "nvidia-smi"
        script.write_text(
            "#!/bin/sh\n"
            "# refuse anything but the query kv_calc is meant to send\n"
            '[ "$1" = "--query-gpu=index,name,memory.total,memory.used,memory.free" ] || exit 9\n'
            '[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
            'cat "$(dirname "$0")/out.csv"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def probe(self, **overrides):
        with mock.patch.dict(os.environ, {"KV_TEST_PATH": str(self.bin) + os.pathsep + "/bin"}):
            return run(**overrides)

    def shard_data_bytes(self):
        total = 0
        for path in sorted(CKPT.glob("*.safetensors")):
            length, _ = kv_calc.read_safetensors_header(path)
            total += path.stat().st_size - 8 - length
        return total

    def test_parse_csv(self):
        gpus = kv_calc.parse_nvidia_smi(self.csv.read_text())
        self.assertEqual(len(gpus), 8)
        self.assertEqual(gpus[0], {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771,
                                   "memory_used_mib": 1, "memory_free_mib": 143195})

    def test_pool_from_probe_and_safetensors(self):
        r = self.probe(model_dir=str(CKPT), tp=8, mem_fraction=0.9)
        mem = r["memory"]
        weights = self.shard_data_bytes()
        self.assertEqual(mem["source"], "probed")
        self.assertEqual(mem["gpu_total_mib"], 143771)
        self.assertEqual(mem["weights_bytes"], weights)
        self.assertTrue(mem["weights_source"].startswith("probed: tensor data of 2 *.safetensors"))
        self.assertEqual(mem["activation_reserve_gib"], 0.0)
        pool_gib = 143771 / 1024 * 0.9 - weights / 8 / GIB - 0.0
        self.assertEqual(mem["pool_gib"], pool_gib)
        slots, rest = kv_calc.sglang_state_split(pool_gib, 24007680, 0.9)
        self.assertEqual(r["kv"]["fp8_e4m3"]["max_tokens"], int(rest * GIB) // 7680)
        line = [a for a in r["assumptions"] if a.startswith("KV pool per GPU")][0]
        self.assertIn("143,771 MiB (probed)", line)
        self.assertIn("assumed (sglang default)", line)

    def test_engine_default_mem_fraction_when_probing(self):
        """No mem_fraction: SGLang's own default for 8 x H200 (143,771 MiB) at TP 8,
        round((143,771 - 14,848) / 143,771, 3) = 0.897 (ServerArgs._handle_gpu_memory_settings),
        lowered for the checkpoint's vision encoder (adjust_mem_fraction_for_vlm); vLLM's
        --gpu-memory-utilization 0.9."""
        vision = json.loads((CKPT / "config.json").read_text())["vision_config"]
        fraction = sglang_default_fraction(143771, 8, vision=vision)
        self.assertAlmostEqual(fraction / 0.897, 0.95 * (1 - 0.1 * (1152 ** 2 / 1024 ** 2 - 1)))
        r = self.probe(model_dir=str(CKPT), tp=8)
        self.assertAlmostEqual(r["memory"]["mem_fraction"], fraction, 12)
        self.assertIn("= 0.897", r["memory"]["mem_fraction_source"])
        weights = self.shard_data_bytes()
        self.assertAlmostEqual(r["memory"]["pool_gib"],
                               143771 / 1024 * fraction - weights / 8 / GIB, 9)
        r = self.probe(model_dir=str(CKPT), tp=8, engine="vllm")
        self.assertEqual(r["memory"]["mem_fraction"], 0.9)

    def test_weights_given_and_vllm_reserve(self):
        r = self.probe(model_dir=str(CKPT), tp=8, weights_gib=400.0, engine="vllm")
        mem = r["memory"]
        self.assertEqual(mem["weights_source"], "given")
        self.assertEqual(mem["activation_reserve_gib"], 2.0)
        self.assertAlmostEqual(mem["pool_gib"], 143771 / 1024 * 0.9 - 50.0 - 2.0)

    def test_preset_weights_are_assumed(self):
        r = self.probe(model="llama-3.1-8b")
        self.assertTrue(r["memory"]["weights_source"].startswith("assumed"))
        self.assertGreater(r["kv"]["bf16"]["max_tokens"], 0)

    def test_memory_in_use_and_too_few_gpus(self):
        self.fake_smi("0, NVIDIA H200, 143771, 70000, 73771\n1, NVIDIA H200, 143771, 1, 143770\n")
        r = self.probe(model_dir=str(CKPT), tp=4)
        self.assertIn("gpu-memory-in-use", codes(r))
        self.assertIn("gpu-count-below-tp", codes(r))

    def test_no_nvidia_smi(self):
        r = run(model_dir=str(CKPT), tp=8)
        self.assertEqual(r["memory"]["source"], "unknown")
        self.assertIn("memory-unknown", codes(r))
        self.assertIsNone(r["kv"]["bf16"]["max_tokens"])
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 15360)

    def test_config_without_weights(self):
        r = self.probe(config=fixture_config("llama-3.1-8b"))
        self.assertEqual(r["memory"]["source"], "unknown")
        self.assertIn("memory-unknown", codes(r))


class Calibration(unittest.TestCase):

    SGLANG = ("[2026-11-29 10:00:00 TP0] KV Cache is allocated. #tokens: 1282328, "
              "K size: 4.59 GB, V size: 4.59 GB\n"
              "[2026-11-29 10:00:00 TP0] Mamba Cache is allocated. max_mamba_cache_size: 368, "
              "conv_state size: 0.14GB, ssm_state size: 8.09GB\n")
    VLLM = ("INFO 11-29 10:00:00 [gpu_worker.py:298] Available KV cache memory: 12.49 GiB\n"
            "INFO 11-29 10:00:01 [kv_cache_utils.py:1087] GPU KV cache size: 102,304 tokens\n")

    def test_sglang_line(self):
        r = seed(calibrate_log=self.SGLANG, kv_dtype=["bf16", "fp8_e4m3"])
        cal = r["calibration"]
        self.assertEqual(cal["engine"], "sglang")
        self.assertEqual(cal["tokens"], 1282328)
        self.assertEqual(cal["pool_slots"], 1282329)  # N + page_size
        self.assertEqual(cal["bytes_per_token"], (4.59 + 4.59) * GIB / 1282329)
        self.assertEqual(cal["closest_dtype"], "fp8_e4m3")
        self.assertEqual(cal["modelled_bytes_per_token"], 7680)
        self.assertAlmostEqual(cal["bytes_per_token_ratio"], 1.0, delta=0.002)
        self.assertEqual(cal["tokens_ratio"], 1.0)
        self.assertEqual(cal["state_slots"], 368)
        self.assertEqual(cal["modelled_state_slots"], 368)
        self.assertNotIn("calibration-mismatch", codes(r))

    def test_vllm_lines(self):
        r = run(config=fixture_config("llama-3.1-8b"), engine="vllm", kv_dtype=["bf16"],
                kv_memory_gib=12.49, calibrate_log=self.VLLM)
        cal = r["calibration"]
        self.assertEqual(cal["engine"], "vllm")
        self.assertEqual(cal["tokens"], 102304)
        self.assertEqual(cal["kv_gib"], 12.49)
        self.assertEqual(cal["bytes_per_token"], 12.49 * GIB / 102304)
        self.assertEqual(cal["closest_dtype"], "bf16")
        # vLLM: int(12.49 GiB) // (16 x 4,096 bytes per block and layer) // 32 layers x 16
        self.assertEqual(r["kv"]["bf16"]["max_tokens"], 102304)
        self.assertEqual(cal["tokens_ratio"], 1.0)

    def test_log_file_path(self):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write("noise\n" + self.SGLANG + "more noise\n")
        try:
            r = seed(calibrate_log=f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(r["calibration"]["tokens"], 1282328)

    def test_mismatch_warns(self):
        line = "KV Cache is allocated. #tokens: 1282328, K size: 9.18 GB, V size: 9.18 GB"
        r = seed(calibrate_log=line, kv_dtype=["fp8_e4m3"])
        self.assertIn("calibration-mismatch", codes(r))

    def test_unparsed_warns(self):
        r = seed(calibrate_log="server started")
        self.assertIn("calibration-unparsed", codes(r))
        self.assertNotIn("calibration", r)


class Errors(unittest.TestCase):

    def assert_input_error(self, fragment, **overrides):
        with self.assertRaises(kv_calc.InputError) as caught:
            run(**overrides)
        self.assertIn(fragment, str(caught.exception))

    def test_no_model(self):
        self.assert_input_error("no model given")

    def test_unknown_preset(self):
        self.assert_input_error("unknown preset 'gpt-5'", model="gpt-5")

    def test_two_sources(self):
        self.assert_input_error("give one of", model="llama-3.1-8b", model_dir=str(CKPT))

    def test_model_dir_missing(self):
        self.assert_input_error("is not a directory", model_dir="/nonexistent/ckpt")

    def test_unreadable_config(self):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text("{ not json")
            self.assert_input_error("is not valid JSON", model_dir=tmp)

    def test_no_config_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assert_input_error("config.json", model_dir=tmp)

    def test_missing_critical_field(self):
        cfg = fixture_config("llama-3.1-8b")
        del cfg["num_hidden_layers"]
        self.assert_input_error("num_hidden_layers", config=cfg)

    def test_bad_params(self):
        with self.assertRaises(kv_calc.InputError):
            params(tp=0)
        with self.assertRaises(kv_calc.InputError):
            params(kv_dtype=["int4"])
        with self.assertRaises(kv_calc.InputError):
            params(mem_fraction=1.5)


def cdiv(a, b):
    return -(-a // b)


def warning_text(result, code):
    return " ".join(w["message"] for w in result["warnings"] if w["code"] == code)


class DsaSparseAttention(unittest.TestCase):
    """DeepSeek-V3.2 (DSA): the indexer key cache and the FP8 MLA row with scales (issue 15).
    Per token and layer, from the engines' code:
    - vLLM v1/kv_cache_interface.py @001cabc1 MLAAttentionSpec.real_page_size_bytes:
      cache_dtype_str "fp8_ds_mla" -> block_size * 656 (512 FP8 + 4 x 4-byte scales + 64 x 2 rope)
    - vLLM models/deepseek_v2.py @002d6073 Indexer: DeepseekV32IndexerCache(head_dim=128 +
      128 // 128 * 4, dtype=uint8) -> 132 bytes
    - SGLang model_runner_kv_cache_mixin.py @001ccef0 calculate_mla_kv_cache_dim (the same 656
      for FP8 unless the NSA backend is trtllm) and get_cell_size_per_token (profiles the plain
      576-byte row + the 132-byte indexer key)."""

    def setUp(self):
        self.cfg = fixture_config("deepseek-v3.2-exp")

    def test_bytes_per_token_fp8_and_bf16(self):
        r = run(config=self.cfg, tp=8, engine="vllm", kv_dtype=["fp8_e4m3", "bf16"],
                kv_memory_gib=40.0)
        self.assertEqual(r["model"]["sparse_attention"], "dsa")
        self.assertEqual(r["kv"]["fp8_e4m3"]["bytes_per_token"], 61 * (656 + 132))  # 48,068
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 61 * (576 * 2 + 132))  # 78,324
        # The plain 576-byte row without the indexer is 27 % low at FP8, 10 % low at bf16.
        plain = run(model="deepseek-v3", tp=8, kv_dtype=["fp8_e4m3", "bf16"])["kv"]
        self.assertAlmostEqual(plain["fp8_e4m3"]["bytes_per_token"] / (61 * 788), 0.731, 3)
        self.assertAlmostEqual(plain["bf16"]["bytes_per_token"] / (61 * 1284), 0.897, 3)
        full = [k for k in r["kinds"] if k["kind"] == "full_attention"][0]
        self.assertEqual(full["row"]["fp8_e4m3"], {"mla_row": 656, "indexer_key": 132})

    def test_vllm_one_group_of_every_layer(self):
        # UniformTypeKVCacheSpecs: one group, num_blocks = pool // (sum of the layers' pages),
        # 64-token blocks (FlashMLA sparse).
        r = run(config=self.cfg, tp=8, engine="vllm", kv_dtype=["fp8_e4m3"], kv_memory_gib=40.0)
        entry = r["kv"]["fp8_e4m3"]
        num_blocks = int(40.0 * GIB) // (64 * 61 * (656 + 132))
        self.assertEqual(entry["engine_split"]["num_blocks"], num_blocks)
        self.assertEqual(entry["max_tokens"], num_blocks * 64)
        self.assertEqual(r["page_size"], 64)

    def test_vllm_auto_is_the_fp8_row(self):
        # models/config.py @0144dd5b DeepseekV32ForCausalLM.verify_and_update_config: auto ->
        # fp8_ds_mla.
        r = run(config=self.cfg, tp=8, engine="vllm", kv_dtype=["auto"])
        self.assertEqual(r["kv"]["auto"]["dtype"], "fp8_e4m3")
        self.assertEqual(r["kv"]["auto"]["bytes_per_token"], 61 * 788)

    def test_sglang_profiles_less_than_it_allocates(self):
        """kv_memory_gib is the pool's KV size: the tokens whose 788-byte rows (+ one 64-row
        padding page) fit it; what SGLang's 708-byte profile would allocate from 40 GiB of
        available memory stays beside it. bf16 (1152 + 132 in both) follows the same pool."""
        r = run(config=self.cfg, tp=8, kv_dtype=["fp8_e4m3", "bf16"], kv_memory_gib=40.0)
        entry = r["kv"]["fp8_e4m3"]
        split = entry["engine_split"]
        self.assertEqual(r["memory"]["pool_is"], "kv_size")
        self.assertEqual(entry["bytes_per_token"], 61 * 788)
        tokens = (int(40.0 * GIB) // (61 * 788) // 64 - 1) * 64
        self.assertEqual(entry["max_tokens"], tokens)
        self.assertEqual(split["kv_size_bytes"], (tokens + 64) * 61 * 788)
        self.assertLessEqual(split["kv_size_bytes"], int(40.0 * GIB))
        self.assertEqual(split["profiled_bytes_per_token"], 61 * 708)
        self.assertEqual(split["max_tokens_from_available"],
                         int(40.0 * GIB) // (61 * (576 + 132)) // 64 * 64)
        self.assertEqual(r["kv"]["bf16"]["max_tokens"],
                         (int(40.0 * GIB) // (61 * 1284) // 64 - 1) * 64)
        self.assertNotIn("pool-overshoot", codes(r))
        self.assertIn("dp-attention-default", codes(r))
        # The FP8 row stores an fp32 scale per 128 values: no checkpoint scales to miss.
        self.assertNotIn("fp8-kv-no-scales", codes(r))

    def test_sglang_trtllm_backend_keeps_the_plain_row(self):
        r = run(config=self.cfg, tp=8, kv_dtype=["fp8_e4m3"], attention_backend="trtllm",
                kv_memory_gib=40.0)
        self.assertEqual(r["kv"]["fp8_e4m3"]["bytes_per_token"], 61 * (576 + 132))
        self.assertNotIn("pool-overshoot", codes(r))

    def test_published_sglang_log(self):
        """sgl-project/sglang PR #11309 (8 x B200, --tp 8 --dp 8 --enable-dp-attention):
        '[2025-10-07 23:17:19 DP0 TP0] KV Cache is allocated. #tokens: 975424, KV size: 43.67 GB'
        43.67 GiB over 975,424 + 64 slots = 48,07x bytes per token: 61 x (656 + 132)."""
        line = ("[2025-10-07 23:17:19 DP0 TP0] KV Cache is allocated. #tokens: 975424, "
                "KV size: 43.67 GB")
        r = run(config=self.cfg, tp=8, dp=8, kv_dtype=["fp8_e4m3", "bf16"], kv_memory_gib=40.0,
                calibrate_log=line)
        cal = r["calibration"]
        self.assertEqual(cal["closest_dtype"], "fp8_e4m3")
        self.assertEqual(cal["modelled_bytes_per_token"], 48068)
        self.assertAlmostEqual(cal["bytes_per_token_ratio"], 1.0, delta=0.001)
        self.assertNotIn("calibration-mismatch", codes(r))

    def test_dp_attention_capacity_as_sglang_logs_it(self):
        """Issue 41 item 3. sgl-project/sglang PR #11309 (8 x B200, --tp 8 --dp 8
        --enable-dp-attention, FP8 KV, page 64): '[2025-10-07 23:17:19 DP0 TP0] KV Cache is
        allocated. #tokens: 975424, KV size: 43.67 GB'. The rule, from SGLang's code:
        - the pool (mem_cache/memory_pool.py NSATokenToKVPool): MLATokenToKVPool._create_buffers
          allocates size + page_size rows of calculate_mla_kv_cache_dim = 512 FP8 + 4 x 4 scale
          + 64 x 2 rope = 656 bytes a layer, the indexer (size + page_size + 1) // page_size pages
          of 64 x (128 + 4) bytes; _finalize_allocation_log prints both as 'KV size'. So a KV size
          of 43.67 GiB holds the most 64-aligned tokens with (tokens + 64) x 61 x 788 <= it:
          975,424 ((975,424 + 64) x 61 x 788 = 43.67 GiB; 975,488 forgets the padding page);
        - the profile (model_runner_kv_cache_mixin profile_max_num_token, get_cell_size_per_token)
          sizes from the memory available for the pool at the plain (512 + 64) + 132 = 708 bytes
          a layer: int(rest x 2^30) // 43,188, aligned to 64; 975,424 tokens need 39.2335 GiB of
          it, and 43.67 GiB of it would give 1,085,696 (what kv_calc said before)."""
        self.assertEqual(round((975424 + 64) * 61 * 788 / GIB, 2), 43.67)
        line = ("[2025-10-07 23:17:19 DP0 TP0] KV Cache is allocated. #tokens: 975424, "
                "KV size: 43.67 GB")
        r = run(config=self.cfg, tp=8, dp=8, kv_dtype=["fp8_e4m3"], kv_memory_gib=43.67,
                calibrate_log=line)
        entry = r["kv"]["fp8_e4m3"]
        split = entry["engine_split"]
        self.assertEqual(r["memory"]["pool_is"], "kv_size")
        self.assertEqual(entry["bytes_per_token"], 48068)
        self.assertEqual(entry["max_tokens"], 975424)
        self.assertEqual(entry["max_tokens"], (int(43.67 * GIB) // (61 * 788) // 64 - 1) * 64)
        self.assertEqual(entry["all_to_kv_tokens"], 975424)
        self.assertEqual(split["kv_size_bytes"], (975424 + 64) * 61 * 788)
        # The available-memory reading stays beside it, as SGLang's profile sizes it.
        self.assertEqual(split["max_tokens_from_kv_size"], 975424)
        self.assertEqual(split["max_tokens_from_available"], int(43.67 * GIB) // 43188 // 64 * 64)
        self.assertEqual(split["max_tokens_from_available"], 1085696)
        self.assertEqual(split["available_gib_for_max_tokens"], 39.2335)
        self.assertEqual(int(39.2335 * GIB) // 43188 // 64 * 64, 975424)
        self.assertNotIn("pool-overshoot", codes(r))
        self.assertIn("1,085,696 tokens", " ".join(r["assumptions"]))
        cal = r["calibration"]
        self.assertEqual((cal["tokens"], cal["modelled_max_tokens"], cal["tokens_ratio"]),
                         (975424, 975424, 1.0))
        self.assertEqual(cal["tokens_within_logged_kv_size"], 975424)
        self.assertEqual(cal["implied_available_gib"], round(975424 * 43188 / GIB, 4))

    def test_available_memory_keeps_sglang_sizing(self):
        """Memory kv_calc derives (nvidia-smi: 8 x B200, 183,359 MiB x mem_fraction - weights per
        GPU) is the memory available for the pool: SGLang's profile sizes it at 708 bytes a layer
        (int(rest x 2^30) // 43,188, aligned to 64) and its 788-byte tensors then take more than
        it (pool-overshoot); the KV-size reading of the same GiB stays beside it."""
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "out.csv").write_text((FIXTURES / "nvidia-smi-b200x8.csv").read_text())
            script = Path(tmp) / "nvidia-smi"
            script.write_text("#!/bin/sh\ncat \"$(dirname \"$0\")/out.csv\"\n")
            script.chmod(script.stat().st_mode | stat.S_IXUSR)
            with mock.patch.dict(os.environ, {"KV_TEST_PATH": tmp + os.pathsep + "/bin"}):
                r = run(model="deepseek-v3.2-exp", tp=8, dp=8, kv_dtype=["fp8_e4m3"],
                        mem_fraction=0.751)
        mem, entry = r["memory"], r["kv"]["fp8_e4m3"]
        split = entry["engine_split"]
        self.assertEqual((mem["source"], mem["pool_is"]), ("probed", "available"))
        tokens = int(mem["pool_gib"] * GIB) // 43188 // 64 * 64
        self.assertEqual(entry["max_tokens"], tokens)
        self.assertEqual(entry["all_to_kv_tokens"], tokens)
        self.assertEqual(split["max_tokens_from_available"], tokens)
        self.assertEqual(split["max_tokens_from_kv_size"],
                         (mem["pool_bytes"] // 48068 // 64 - 1) * 64)
        self.assertEqual(split["kv_size_bytes"], (tokens + 64) * 48068)
        self.assertGreater(split["kv_size_bytes"], mem["pool_bytes"])
        self.assertIn(f"{split['kv_size_bytes'] / GIB:.2f} GiB with the padding page",
                      warning_text(r, "pool-overshoot"))

    def test_bf16_only_and_fp8_e4m3(self):
        r = run(config=self.cfg, kv_dtype=["nvfp4"])
        self.assertIn("dtype-unsupported", codes(r))


class SlidingWindowLayouts(unittest.TestCase):
    """Which layers are sliding, from layer_types or the families' transformers defaults, and
    how each engine pools them: SGLang keeps a separate sliding-window pool only for its
    hybrid-SWA architectures (model_config.py @001adf56 is_hybrid_swa_model: Llama-4, GPT-OSS,
    ...; Gemma-2/3 run with disable_hybrid_swa_memory), vLLM's hybrid allocator groups every
    sliding layer apart (kv_cache_utils.py @001cabc1)."""

    def test_gemma3_official_config(self):
        # The published gemma-3-27b-it config has no layer_types/sliding_window_pattern:
        # Gemma3TextConfig's sliding_window_pattern 6 makes layers 5, 11, ..., 59 global.
        cfg = fixture_config("gemma-3-27b-it")
        vllm = run(config=cfg, tp=1, engine="vllm", kv_dtype=["bf16"], kv_memory_gib=30.0)
        self.assertEqual(vllm["layers"], {"total": 62, "full_attention": 10,
                                          "sliding_window": 52, "linear": 0})
        self.assertEqual(vllm["sliding_window"], 1024)
        per_layer = 16 * (128 + 128) * 2
        self.assertEqual(vllm["kv"]["bf16"]["bytes_per_token"], 10 * per_layer)
        # vLLM: 10 full + 52 sliding -> group_size 10, 1 + 6 groups; 16-token pages of one layer.
        num_blocks = int(30.0 * GIB) // (16 * per_layer) // 10
        entry = vllm["kv"]["bf16"]
        self.assertEqual(entry["engine_split"]["num_blocks"], num_blocks)
        self.assertEqual(entry["max_tokens"], num_blocks // 7 * 16)
        blocks = 32768 // 16 + 6 * (cdiv(1023 + 8192, 16) + 1)
        self.assertEqual(entry["concurrent_requests"]["32768"], round(num_blocks / blocks, 2))
        sglang = run(config=cfg, tp=1, kv_dtype=["bf16"], kv_memory_gib=30.0)
        self.assertEqual(sglang["kv"]["bf16"]["bytes_per_token"], 62 * per_layer)
        self.assertTrue(any("disable_hybrid_swa_memory" in a for a in sglang["assumptions"]))

    def test_gemma2_defaults(self):
        cfg = fixture_config("gemma-2-9b-it")
        model, _ = kv_calc.parse_model(kv_calc.Source("config", "t", cfg), kv_calc.Notes())
        self.assertEqual(model.layers[:2], [("sliding",), ("full",)])  # layer 0 is sliding
        r = run(config=cfg, tp=1, engine="vllm", kv_dtype=["auto"])
        self.assertEqual(r["layers"]["full_attention"], 21)
        self.assertEqual(r["sliding_window"], 4096)
        # A float32 Gemma config runs in bf16 (SGLang model_config _get_and_verify_dtype).
        self.assertEqual(r["kv"]["auto"]["dtype"], "bf16")

    def test_mistral_every_layer_sliding(self):
        cfg = fixture_config("mistral-7b-v0.1")
        vllm = run(config=cfg, tp=1, engine="vllm", kv_dtype=["bf16"], kv_memory_gib=20.0)
        self.assertEqual(vllm["layers"]["sliding_window"], 32)
        entry = vllm["kv"]["bf16"]
        per_layer = 8 * 256 * 2
        num_blocks = int(20.0 * GIB) // (16 * per_layer) // 32
        self.assertEqual(entry["max_tokens"], num_blocks * 16)
        # One SlidingWindowSpec for every layer: a request holds its window + batched tokens.
        blocks = cdiv(4095 + 8192, 16) + 1
        self.assertEqual(entry["concurrent_requests"]["131072"], round(num_blocks / blocks, 2))
        sglang = run(config=cfg, tp=1, kv_dtype=["bf16"], kv_memory_gib=20.0)
        self.assertEqual(sglang["kv"]["bf16"]["bytes_per_token"], 32 * per_layer)

    def test_qwen2_use_sliding_window(self):
        cfg = fixture_config("qwen2.5-7b-instruct")
        self.assertEqual(run(config=cfg)["layers"]["full_attention"], 28)
        cfg.update(use_sliding_window=True, max_window_layers=20, sliding_window=4096)
        r = run(config=cfg, engine="vllm")
        self.assertEqual((r["layers"]["full_attention"], r["layers"]["sliding_window"]), (20, 8))


class ChunkedAttention(unittest.TestCase):
    """Llama-4: RoPE layers use chunked attention, every 4th layer is global (Llama4TextConfig
    no_rope_layers default); vLLM ChunkedLocalAttentionSpec keeps chunk + batched tokens per
    request; SGLang pools them as its sliding-window layers (get_hybrid_layer_ids)."""

    def setUp(self):
        self.cfg = fixture_config("llama-4-scout-17b-16e-instruct")

    def test_layers_and_chunk(self):
        r = run(config=self.cfg, tp=8, kv_dtype=["bf16"])
        self.assertEqual(r["layers"], {"total": 48, "full_attention": 12, "sliding_window": 0,
                                       "linear": 0, "chunked": 36})
        self.assertEqual(r["attention_chunk_size"], 8192)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 12 * 1 * 256 * 2)

    def test_chunked_attention_layer_type_is_known(self):
        # The issue: a config whose layer_types has chunked_attention made the job fail.
        cfg = fixture_config("llama-4-scout-17b-16e-instruct")
        cfg["text_config"]["layer_types"] = (["chunked_attention"] * 3 + ["full_attention"]) * 12
        self.assertEqual(run(config=cfg)["layers"]["chunked"], 36)

    def test_sglang_swa_pool(self):
        r = run(config=self.cfg, tp=8, kv_dtype=["bf16"], kv_memory_gib=40.0)
        all_layers = int(40.0 * GIB) // (48 * 512)
        full = int(all_layers * 48 / (0.8 * 36 + 12))
        self.assertEqual(r["kv"]["bf16"]["max_tokens"], full)

    def test_vllm_groups(self):
        r = run(config=self.cfg, tp=8, kv_dtype=["bf16"], kv_memory_gib=40.0, engine="vllm")
        entry = r["kv"]["bf16"]
        num_blocks = int(40.0 * GIB) // (16 * 512) // 12
        self.assertEqual(entry["max_tokens"], num_blocks // 4 * 16)
        blocks = 131072 // 16 + 3 * cdiv(8192 + 8192, 16)
        self.assertEqual(entry["engine_split"]["blocks_per_request"]["131072"], blocks)


class MambaHybrids(unittest.TestCase):
    """Mamba-1/Mamba-2 hybrids: only attention layers cache per token; each Mamba layer keeps
    conv + SSM state per request per GPU (SGLang configs/mamba_utils.py @02e208de
    Mamba2StateShape.create, vLLM mamba_utils.py @02d71083 MambaStateShapeCalculator)."""

    def test_nemotron3_pattern(self):
        cfg = fixture_config("nemotron-3-nano-30b-a3b")
        r = run(config=cfg, tp=8, kv_dtype=["bf16"], kv_memory_gib=40.0)
        # MEMEM*E...: 6 attention, 23 Mamba-2, 23 MoE-only layers (SGLang NemotronHConfig).
        self.assertEqual(r["layers"], {"total": 52, "full_attention": 6, "sliding_window": 0,
                                       "linear": 23})
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 6 * 1 * 256 * 2)
        # conv: (intermediate + 2 groups x state) / TP x (kernel - 1), bf16
        conv = (64 * 64 + 2 * 8 * 128) // 8 * 3 * 2
        ssm = 64 // 8 * 64 * 128 * 4  # heads/TP x head dim x state, float32
        self.assertEqual(r["state"]["bytes_per_request"], 23 * (conv + ssm))
        self.assertEqual(r["state"]["conv_bytes"], 23 * conv)
        mlp = [k for k in r["kinds"] if k["kind"] == "mlp_only"][0]
        self.assertEqual(mlp["count"], 23)

    def test_nemotron_h_vllm_block_alignment(self):
        """models/config.py @0144dd5b HybridAttentionMambaModelConfig: attention block size =
        16 x cdiv(mamba page, 16 x attention page of one token); the mamba page is padded."""
        r = run(config=fixture_config("nemotron-h-8b-base-8k"), tp=8, engine="vllm",
                kv_dtype=["bf16"], kv_memory_gib=40.0)
        state = (8192 + 2 * 8 * 128) // 8 * 3 * 2 + 128 // 8 * 64 * 128 * 2  # all bf16 in vLLM
        block = 16 * cdiv(state, 16 * 512)
        entry = r["kv"]["bf16"]
        self.assertEqual(entry["engine_split"]["block_size"], block)
        num_blocks = int(40.0 * GIB) // (block * 512) // 4  # group_size = 4 attention layers
        self.assertEqual(entry["max_tokens"], num_blocks // 7 * block)  # 1 + 24 / 4 groups

    def test_unplaceable_pattern_character(self):
        cfg = fixture_config("nemotron-h-8b-base-8k")
        cfg["hybrid_override_pattern"] = "M*X-" + cfg["hybrid_override_pattern"][4:]
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=cfg)
        self.assertEqual(caught.exception.field, "hybrid_override_pattern[2]")
        self.assertEqual(caught.exception.value, "X")
        r = run(config=cfg, allow_unknown=True)
        self.assertIn("unknown-layer-kind", codes(r))
        self.assertIn("1 layer", warning_text(r, "unknown-layer-kind"))

    def test_falcon_h1_attention_and_mamba_in_every_layer(self):
        r = run(config=fixture_config("falcon-h1-defaults"), tp=4, kv_dtype=["bf16"])
        self.assertEqual(r["layers"], {"total": 32, "full_attention": 32, "sliding_window": 0,
                                       "linear": 32})
        # n_groups 1 over TP 4 -> 4 groups (extra_groups_for_head_shards); d_head auto = 8.
        conv = (1024 + 2 * 4 * 256) // 4 * 3 * 2
        ssm = 128 // 4 * 8 * 256 * 4
        self.assertEqual(r["state"]["bytes_per_request"], 32 * (conv + ssm))

    def test_granite_hybrid_layer_types(self):
        r = run(config=fixture_config("granite-4.0-h-small"), tp=4, kv_dtype=["bf16"])
        self.assertEqual((r["layers"]["full_attention"], r["layers"]["linear"]), (4, 36))
        conv = (2 * 4096 + 2 * 4 * 128) // 4 * 3 * 2
        ssm = 128 // 4 * 64 * 128 * 4
        self.assertEqual(r["state"]["bytes_per_request"], 36 * (conv + ssm))

    def test_jamba_mamba1(self):
        cfg = fixture_config("jamba-mini-1.7")
        r = run(config=cfg, tp=2, engine="vllm", kv_dtype=["bf16"])
        self.assertEqual((r["layers"]["full_attention"], r["layers"]["linear"]), (4, 28))
        # Attention where i % attn_layer_period == attn_layer_offset: layers 4, 12, 20, 28.
        model, _ = kv_calc.parse_model(kv_calc.Source("config", "t", cfg), kv_calc.Notes())
        self.assertEqual([i for i, m in enumerate(model.layers) if "full" in m], [4, 12, 20, 28])
        # mamba1_state_shape: conv (intermediate/TP, kernel - 1), SSM (intermediate/TP, state),
        # both in the model dtype with vLLM's auto cache dtypes.
        inner = 2 * 4096 // 2
        self.assertEqual(r["state"]["bytes_per_request"], 28 * (inner * 3 * 2 + inner * 16 * 2))


class LightningAttention(unittest.TestCase):
    """MiniMax-Text-01: lightning (linear) attention layers keep a (heads/TP, head dim, head dim)
    state (vLLM linear_attention_state_shape, model dtype); SGLang has no such model."""

    def test_vllm_state(self):
        r = run(config=fixture_config("minimax-text-01"), tp=8, engine="vllm",
                kv_dtype=["bf16"], kv_memory_gib=40.0)
        self.assertEqual((r["layers"]["full_attention"], r["layers"]["linear"]), (10, 70))
        self.assertEqual(r["state"]["bytes_per_request"], 70 * (64 // 8) * 128 * 128 * 2)
        self.assertGreater(r["kv"]["bf16"]["max_tokens"], 0)

    def test_sglang_refuses(self):
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=fixture_config("minimax-text-01"), tp=8)
        self.assertEqual(caught.exception.field, "engine")


class MtpDraftLayers(unittest.TestCase):

    def test_vllm_draft_layers_share_the_pool(self):
        cfg = fixture_config("deepseek-v3.2-exp")
        r = run(config=cfg, tp=8, engine="vllm", kv_dtype=["fp8_e4m3"], kv_memory_gib=40.0,
                mtp=True)
        num_blocks = int(40.0 * GIB) // (64 * 62 * 788)  # 61 target + 1 NextN layer
        self.assertEqual(r["kv"]["fp8_e4m3"]["max_tokens"], num_blocks * 64)
        off = run(config=cfg, tp=8, engine="vllm", kv_dtype=["fp8_e4m3"], kv_memory_gib=40.0)
        self.assertTrue(any("not counted" in a for a in off["assumptions"]))

    def test_sglang_draft_pool_outside_the_profile(self):
        cfg = fixture_config("qwen3.5-397b-a17b")  # mtp_num_hidden_layers 1
        r = run(config=cfg, tp=8, kv_dtype=["bf16"], kv_memory_gib=17.4, mtp=True)
        entry = r["kv"]["bf16"]
        self.assertEqual(entry["max_tokens"], 641164)  # the target's pool is unchanged
        self.assertEqual(entry["mtp_draft"]["pool_bytes"], 641164 * 1 * 512 * 2)
        self.assertIn("draft-kv-outside-pool", codes(r))


class WrappersAndDp(unittest.TestCase):

    def test_llm_config_and_language_config(self):
        inner = fixture_config("llama-3.1-8b")
        for key in ("llm_config", "language_config"):
            r = run(config={"architectures": ["X"], "model_type": "x", key: inner,
                            "vision_config": {"num_hidden_layers": 99}})
            self.assertEqual(r["layers"]["total"], 32, key)
            self.assertTrue(any(key in a for a in r["assumptions"]), key)

    def test_dp_attention(self):
        r = seed(dp=8, kv_dtype=["bf16"])
        self.assertEqual((r["attention_tp"], r["kv_heads_per_gpu"]), (1, 2))
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 15 * 2 * 512 * 2)
        conv = (16 * 128 * 2 + 64 * 128) * 3 * 2
        ssm = 64 * 128 * 128 * 4
        self.assertEqual(r["state"]["bytes_per_request"], 45 * (conv + ssm))
        entry = r["kv"]["bf16"]
        self.assertEqual(entry["deployment_concurrent_requests"]["262144"],
                         round(entry["concurrent_requests"]["262144"] * 8, 2))

    def test_dp_must_divide_tp(self):
        with self.assertRaises(kv_calc.InputError) as caught:
            params(tp=8, dp=3)
        self.assertEqual(caught.exception.field, "dp")


class UnknownKinds(unittest.TestCase):
    """An unknown layer kind or model_type fails loudly instead of counting as full attention."""

    def config(self):
        cfg = fixture_config("llama-3.1-8b")
        cfg["layer_types"] = ["full_attention"] * 31 + ["mystery_attention"]
        return cfg

    def test_unknown_layer_type_fails(self):
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=self.config())
        self.assertEqual(caught.exception.field, "layer_types[31]")
        self.assertEqual(caught.exception.value, "mystery_attention")
        self.assertIn("allow_unknown", str(caught.exception))

    def test_allow_unknown_warns_with_the_count(self):
        r = run(config=self.config(), allow_unknown=True, kv_dtype=["bf16"])
        self.assertIn("1 layer", warning_text(r, "unknown-layer-kind"))
        self.assertEqual(r["layers"]["full_attention"], 32)

    def test_unknown_model_type_of_known_fields_is_sized(self):
        # Issue 41: a new model_type made only of fields kv_calc knows is placed from them.
        cfg = fixture_config("llama-3.1-8b")
        cfg["model_type"] = "brand_new_arch"
        r = run(config=cfg, kv_dtype=["bf16"])
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 131072)
        self.assertEqual(r["model"]["rule"]["reader"], "fields")
        self.assertIn("'brand_new_arch' has no family rule", r["model"]["rule"]["how"])
        self.assertNotIn("unknown-layer-kind", codes(r))


class LayerRulesByKind(unittest.TestCase):
    """Issue 41 item 1: what each layer caches is decided from the config's fields; a model_type
    that only renames a family takes the family's rule; a config made only of known fields is
    sized and the result names the rule; an unknown field that could change the cache is refused
    by name. Fixtures are the published configs (fixtures/configs/README.md)."""

    def test_qwen3_vl_moe_text_under_text_config(self):
        """Qwen3-VL-30B-A3B: qwen3_vl_moe_text under text_config is Qwen3-MoE's plain GQA.
        4 KV heads over TP 4 = 1 head a GPU (SGLang and vLLM ModelConfig.get_num_kv_heads:
        max(1, total_num_kv_heads // tensor_parallel_size)) x (128 + 128) x 2 bytes x 48 layers;
        at TP 8 the head is replicated, the same 24,576 bytes."""
        cfg = fixture_config("qwen3-vl-30b-a3b-instruct")
        for tp in (4, 8):
            r = run(config=cfg, tp=tp, kv_dtype=["bf16"])
            self.assertEqual(r["layers"], {"total": 48, "full_attention": 48, "sliding_window": 0,
                                           "linear": 0})
            self.assertEqual(r["kv_heads_per_gpu"], 1)
            self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 48 * 1 * 256 * 2)
        rule = r["model"]["rule"]
        self.assertEqual((rule["family"], rule["reader"]), ("qwen3_moe", "qwen2"))
        self.assertIn("'qwen3_vl_moe_text' only renames it", rule["how"])
        self.assertEqual(run(config=cfg)["kv"]["bf16"]["bytes_per_token"], 48 * 4 * 256 * 2)

    def test_glm_4_7_flash_lite_is_mla(self):
        """GLM-4.7-Flash (glm4_moe_lite): MLA. vLLM tests/transformers_utils test for
        Glm4MoeLiteConfig asserts ModelConfig.get_head_size() == 576 (kv_lora_rank 512 +
        qk_rope_head_dim 64) and get_num_kv_heads() == 1 with MLA: 47 x 576 x 2 bytes at bf16,
        on every GPU whatever the TP (SGLang MLATokenToKVPool, one latent per token)."""
        cfg = fixture_config("glm-4.7-flash")
        for tp in (1, 4):
            r = run(config=cfg, tp=tp, kv_dtype=["bf16", "fp8_e4m3"])
            self.assertEqual(r["model"]["attention"], "mla")
            self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 47 * 576 * 2)  # 54,144
            self.assertEqual(r["kv"]["fp8_e4m3"]["bytes_per_token"], 47 * 576)
        self.assertEqual(r["model"]["rule"]["family"], "glm4_moe")
        self.assertIn("'_lite' dropped", r["model"]["rule"]["how"])
        self.assertEqual(r["mtp"], {"layers": 1, "counted": False})

    def test_smollm3_nope_layers_change_nothing(self):
        """SmolLM3-3B: every fourth layer skips RoPE (no_rope_layers[i] = 0), which changes only
        the rotary embedding, not the cache: vLLM serves SmolLM3ForCausalLM on its Transformers
        backend (models/registry.py _TRANSFORMERS_SUPPORTED_MODELS), one full-attention layer per
        decoder layer with num_key_value_heads. 36 x 4 heads x (128 + 128) x 2 bytes at TP 1;
        head_dim = 2048 / 16."""
        r = run(config=fixture_config("smollm3-3b"), kv_dtype=["bf16"], kv_memory_gib=10.0)
        self.assertEqual(r["layers"]["full_attention"], 36)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 73728)
        self.assertEqual(r["kv"]["bf16"]["max_tokens"], int(10.0 * GIB) // 73728)
        self.assertEqual(r["model"]["rule"]["reader"], "fields")
        self.assertIn("'smollm3' has no family rule", r["model"]["rule"]["how"])

    def test_unknown_cache_field_is_refused_by_name(self):
        cfg = fixture_config("smollm3-3b")
        cfg["kv_sharing_layers"] = [30, 31, 32]
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=cfg)
        self.assertEqual(caught.exception.field, "kv_sharing_layers")
        self.assertEqual(caught.exception.value, [30, 31, 32])
        self.assertIn("'kv_sharing_layers'", str(caught.exception))
        r = run(config=cfg, allow_unknown=True)
        self.assertIn("kv_sharing_layers", warning_text(r, "unknown-config-field"))

    def test_unknown_field_that_cannot_change_the_cache_is_let_pass(self):
        cfg = fixture_config("smollm3-3b")
        cfg.update(router_jitter_noise=0.1, attn_sink_enabled=False, attention_multiplier=0.5,
                   shared_intermediate_size=1024)
        self.assertEqual(run(config=cfg)["kv"]["bf16"]["bytes_per_token"], 73728)

    def test_unknown_field_under_a_known_family_is_refused_too(self):
        cfg = fixture_config("qwen3-vl-30b-a3b-instruct")
        cfg["text_config"]["sliding_window_layers"] = [0, 1]
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=cfg)
        self.assertEqual(caught.exception.field, "sliding_window_layers")

    def test_unplaced_sliding_window_is_refused(self):
        cfg = fixture_config("smollm3-3b")
        cfg.update(use_sliding_window=None, sliding_window=4096)
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=cfg)
        self.assertEqual((caught.exception.field, caught.exception.value),
                         ("sliding_window", 4096))

    def test_every_fixture_and_preset_names_its_rule(self):
        for path in sorted((FIXTURES / "configs").glob("*.json")):
            engine = "vllm" if path.stem == "minimax-text-01" else "sglang"
            r = run(config=json.loads(path.read_text()), engine=engine)
            self.assertTrue(r["model"]["rule"]["how"], path.name)
            self.assertNotIn("unknown-config-field", codes(r), path.name)


class KdaAndShortConv(unittest.TestCase):
    """Issue 41 item 2: Kimi-Linear's KDA layers and LFM2's short-convolution layers keep a
    fixed state per request, as the engines allocate it; only their attention layers cache per
    token."""

    def test_kimi_linear_layers_and_kv(self):
        """linear_attn_config: kda_layers 1-based (KimiLinearConfig.is_kda_layer); the 7 others
        are MLA (SGLang DefaultPoolConfigurator cell size over full_attention_layer_ids:
        (kv_lora_rank + qk_rope_head_dim) x 7 layers x 2 bytes)."""
        r = run(config=fixture_config("kimi-linear-48b-a3b-instruct"), tp=1, kv_dtype=["bf16"],
                kv_memory_gib=10.0)
        self.assertEqual(r["layers"], {"total": 27, "full_attention": 7, "sliding_window": 0,
                                       "linear": 20})
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 7 * 576 * 2)  # 8,064
        model, _ = kv_calc.parse_model(
            kv_calc.Source("config", "t", fixture_config("kimi-linear-48b-a3b-instruct")),
            kv_calc.Notes())
        self.assertEqual([i for i, m in enumerate(model.layers) if m == ("full",)],
                         [3, 7, 11, 15, 19, 23, 26])
        self.assertEqual(r["contexts"][-1], 1048576)  # model_max_length

    def test_kimi_linear_state_sglang(self):
        """SGLang configs/kimi_linear.py KimiLinearConfig.mamba2_cache_params ->
        mamba_utils.py KimiLinearStateShape.create(num_heads 32, head_dim 128, conv kernel 4):
        conv q, k, v each (32 x 128 / TP, 3) in bf16, temporal (32 / TP, 128, 128) in
        mamba2_state_dtype (float32 by default); handle_max_mamba_cache splits the pool
        0.9 / 1.9 to state slots."""
        for tp in (1, 4):
            r = run(config=fixture_config("kimi-linear-48b-a3b-instruct"), tp=tp,
                    kv_dtype=["bf16"], kv_memory_gib=10.0)
            conv = 3 * (32 * 128 // tp) * 3 * 2
            ssm = (32 // tp) * 128 * 128 * 4
            self.assertEqual(r["state"]["conv_bytes"], 20 * conv, tp)
            self.assertEqual(r["state"]["ssm_bytes"], 20 * ssm, tp)
            slots, rest = kv_calc.sglang_state_split(10.0, 20 * (conv + ssm), 0.9)
            entry = r["kv"]["bf16"]
            self.assertEqual(entry["engine_split"]["state_slots"], slots)
            self.assertEqual(entry["max_tokens"], int(rest * GIB) // (7 * 576 * 2))
        self.assertEqual(r["state"]["bytes_per_request"], 20 * (18432 + 524288))

    def test_kimi_linear_state_vllm(self):
        """vLLM mamba_utils.py kda_state_shape (conv (heads x head_dim / TP, kernel - 1) for q,
        k, v; recurrent (heads / TP, head_dim, head_dim)) and kda_state_dtype (conv in the
        model dtype, recurrent float32 whatever --mamba-ssm-cache-dtype says)."""
        r = run(config=fixture_config("kimi-linear-48b-a3b-instruct"), tp=2, engine="vllm",
                kv_dtype=["bf16"], kv_memory_gib=10.0, ssm_dtype="bfloat16")
        kda = [k for k in r["kinds"] if k["kind"] == "kimi_delta_attention"][0]
        self.assertEqual(kda["state_per_layer"]["ssm_dtype"], "float32")
        self.assertEqual(kda["state_per_layer"]["conv_elements"], 3 * 2048 * 3)
        self.assertEqual(kda["state_per_layer"]["bytes"], 3 * 2048 * 3 * 2 + 16 * 128 * 128 * 4)

    def test_lfm2_short_conv_state(self):
        """SGLang configs/lfm2.py Lfm2Config.mamba2_cache_params: Mamba2StateShape.create with
        intermediate_size = hidden_size, state_size 0, conv_kernel conv_L_cache -> conv
        (hidden / TP, conv_L_cache - 1) in bf16 and no SSM state; vLLM short_conv_state_shape
        (conv_L_cache - 1, hidden / TP) in the model dtype. 8 attention layers of 8 KV heads x 64
        (2048 / 32)."""
        for engine in ("sglang", "vllm"):
            for tp in (1, 2):
                r = run(config=fixture_config("lfm2-2.6b"), tp=tp, engine=engine,
                        kv_dtype=["bf16"], kv_memory_gib=10.0)
                self.assertEqual(r["layers"], {"total": 30, "full_attention": 8,
                                               "sliding_window": 0, "linear": 22})
                self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 8 * (8 // tp) * 128 * 2)
                self.assertEqual(r["state"]["bytes_per_request"], 22 * (2048 // tp) * 2 * 2)
                self.assertEqual(r["state"]["ssm_bytes"], 0)

    def test_lfm2_full_attn_idxs(self):
        # The first LFM2 checkpoints list the attention layers in full_attn_idxs.
        cfg = fixture_config("lfm2-2.6b")
        del cfg["layer_types"]
        cfg["full_attn_idxs"] = [2, 6, 10, 14, 18, 21, 24, 27]
        self.assertEqual(run(config=cfg)["layers"]["linear"], 22)

    def test_lfm2_vllm_block_alignment(self):
        """models/config.py @0144dd5b HybridAttentionMambaModelConfig: the attention page of
        16 tokens x 8 heads x 128 x 2 bytes (32,768) already holds one conv state (8,192 bytes):
        the block size stays 16; 8 attention + 22 conv layers -> group size 8, 1 + 3 groups."""
        r = run(config=fixture_config("lfm2-2.6b"), tp=1, engine="vllm", kv_dtype=["bf16"],
                kv_memory_gib=10.0)
        entry = r["kv"]["bf16"]
        self.assertEqual(entry["engine_split"]["block_size"], 16)
        num_blocks = int(10.0 * GIB) // (16 * 2048) // 8
        self.assertEqual(entry["engine_split"]["num_blocks"], num_blocks)
        self.assertEqual(entry["max_tokens"], num_blocks // 4 * 16)

    def test_allow_unknown_warns_once_per_kind(self):
        # Issue 41: LFM2 repeated its warning for each of its 22 conv layers.
        cfg = fixture_config("lfm2-2.6b")
        cfg["layer_types"] = ["mystery_conv" if t == "conv" else t for t in cfg["layer_types"]]
        with self.assertRaises(kv_calc.InputError) as caught:
            run(config=cfg)
        self.assertEqual((caught.exception.field, caught.exception.value),
                         ("layer_types[0]", "mystery_conv"))
        r = run(config=cfg, allow_unknown=True)
        warned = [w for w in r["warnings"] if w["code"] == "unknown-layer-kind"]
        self.assertEqual(len(warned), 1)
        self.assertIn("22 layers", warned[0]["message"])


class Breakdown(unittest.TestCase):

    def test_seed_kinds(self):
        kinds = {k["kind"]: k for k in seed(kv_dtype=["bf16"])["kinds"]}
        self.assertEqual(kinds["full_attention"]["count"], 15)
        self.assertEqual(kinds["full_attention"]["bytes_per_token"], {"bf16": 15360})
        self.assertEqual(kinds["gated_delta_net"]["state_per_request"],
                         {"conv_bytes": 414720, "ssm_bytes": 23592960, "bytes": 24007680})
        self.assertEqual(kinds["mtp_draft"], {"kind": "mtp_draft", "count": 1, "counted": False})

    def test_sliding_kind(self):
        r = run(config=fixture_config("gemma-3-27b-it"), tp=1, engine="vllm", kv_dtype=["bf16"])
        sliding = [k for k in r["kinds"] if k["kind"] == "sliding_attention"][0]
        self.assertEqual((sliding["count"], sliding["sliding_window"]), (52, 1024))
        self.assertEqual(sliding["bytes_per_request"]["bf16"], 52 * 8192 * 1024)


class PublishedLogs(unittest.TestCase):

    def test_qwen3_235b_sglang_tp4(self):
        """vllm-project/vllm issue #21348: Qwen3-235B-A22B-FP8 on 4 x H100 with SGLang --tp 4:
        'KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB'.
        4 KV heads over TP 4: 1 head x (128 + 128) x 2 bytes x 94 layers = 48,128 bytes."""
        line = "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
        r = run(config=fixture_config("qwen3-235b-a22b"), tp=4, kv_dtype=["bf16"],
                kv_memory_gib=17.0, calibrate_log=line)
        self.assertEqual(r["kv"]["bf16"]["bytes_per_token"], 48128)
        self.assertAlmostEqual(r["calibration"]["bytes_per_token_ratio"], 1.0, delta=0.001)


def sglang_default_fraction(gpu_mib, tp, dp=1, vision=None):
    """SGLang server_args.py ServerArgs._handle_gpu_memory_settings (PR #10975), as written there
    for GPUs of 90-160 GB (chunked_prefill_size 8192, cuda_graph_max_bs 512 from TP 4) and above
    160 GB (16384, 512), then adjust_mem_fraction_for_vlm for a vision encoder."""
    chunk = 16384 if gpu_mib >= 160 * 1024 else 8192
    bs = 512
    reserved = 512 + chunk * 1.5 + bs * 2 + tp / 8 * 1024
    if dp > 1:  # enable_dp_attention
        reserved += bs * dp * 3 + bs * dp * 1.5
    reserved = max(reserved, 10 * 1024)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    if vision:
        ratio = 24 * vision["hidden_size"] ** 2 / (24 * 1024 ** 2)  # no num_hidden_layers: 24
        fraction *= 0.95 * max(0.8, min(1.05, 1 - 0.1 * (ratio - 1)))
    return fraction


class Planner(unittest.TestCase):
    """mode=plan (issue 41 item 4) on the deployments of the issue: the seed (Qwen3.5-397B-A17B
    NVFP4 on 8 x RTX PRO 6000 96 GB, 262,144 tokens), Llama-3.1-70B on H200 with vLLM, and
    DeepSeek-V3.2 with DP attention on B200; each figure against the engine's own arithmetic."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def fake_smi(self, csv_name):
        (self.bin / "out.csv").write_text((FIXTURES / csv_name).read_text())
        script = self.bin / "nvidia-smi"
        script.write_text("#!/bin/sh\ncat \"$(dirname \"$0\")/out.csv\"\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def plan(self, **overrides):
        with mock.patch.dict(os.environ, {"KV_TEST_PATH": str(self.bin) + os.pathsep + "/bin"}):
            return run(mode="plan", **overrides)

    def row(self, r, gpus, dp, kv):
        return [c for c in r["candidates"]
                if (c["gpus"], c["dp"], c["kv_dtype"]) == (gpus, dp, kv)][0]

    def test_sglang_mem_fraction_defaults(self):
        """The issue's figures: 0.848 at TP 8 and 0.754 with DP attention 4 on a 96 GB card
        (97,887 MiB): reserved 512 + 8192 x 1.5 + 512 x 2 + 8 / 8 x 1024 = 14,848 MiB, plus
        512 x 4 x 3 + 512 x 4 x 1.5 = 9,216 with DP attention."""
        self.assertEqual(kv_calc.sglang_mem_fraction(97887, 8).value, 0.848)
        self.assertEqual(kv_calc.sglang_mem_fraction(97887, 8, 4, True).value, 0.754)
        self.assertEqual(kv_calc.sglang_mem_fraction(97887, 8).value,
                         sglang_default_fraction(97887, 8))
        # H200 (143,771 MiB) at TP 16, B200 (183,359 MiB) with DP attention 8.
        self.assertEqual(kv_calc.sglang_mem_fraction(143771, 16).value,
                         sglang_default_fraction(143771, 16))
        self.assertEqual(kv_calc.sglang_mem_fraction(183359, 8, 8, True).value, 0.751)
        vision = {"depth": 27, "hidden_size": 1152}
        self.assertAlmostEqual(kv_calc.sglang_mem_fraction(97887, 8, vision=vision).value,
                               sglang_default_fraction(97887, 8, vision=vision), 12)

    def test_seed_question_from_the_checkpoint(self):
        """The seed: the NVFP4 checkpoint declares FP8 KV (hf_quant_config.json
        kv_cache_quant_algo) and carries k_scale/v_scale, so FP8 is allowed, as size mode's auto
        picks it. Qwen3.5 is MoE: SGLang runs DP as DP attention. SGLang's own
        mem_fraction_static for each layout (with its vision-encoder reduction), then its pool:
        rest = 97,887 MiB x fraction - weights per GPU; handle_max_mamba_cache gives 0.9 / 1.9
        to state slots, KV tokens = int(rest x 2^30) // 7,680 bytes (fp8, one KV head) per
        rank, capped at slots // 3 running requests; the deployment serves dp x that."""
        self.fake_smi("nvidia-smi-rtxpro6000x8.csv")
        ckpt = FIXTURES / "qwen35-nvfp4-ckpt"
        r = self.plan(model_dir=str(ckpt), weights_gib=218.0, context=[262144])
        self.assertEqual(r["fp8_kv_scales"], "declared")
        self.assertIn("hf_quant_config.json", r["fp8_kv_scales_fact"])
        self.assertFalse(any(reason.startswith("accuracy rule") for reason in r["reasons"]))
        size = run(model_dir=str(ckpt), tp=8, kv_dtype=["auto"])
        self.assertEqual(size["kv"]["auto"]["dtype"], "fp8_e4m3")
        vision = json.loads((ckpt / "config.json").read_text())["vision_config"]
        attention = r["weights"]["attention_bytes"]
        for dp in (1, 2, 4, 8):
            row = self.row(r, 8, dp, "fp8_e4m3")
            fraction = sglang_default_fraction(97887, 8, dp, vision)
            self.assertAlmostEqual(row["mem_fraction"], round(fraction, 4), 12)
            weights = int(218.0 * GIB) // 8 + attention * (dp - 1) // 8
            rest = 97887 / 1024 * fraction - weights / GIB
            self.assertEqual(row["kv_pool_gib"], round(rest, 2))
            state = 45 * ((16 * 128 * 2 + 64 * 128) // (8 // dp) * 3 * 2 +
                          64 // (8 // dp) * 128 * 128 * 4)
            slots, kv_rest = kv_calc.sglang_state_split(rest, state, 0.9)
            tokens = int(kv_rest * GIB) // (15 * max(1, 2 // (8 // dp)) * 512)
            self.assertEqual(row["max_tokens_per_rank"], tokens, dp)
            per_rank = min(tokens / 262144, slots // 3)
            self.assertEqual(row["concurrent_requests"], round(per_rank * dp, 2), dp)
        pick = r["pick"]
        self.assertEqual((pick["mode"], pick["dp"], pick["kv_dtype"]),
                         ("dp_attention", 4, "fp8_e4m3"))
        self.assertEqual(pick["concurrent_requests"],
                         max(c["concurrent_requests"] for c in r["candidates"]))
        self.assertIn("= 0.754", pick["mem_fraction_source"])
        self.assertEqual(r["launch"]["flags"], [
            "--tp", "8", "--dp", "4", "--enable-dp-attention", "--kv-cache-dtype", "auto",
            "--context-length", "262144", "--mem-fraction-static",
            kv_calc.fraction_flag(pick["mem_fraction"]),
            "--max-running-requests", str(pick["whole_requests_per_rank"] * 4)])
        self.assertTrue(r["launch"]["command"].startswith(
            f"python3 -m sglang.launch_server --model-path {ckpt} --tp 8"))

    def test_seed_question_from_the_preset_claims_nothing_of_scales(self):
        """No checkpoint read: the plan says so and states nothing about k_scale/v_scale it did
        not see; the preset's quantization_config (transcribed from the checkpoint's) declares
        FP8 KV, which is what allows it."""
        r = self.plan(model="qwen3.5-397b-a17b-nvfp4", gpus=[8], gpu_memory_gib=95.59,
                      context=[262144])
        self.assertEqual(r["fp8_kv_scales"], "declared")
        self.assertNotIn("safetensors", r["fp8_kv_scales_fact"])
        cfg = fixture_config("llama-3.1-8b")
        bare = self.plan(config=cfg, gpus=[1], gpu_memory_gib=80.0, weights_gib=15.0,
                         context=[65536])
        self.assertEqual(bare["fp8_kv_scales"], "unknown")
        self.assertIn("no checkpoint read", bare["fp8_kv_scales_fact"])
        text = " ".join(bare["reasons"] + bare["assumptions"] +
                        [w["message"] for w in bare["warnings"]])
        self.assertNotIn("has no calibrated", text)
        self.assertNotIn("fp8-kv-no-scales", codes(bare))

    def test_checkpoint_without_scales_keeps_unquantized_kv(self):
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp)
            cfg = fixture_config("llama-3.1-8b")
            (ckpt / "config.json").write_text(json.dumps(cfg))
            make_safetensors.write_file(ckpt / "model.safetensors", {
                "model.layers.0.self_attn.k_proj.weight": ("BF16", (4, 8))})
            r = self.plan(model_dir=tmp, gpus=[1], gpu_memory_gib=80.0, weights_gib=15.0,
                          context=[65536])
        self.assertEqual(r["fp8_kv_scales"], "absent")
        self.assertEqual(r["pick"]["kv_dtype"], "bf16")
        self.assertTrue(any(reason.startswith("accuracy rule") for reason in r["reasons"]))
        self.assertIn("fp8-kv-no-scales", codes(r))

    def test_llama_70b_vllm_dense_dp_is_replicas(self):
        """vLLM runs DP of a dense model as full replicas: 2 x TP 8 on 16 H200 (143,771 MiB),
        FP8 KV, 131,072 tokens. vLLM's arithmetic: --gpu-memory-utilization 0.9 (config/cache.py
        CacheConfig), pool = 143,771 MiB x 0.9 - 131.4 GiB / 8 - 2 GiB activations; blocks =
        pool // (16 tokens x 1 KV head x 256 x 1 byte) // 80 layers; a request holds 131,072 /
        16 blocks (get_max_concurrency_for_kv_cache_config); 2 replicas serve twice that."""
        self.fake_smi("nvidia-smi-h200x8.csv")
        r = self.plan(model="llama-3.1-70b", engine="vllm", gpus=[2, 16],
                      kv_dtype=["fp8_e4m3"], context=[131072], concurrency=16)
        self.assertFalse(any(c["mode"] == "dp_attention" for c in r["candidates"]))
        row = self.row(r, 16, 2, "fp8_e4m3")
        self.assertEqual((row["mode"], row["tp"], row["attention_tp"]), ("replicas", 8, 8))
        self.assertEqual(row["mem_fraction"], 0.9)
        pool = 143771 / 1024 * 0.9 - int(131.4 * GIB) // 8 / GIB - 2.0
        blocks = int(pool * GIB) // (16 * 256) // 80
        self.assertEqual(row["concurrent_requests"], round(blocks / 8192 * 2, 2))
        self.assertEqual(row["concurrent_requests"], 86.35)  # the issue's figure
        # 2 replicas of TP 1 hold 131.4 GiB of weights on each GPU: never feasible.
        infeasible = [x for x in r["rejected"] if (x["gpus"], x["dp"]) == (2, 2)][0]
        self.assertEqual(infeasible["kind"], "infeasible")
        self.assertNotIn((2, 2), [(c["gpus"], c["dp"]) for c in r["candidates"]])
        self.assertEqual(r["pick"]["layout"], "2 replicas of TP 8")
        self.assertEqual(r["launch"]["flags"], [
            "--tensor-parallel-size", "8", "--data-parallel-size", "2", "--kv-cache-dtype",
            "fp8_e4m3", "--max-model-len", "131072", "--gpu-memory-utilization", "0.9",
            "--max-num-seqs", str(int(blocks / 8192))])

    def test_deepseek_v32_dp_attention_on_b200(self):
        """SGLang on 8 x B200 (183,359 MiB): DeepSeek-V3.2 always runs DP attention (SGLang turns
        it on with dp = tp for NSA), FP8 KV needs no checkpoint scales (the row carries its
        own); mem_fraction_static 0.751 at DP 8; per rank tokens = int(rest x 2^30) // (61 x
        (576 + 132)) aligned to 64 (the profile), auto is FP8 on Blackwell."""
        self.fake_smi("nvidia-smi-b200x8.csv")
        r = self.plan(model="deepseek-v3.2-exp", context=[131072])
        self.assertEqual(r["fp8_kv_scales"], "row-scales")
        self.assertNotIn(1, [c["dp"] for c in r["candidates"]])
        row = self.row(r, 8, 8, "fp8_e4m3")
        self.assertEqual(row["mem_fraction"], 0.751)
        weights = int(642.0 * GIB) // 8 + r["weights"]["attention_bytes"] * 7 // 8
        rest = 183359 / 1024 * 0.751 - weights / GIB
        tokens = int(rest * GIB) // (61 * 708) // 64 * 64
        self.assertEqual(row["max_tokens_per_rank"], tokens)
        self.assertEqual((r["pick"]["dp"], r["pick"]["kv_dtype"]), (8, "fp8_e4m3"))
        self.assertIn("pool-overshoot", codes(r))
        self.assertEqual(r["launch"]["flags"][:10], [
            "--tp", "8", "--dp", "8", "--enable-dp-attention", "--kv-cache-dtype", "auto",
            "--context-length", "131072", "--mem-fraction-static"])

    def test_nothing_fits(self):
        r = run(mode="plan", model="llama-3.1-70b", gpu_memory_gib=24.0, gpus=[1, 2])
        self.assertIsNone(r["pick"])
        self.assertIn("nothing-fits", codes(r))
        self.assertTrue(all(x["kind"] == "infeasible" for x in r["rejected"]))

    def test_mem_fraction_given_applies_to_every_row(self):
        r = run(mode="plan", model="llama-3.1-70b", gpu_memory_gib=140.0, gpus=[8],
                mem_fraction=0.8)
        self.assertEqual({c["mem_fraction"] for c in r["candidates"]}, {0.8})
        self.assertEqual({c["mem_fraction_source"] for c in r["candidates"]}, {"given"})

    def test_plan_needs_gpu_memory(self):
        with self.assertRaises(kv_calc.InputError) as caught:
            run(mode="plan", model="llama-3.1-8b")
        self.assertEqual(caught.exception.field, "gpu_memory_gib")


class DocsQuoteTheTool(unittest.TestCase):
    """Issue 41 item 5: the figures docs/kv_calc.md quotes are the tool's own. Each
    `<!-- kv_calc: ARGS -->` comment names a by-hand command; from it to the end of the fenced
    block after it (or to the next comment or heading), every line of the block must be a line
    the tool prints, and every figure in the prose (a number with a thousands separator or a
    decimal point) must be in what it prints or writes to its result."""

    DOC = REPO / "docs" / "kv_calc.md"
    MARKER = re.compile(r"^<!-- kv_calc: (.*) -->$")
    FIGURE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)(?![\w,]*\d)")

    def regions(self):
        """(args, fenced lines, prose) for each kv_calc comment of the doc."""
        found, current = [], None
        fenced = False
        for line in self.DOC.read_text().splitlines():
            marker = self.MARKER.match(line)
            if marker or (line.startswith("#") and not fenced):
                current = None
            if marker:
                current = (shlex.split(marker.group(1)), [], [])
                found.append(current)
                continue
            if line.startswith("```"):
                fenced = not fenced
                if not fenced:  # a region ends with its block
                    current = None
                continue
            if current is not None:
                (current[1] if fenced else current[2]).append(line)
        return found

    def tool(self, args):
        with tempfile.TemporaryDirectory() as tmp:
            result_path = os.path.join(tmp, "result.json")
            out = io.StringIO()
            cwd = os.getcwd()
            try:
                os.chdir(REPO)
                with contextlib.redirect_stdout(out):
                    code = kv_calc.main(args, {"PATH": "/nonexistent",
                                               "FERRY_RESULT": result_path})
            finally:
                os.chdir(cwd)
            self.assertEqual(code, 0, args)
            return out.getvalue(), Path(result_path).read_text()

    def test_every_quoted_line_and_figure_is_printed(self):
        regions = self.regions()
        self.assertGreaterEqual(len(regions), 6)
        for args, lines, prose in regions:
            printed, result = self.tool(args)
            printed_lines = {line.rstrip() for line in printed.splitlines()}
            for line in lines:
                if line.strip():
                    self.assertIn(line.rstrip(), printed_lines, f"{args}: quoted line not printed")
            for figure in self.FIGURE.findall(" ".join(prose)):
                self.assertTrue(figure in printed or figure in result,
                                f"{args}: figure {figure} is not in the tool's output")

    def test_the_seed_figures_of_the_issue(self):
        # The old doc quoted 2,163,329 bf16 tokens where the tool gives 2,163,154 (TP 8, 0.9).
        text = self.DOC.read_text()
        self.assertNotIn("2,163,329", text)
        self.assertIn("2,163,154", text)


class Metadata(unittest.TestCase):
    """The `/// ferry` block: valid TOML, declaring what the job reads."""

    @classmethod
    def setUpClass(cls):
        lines = JOB.read_text().splitlines()
        if lines[0] != "# /// ferry":
            raise AssertionError("kv_calc.py must start with '# /// ferry'")
        end = lines.index("# ///")
        body = lines[1:end]
        cls.block_lines = body
        cls.toml_text = "\n".join(line[2:] if line.startswith("# ") else line[1:]
                                  for line in body)

    def test_every_line_is_a_comment(self):
        for line in self.block_lines:
            self.assertTrue(line.startswith("#"), line)

    def test_toml_declares_the_parameters(self):
        try:
            import tomllib
        except ImportError:
            self.skipTest("tomllib needs Python 3.11+ (running {})".format(sys.version.split()[0]))
        meta = tomllib.loads(self.toml_text)
        self.assertEqual(meta["interpreter"], "python3")
        self.assertTrue(meta["description"])
        self.assertIsInstance(meta["timeout"], int)
        declared = meta["params"]
        self.assertEqual(list(declared), list(kv_calc.PARAM_TYPES))
        for name, (kind, default) in kv_calc.PARAM_TYPES.items():
            spec = declared[name]
            if kind.startswith("list:"):
                self.assertEqual((spec["type"], spec["items"]), ("list", kind[5:]), name)
            else:
                self.assertEqual(spec["type"], kind, name)
            self.assertEqual(spec.get("default"), default, name)
            self.assertTrue(spec.get("help"), name)
        self.assertEqual(declared["kv_dtype"]["choices"], kv_calc.KV_DTYPE_CHOICES)
        self.assertEqual(declared["engine"]["choices"], kv_calc.ENGINES)
        self.assertEqual(declared["ssm_dtype"]["choices"], kv_calc.SSM_DTYPE_CHOICES)
        self.assertEqual(sorted(declared["model"]["choices"]), sorted(kv_calc.PRESETS))


class EndToEnd(unittest.TestCase):
    """The job as ferry runs it: a subprocess with FERRY_* set, under python3 -X dev."""

    def run_job(self, params_obj, extra_env=None, args=()):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FERRY_RUN_DIR": tmp,
                   "FERRY_JOB": "kv_calc", "FERRY_RESULT": os.path.join(tmp, "result.json")}
            if params_obj is not None:
                with open(os.path.join(tmp, "params.json"), "w") as f:
                    json.dump(params_obj, f)
                env["FERRY_PARAMS"] = os.path.join(tmp, "params.json")
            env.update(extra_env or {})
            env = {k: v for k, v in env.items() if v is not None}
            done = subprocess.run([sys.executable, "-X", "dev", str(JOB)] + list(args), cwd=tmp,
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
            result_path = Path(tmp, "result.json")
            result = json.loads(result_path.read_text()) if result_path.exists() else None
            return done, result

    def full_params(self, **overrides):
        # ferry passes the full, typed, defaults-applied object.
        return params(**overrides)

    def test_seed_result_keys(self):
        done, result = self.run_job(self.full_params(model_dir=str(CKPT), tp=8,
                                                     kv_memory_gib=17.4))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")  # -X dev: no warnings of any kind
        self.assertEqual(result["layers"], {"total": 60, "full_attention": 15,
                                            "sliding_window": 0, "linear": 45})
        self.assertEqual(result["kv_heads_per_gpu"], 1)
        for dtype, bpt, tokens in (("bf16", 15360, 641164), ("fp8_e4m3", 7680, 1282328)):
            self.assertEqual(result["kv"][dtype]["bytes_per_token"], bpt)
            self.assertEqual(result["kv"][dtype]["max_tokens"], tokens)
            self.assertEqual(sorted(result["kv"][dtype]["concurrent_requests"]),
                             ["131072", "262144", "32768"])
        self.assertEqual(result["state"]["bytes_per_request"], 24007680)
        self.assertIsInstance(result["warnings"], list)
        self.assertIn("fp8-kv-no-scales", [w["code"] for w in result["warnings"]])
        self.assertTrue(all(isinstance(a, str) for a in result["assumptions"]))
        # The report: a table with thousands separators, warnings and assumptions one a line.
        self.assertIn("1,282,328", done.stdout)
        self.assertIn("2,432,696", done.stdout)
        self.assertIn("warning [fp8-kv-no-scales]", done.stdout)
        self.assertIn("assumption: KV heads per GPU", done.stdout)

    def test_state_zero_for_plain_model(self):
        done, result = self.run_job(self.full_params(model="llama-3.1-8b", kv_memory_gib=20.0))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(result["state"]["bytes_per_request"], 0)

    def test_missing_keys_fall_back_to_defaults(self):
        done, result = self.run_job({"model": "deepseek-v3"})
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(result["kv"]["bf16"]["bytes_per_token"], 70272)

    def test_input_error_exit_2_with_error_result(self):
        # Bad input: exit 2, one clear stderr line, and a result holding the error.
        done, result = self.run_job(self.full_params(model_dir="/nonexistent/ckpt"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("model_dir /nonexistent/ckpt is not a directory", done.stderr)
        self.assertEqual(result, {"error": {
            "kind": "bad-input", "field": "model_dir", "value": "/nonexistent/ckpt",
            "message": "model_dir /nonexistent/ckpt is not a directory on this host"}})

    def test_no_model_exit_2(self):
        done, result = self.run_job(self.full_params())
        self.assertEqual(done.returncode, 2)
        self.assertEqual(result["error"]["field"], "model")
        self.assertIn("no model given", done.stderr)

    def test_unknown_layer_kind_exit_2(self):
        cfg = fixture_config("llama-3.1-8b")
        cfg["layer_types"] = ["full_attention"] * 31 + ["mystery_attention"]
        done, result = self.run_job(self.full_params(config=cfg))
        self.assertEqual(done.returncode, 2)
        self.assertIn("kv_calc: error: config.json layer_types[31] = 'mystery_attention'",
                      done.stderr)
        self.assertEqual(result["error"]["field"], "layer_types[31]")
        self.assertEqual(result["error"]["value"], "mystery_attention")

    def test_plan_mode(self):
        done, result = self.run_job(self.full_params(
            mode="plan", model="qwen3.5-397b-a17b-nvfp4", gpus=[8], gpu_memory_gib=95.59,
            context=[262144]))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")
        self.assertEqual(result["mode"], "plan")
        self.assertEqual(result["pick"]["kv_dtype"], "fp8_e4m3")
        self.assertIn("pick: 8 GPUs", done.stdout)
        self.assertIn("launch: python3 -m sglang.launch_server", done.stdout)

    def test_by_hand(self):
        done, result = self.run_job(None, extra_env={"FERRY_RESULT": None},
                                    args=["model=qwen3.5-397b-a17b", "tp=8", "kv_memory_gib=17.4",
                                          "kv_dtype=bf16,fp8_e4m3"])
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")
        self.assertIsNone(result)
        self.assertIn("641,164", done.stdout)

    def test_by_hand_unknown_key(self):
        done, _ = self.run_job(None, args=["modle=llama-3.1-8b"])
        self.assertEqual(done.returncode, 2)
        self.assertIn("unknown parameter 'modle'", done.stderr)


if __name__ == "__main__":
    unittest.main()
