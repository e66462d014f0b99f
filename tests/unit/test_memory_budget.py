# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""nemo_ais.preflight.memory_budget: hand-worked arithmetic, and every shipped config fits.

Hand values are computed in the comments from the model's config.json numbers
(nemo_ais.preflight.MODEL_SHAPES) and the formulas in docs/cluster.md; GiB = 2**30 bytes.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

import pytest
from shipped_configs import CONFIG_DIR, FULL_CONFIGS

from nemo_ais.preflight import MODEL_SHAPES, load_config, memory_budget as mb

REPO = Path(__file__).resolve().parents[2]
QWEN8B = CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"
MOE = CONFIG_DIR / "qwen3_30b_a3b_2n8g_fp8_ep8.yaml"
LLAMA = CONFIG_DIR / "llama3.1_8b_2n8g_fp8_pp2.yaml"
GIB = 2**30


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    """Shapes from the table, whatever the developer's HF cache holds."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@functools.cache
def _cached(path: Path) -> dict:
    return load_config(path)


def _cfg(path: Path, **sets: object) -> dict:
    """A copy of a shipped config with dotted keys set (``a__b`` means ``a.b``)."""
    cfg = copy.deepcopy(_cached(path))
    for dotted, value in sets.items():
        *parents, leaf = dotted.split("__")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


# ------------------------------------------------------------------------ parameter counts


def test_total_params_match_the_published_sizes():
    # Qwen3-0.6B, per layer: q 1024x2048 + k, v 1024x1024 each + o 2048x1024 = 6,291,456;
    # MLP 3 x 1024 x 3072 = 9,437,184; norms 2 x 1024 + q/k norms 2 x 128 = 2,304
    # -> 15,730,944 x 28 = 440,466,432; + tied embedding 151,936 x 1024 = 155,582,464
    # + final norm 1,024 = 596,049,920 (the model card's count).
    assert MODEL_SHAPES["qwen3-0.6b"].total_params() == 596_049_920
    # Qwen3-8B: attention 2 x 4096 x 4096 + 2 x 4096 x 1024 = 41,943,040; MLP 3 x 4096 x
    # 12288 = 150,994,944; norms 8,192 + 256 -> 192,946,432 x 36 = 6,946,071,552;
    # untied 2 x 151,936 x 4096 = 1,244,659,712; + 4,096 -> 8,190,735,360 (8.19 B).
    assert MODEL_SHAPES["qwen3-8b"].total_params() == 8_190_735_360
    # Qwen3-30B-A3B: attention 2048 x 4096 x 2 + 2 x 2048 x 512 = 18,874,368; experts
    # 128 x 3 x 2048 x 768 = 603,979,776; router 128 x 2048 = 262,144; norms 4,096 + 256
    # -> 623,120,640 x 48 = 29,909,790,720; + 2 x 151,936 x 2048 = 622,329,856; + 2,048
    # -> 30,532,122,624 (30.5 B).
    assert MODEL_SHAPES["qwen3-30b-a3b"].total_params() == 30_532_122_624
    # Llama-3.1-8B: attention 41,943,040; MLP 3 x 4096 x 14336 = 176,160,768; norms 8,192
    # -> 218,112,000 x 32 = 6,979,584,000; + 2 x 128,256 x 4096 = 1,050,673,152; + 4,096
    # -> 8,030,261,248 (8.03 B).
    assert MODEL_SHAPES["llama-3.1-8b"].total_params() == 8_030_261_248


def test_one_named_field_table_of_ten_names_each_stating_its_source():
    assert sorted(MODEL_SHAPES) == [
        "llama-3.1-8b",
        "llama-3.1-8b-instruct",
        "qwen2.5-1.5b",
        "qwen2.5-1.5b-instruct",
        "qwen3-0.6b",
        "qwen3-1.7b",
        "qwen3-30b-a3b",
        "qwen3-30b-a3b-base",
        "qwen3-8b",
        "qwen3-8b-base",
    ]
    for key, shape in MODEL_SHAPES.items():
        assert shape.source.startswith("hf:") and shape.source.endswith("config.json"), key
    # an alias is the same object, not a copy that could drift
    assert MODEL_SHAPES["qwen3-8b-base"] is MODEL_SHAPES["qwen3-8b"]
    # named fields, not positions: the MoE row's expert fields
    moe = MODEL_SHAPES["qwen3-30b-a3b"]
    assert (moe.num_experts, moe.moe_intermediate_size, moe.experts_per_token) == (128, 768, 8)


def test_unknown_model_names_the_field():
    with pytest.raises(KeyError, match=r"policy\.model_name='org/Mystery-7B': no config\.json"):
        mb.model_shape("org/Mystery-7B")
    assert mb.model_shape("/ckpts/Qwen3-8B/") is MODEL_SHAPES["qwen3-8b"]


# ------------------------------------------------------------------ sharding and bytes


def test_llama_pp2_busiest_stage_holds_16_layers_and_the_output_layer():
    # Stage 0: 16 x 218,112,000 + embedding 525,336,576 = 4,015,128,576.
    # Stage 1: 16 x 218,112,000 + output layer 525,336,576 + final norm 4,096 = 4,015,132,672.
    shape = MODEL_SHAPES["llama-3.1-8b"]
    assert mb.trainer_params(_cfg(LLAMA), shape) == (4_015_132_672, 0)


def test_uneven_pipeline_stages():
    cfg = _cfg(
        LLAMA,
        policy__megatron_cfg__pipeline_model_parallel_size=4,
        policy__megatron_cfg__num_layers_in_first_pipeline_stage=7,
        policy__megatron_cfg__num_layers_in_last_pipeline_stage=5,
    )
    # 32 - 7 - 5 = 20 layers over the 2 middle stages: 10 each.
    assert mb.pipeline_stages(cfg, 32, 4) == [7, 10, 10, 5]
    assert mb.pipeline_stages(_cfg(LLAMA), 32, 2) == [16, 16]


def test_moe_experts_split_by_ep_dense_by_tp_and_adam_by_expert_dp():
    shape = MODEL_SHAPES["qwen3-30b-a3b"]
    cfg = _cfg(MOE)
    # TP 2, EP 8, ETP 1, PP 1, 16 GPUs.
    # Dense per layer: 18,874,368 / 2 + replicated (4,096 + 256 + 262,144) = 9,703,680;
    # x 48 = 465,776,640; + embedding and output layer 2 x 311,164,928 / 2 = 311,164,928;
    # + final norm 2,048 -> 776,943,616.
    # Experts per layer: 603,979,776 / 8 = 75,497,472; x 48 = 3,623,878,656.
    assert mb.trainer_params(cfg, shape) == (776_943_616, 3_623_878_656)
    b = mb.budget(cfg, name="moe")
    # Adam, precision-aware (10 B/param), dense over DP 8, experts over expert DP 16 / 8 = 2:
    # 10 x (776,943,616 / 8 + 3,623,878,656 / 2) = 19,090,572,800 B = 17.779 GiB.
    assert b.optimizer == pytest.approx(19_090_572_800 / GIB, rel=1e-9)
    # Weights and grads, BF16: 2 x 4,400,822,272 = 8,801,644,544 B = 8.197 GiB each.
    assert b.weights == b.grads == pytest.approx(8_801_644_544 / GIB, rel=1e-9)
    assert b.resident_master == 0.0  # precision-aware: the master is in optimizer.state


def test_optimizer_variants():
    # Same config, three optimizer settings: the ratios follow from 10 / 12 B per param.
    pa = mb.budget(_cfg(QWEN8B, policy__megatron_cfg__optimizer__use_precision_aware_optimizer=True))
    plain = mb.budget(_cfg(QWEN8B, policy__megatron_cfg__optimizer__use_precision_aware_optimizer=False))
    offload = mb.budget(
        _cfg(
            QWEN8B,
            policy__megatron_cfg__optimizer__optimizer_cpu_offload=True,
            policy__megatron_cfg__optimizer__optimizer_offload_fraction=1.0,
        )
    )
    # Plain Adam: fp32 master 4 + moments 8 = 12 B; precision-aware: 2 + 8 = 10 B.
    assert plain.optimizer / pa.optimizer == pytest.approx(12 / 10)
    assert plain.resident_master == pytest.approx(plain.optimizer / 3)  # 4 of 12 B stay
    assert plain.generate - pa.generate == pytest.approx(plain.resident_master)
    assert offload.optimizer == 0.0 and offload.resident_master == 0.0
    # Host: the whole fp32 Adam shard (12 B) lives there instead.
    assert offload.host_per_gpu - (offload.weights + offload.grads + offload.vllm_weights) == (
        pytest.approx(plain.optimizer)
    )


def test_activation_estimate_with_and_without_checkpointing():
    shape = MODEL_SHAPES["qwen3-8b"]
    cfg = _cfg(QWEN8B, policy__megatron_cfg__activation_checkpointing=False)
    # Qwen3-8B, TP 2 + SP, per token and layer (elements): norms 4 x 4096 / 2 = 8,192;
    # q, k, v, attention out 2 x (32 + 8) x 128 / 2 = 5,120; SwiGLU 3 x 12288 / 2 = 18,432
    # -> 31,744 x 2 B = 63,488 B.
    assert mb.activation_bytes_per_token_layer(cfg, shape) == 63_488
    # 4,096 tokens (mbs 1 x 4096, packed) x 36 layers x 63,488 B = 9,361,686,528 B.
    assert mb.activations_gib(cfg, shape, 36) == pytest.approx(9_361_686_528 / GIB)
    ckpt = _cfg(QWEN8B, policy__megatron_cfg__activation_checkpointing=True)
    # Checkpointed: 4,096 x (36 layers x 2 x 4096 / 2 B + one layer's 63,488 B)
    # = 4,096 x 210,944 = 864,026,624 B.
    assert mb.activations_gib(ckpt, shape, 36) == pytest.approx(864_026_624 / GIB)
    # PP 2 (Llama): stage 0 holds 2 micro-batches in flight x 16 layers; per token-layer
    # 2 x (4 x 4096 + 2 x 40 x 128 + 3 x 14336) = 2 x 69,632 = 139,264 B (TP 1)
    # -> 2 x 16 x 4,096 x 139,264 = 18,253,611,008 B.
    llama = _cfg(LLAMA, policy__megatron_cfg__activation_checkpointing=False)
    assert mb.activations_gib(llama, MODEL_SHAPES["llama-3.1-8b"], 16) == pytest.approx(18_253_611_008 / GIB)


def test_logits_bytes():
    shape = MODEL_SHAPES["llama-3.1-8b"]
    plain = _cfg(LLAMA, policy__megatron_cfg__defer_fp32_logits=False)
    # 4,096 tokens x 128,256 vocab / TP 1 = 525,336,576 x 12 B = 6,304,038,912 B (with grad).
    assert mb.logits_gib(plain, shape, 4096, grad=True) == pytest.approx(6_304_038_912 / GIB)
    # defer_fp32_logits: + 2 B of BF16 logits -> 525,336,576 x 14 B = 7,354,712,064 B.
    deferred = _cfg(LLAMA, policy__megatron_cfg__defer_fp32_logits=True)
    assert mb.logits_gib(deferred, shape, 4096, grad=True) == pytest.approx(7_354_712_064 / GIB)
    # logprob pass (no saved softmax), 8,192 tokens: 8,192 x 128,256 x (8 + 2) B.
    assert mb.logits_gib(deferred, shape, 8192, grad=False) == pytest.approx(8192 * 128_256 * 10 / GIB)


def test_vllm_weights_and_kv_cache():
    shape = MODEL_SHAPES["qwen3-8b"]
    cfg = _cfg(QWEN8B)
    # FP8, TP 1: linear 192,937,984 x 36 = 6,945,767,424 params x (1 B + 4 B / 128^2)
    # = 6,945,767,424 + 1,695,744 = 6,947,463,168 B; BF16: norms 36 x 8,448 + 4,096 =
    # 308,224 and embedding + lm_head 1,244,659,712 -> 2 x 1,244,967,936 = 2,489,935,872 B.
    # Total 9,437,399,040 B.
    assert mb.vllm_weights_gib(cfg, shape) == pytest.approx(9_437_399_040 / GIB)
    # K and V: 2 x 36 layers x 8 kv heads x 128 x 1 B (FP8) = 73,728 B per token.
    assert mb.kv_bytes_per_token(cfg, shape) == 73_728
    bf16 = _cfg(QWEN8B, policy__generation__vllm_cfg__kv_cache_dtype="auto")
    assert mb.kv_bytes_per_token(bf16, shape) == 147_456
    b = mb.budget(cfg)
    # share 0.6 x 80 = 48 GiB; KV = 48 - 8.789 - 4 (runtime) GiB.
    assert b.vllm_share == pytest.approx(48.0)
    assert b.kv_cache == pytest.approx(48.0 - 9_437_399_040 / GIB - mb.VLLM_RUNTIME_GIB)
    assert b.kv_max_len_seqs == pytest.approx(b.kv_cache * GIB / (73_728 * 4096))


def test_phases_add_up():
    b = mb.budget(_cfg(QWEN8B), name="qwen3_8b")
    runtime = mb.TRAINER_RUNTIME_GIB + mb.VLLM_ASLEEP_GIB
    assert b.train == pytest.approx(b.weights + b.grads + b.optimizer + b.activations + b.logits + runtime)
    assert b.logprob == pytest.approx(b.weights + b.optimizer + b.logprob_logits + runtime)
    assert b.generate == pytest.approx(b.vllm_share + b.resident_master + mb.TRAINER_IDLE_GIB)
    assert b.host_per_node == pytest.approx(8 * b.host_per_gpu)
    assert b.peak == max(b.train, b.logprob, b.refit, b.generate)


def test_rejects_what_it_does_not_model():
    with pytest.raises(ValueError, match=r"policy\.megatron_cfg\.enabled is false"):
        mb.budget(_cfg(QWEN8B, policy__megatron_cfg__enabled=False), name="x")
    with pytest.raises(ValueError, match=r"colocated\.enabled is false"):
        mb.budget(_cfg(QWEN8B, policy__generation__colocated__enabled=False), name="x")
    with pytest.raises(ValueError, match="optimizer: only adam"):
        mb.budget(_cfg(QWEN8B, policy__megatron_cfg__optimizer__optimizer="sgd"), name="x")


# ------------------------------------------------------------------ the shipped configs


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_shipped_config_fits_an_h100(path):
    b = mb.budget(_cached(path), name=str(path.relative_to(REPO)))
    assert not b.problems(), "\n".join(b.problems())
    assert b.peak <= mb.HBM_GIB


def test_an_overflow_names_the_config_phase_and_amount():
    b = mb.budget(_cfg(MOE), name="qwen3_30b_a3b_2n8g_fp8_ep8", gpu_gib=40.0)
    problems = b.problems()
    assert any(
        re.fullmatch(
            r"qwen3_30b_a3b_2n8g_fp8_ep8: train needs \d+\.\d GiB per GPU > 40 GiB "
            r"\(over by \d+\.\d GiB\)",
            p,
        )
        for p in problems
    ), problems
    tiny = mb.budget(_cfg(MOE, policy__generation__vllm_cfg__gpu_memory_utilization=0.2))
    assert any("holds" in p and "max_model_len sequences, vLLM needs >= 1" in p for p in tiny.problems())


def test_cli_prints_the_table_and_fails_on_overflow(capsys):
    assert mb.main([str(QWEN8B), str(CONFIG_DIR / "arms" / "fp8_ais.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| config | model / layout |") and len(out) == 3  # mixin skipped
    assert out[2].startswith("| qwen3_8b_2n8g_fp8 | Qwen/Qwen3-8B; 16 GPUs: TP2 PP1 CP1 DP8")
    assert mb.main([str(MOE), "--gpu-gib", "40"]) == 1
    assert "qwen3_30b_a3b_2n8g_fp8_ep8: train needs" in capsys.readouterr().err
    assert mb.main([str(QWEN8B), "policy.model_name=org/Mystery-7B"]) == 1
    assert "qwen3_8b_2n8g_fp8.yaml: cannot budget: \"policy.model_name='org/Mystery-7B'" in (capsys.readouterr().err)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("cluster.gpus_per_node=0", "cluster.gpus_per_node=0 is invalid: expected an integer >= 1"),
        (
            "policy.megatron_cfg.pipeline_model_parallel_size=36",
            "no data-parallel rank (DP = GPUs / (TP x PP x CP) < 1",
        ),
        (
            "policy.generation.vllm_cfg.gpu_memory_utilization=2",
            "gpu_memory_utilization=2 is invalid: expected a fraction in (0, 1]",
        ),
        # what the offline check refuses, the budget refuses (float() took both)
        (
            "policy.generation.vllm_cfg.gpu_memory_utilization=true",
            "gpu_memory_utilization=True is invalid: expected a fraction in (0, 1]",
        ),
        (
            "policy.generation.vllm_cfg.gpu_memory_utilization='0.5'",
            "gpu_memory_utilization='0.5' is invalid: expected a fraction in (0, 1]",
        ),
        (
            "policy.generation.vllm_cfg.gpu_memory_utilization=null",
            "policy.generation.vllm_cfg.gpu_memory_utilization is not set",
        ),
    ],
)
def test_sizes_it_cannot_budget_are_one_line_not_a_traceback(capsys, override, said):
    assert mb.main([str(QWEN8B), override]) == 1  # was ZeroDivisionError / "needs 161 GiB"
    err = capsys.readouterr().err
    assert "qwen3_8b_2n8g_fp8.yaml: cannot budget: " in err and said in err


def test_no_yaml_argument_is_a_usage_error_not_an_empty_table(capsys):
    # an argument without .yaml reads as an override: the budget of nothing was an empty table and exit 0
    with pytest.raises(SystemExit, match="2"):
        mb.main([f"{QWEN8B}.bak"])
    assert "give at least one .yaml config, then key=value overrides" in capsys.readouterr().err


def test_docs_table_is_the_generated_one():
    """docs/cluster.md carries the table this command prints for the shipped configs."""
    # The command's order: configs/nemo_rl/*.yaml, then configs/nemo_rl/experiments/*.yaml.
    paths = sorted(CONFIG_DIR.glob("*.yaml")) + sorted(CONFIG_DIR.glob("experiments/*.yaml"))
    assert set(paths) == set(FULL_CONFIGS)
    table = mb.markdown_table([mb.budget(_cached(p), name=p.stem) for p in paths])
    assert table in (REPO / "docs" / "cluster.md").read_text(), (
        "docs/cluster.md is stale: paste the output of "
        "`python -m nemo_ais.preflight.memory_budget configs/nemo_rl/*.yaml "
        "configs/nemo_rl/experiments/*.yaml`"
    )


def test_shapes_come_from_the_cached_config_json_first(tmp_path):
    # the same lookup as the checks (tests/unit/test_cluster_configs.py): HF_HOME/hub layout
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc")
    (repo / "snapshots" / "abc").mkdir(parents=True)
    config = {"hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32}
    (repo / "snapshots" / "abc" / "config.json").write_text(
        json.dumps({**config, "vocab_size": 151936, "model_type": "qwen3"})
    )
    shape = mb.model_shape("Qwen/Qwen3-8B")
    assert shape.num_layers == 40 and shape.source == str(repo / "snapshots/abc/config.json")
