"""Unit tests for jobs/kv_calc.py: the arithmetic against the reference figures of issue 3,
the warnings, the config readers, memory probing with a fake nvidia-smi, calibration, and the
job run end to end as ferry runs it (FERRY_PARAMS / FERRY_RESULT).

Run: cd tests/kv_calc && python3 -m unittest -v
"""

import importlib.util
import json
import os
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
            r = run(model=name, tp=8, kv_memory_gib=40.0)
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

    def test_gpt_oss_vllm_shared_pool(self):
        r = run(model="gpt-oss-120b", tp=1, kv_dtype=["bf16"], kv_memory_gib=40.0,
                engine="vllm")
        kv = r["kv"]["bf16"]
        self.assertEqual(kv["max_tokens"], kv_calc.vllm_tokens(int(40.0 * GIB), 8 * 128 * 2,
                                                               18, 16))
        self.assertIn("engine-approximation", codes(r))
        self.assertLess(kv["shared_pool_concurrent_requests"]["131072"],
                        kv["concurrent_requests"]["131072"])

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

    def test_input_error_exit_2_no_result(self):
        done, result = self.run_job(self.full_params(model_dir="/nonexistent/ckpt"))
        self.assertEqual(done.returncode, 2)
        self.assertIsNone(result)
        self.assertIn("model_dir /nonexistent/ckpt is not a directory", done.stderr)

    def test_no_model_exit_2(self):
        done, result = self.run_job(self.full_params())
        self.assertEqual(done.returncode, 2)
        self.assertIsNone(result)
        self.assertIn("no model given", done.stderr)

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
