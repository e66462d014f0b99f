# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""configs/nemo_rl/: every YAML loads, validates and has a consistent parallel layout.

The checks themselves (nemo_ais.preflight) are tested on broken variants of
the real configs: each broken override must fail the named check with a message that
names the offending field and the numbers.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
from pathlib import Path

import pytest
from shipped_configs import CONFIG_DIR, flat, launcher, write_input_amax_files

from nemo_ais import preflight as pf
from nemo_ais.config import CorrectionConfig

ALL_YAML = sorted(CONFIG_DIR.rglob("*.yaml"))
BASE = CONFIG_DIR / "grpo_ais_base.yaml"
QWEN8B = CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"
MOE = CONFIG_DIR / "qwen3_30b_a3b_2n8g_fp8_ep8.yaml"
LLAMA = CONFIG_DIR / "llama3.1_8b_2n8g_fp8_pp2.yaml"
SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
# The low-precision rollout formats on Qwen3-8B (arms/nvfp4_w4a16, nvfp4_w4a4, mxfp8)
W4A16 = CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_w4a16_ais.yaml"
W4A4 = CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_w4a4_ais.yaml"
MXFP8 = CONFIG_DIR / "experiments" / "qwen3_8b_mxfp8_ais.yaml"
QARL = CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_qarl_tbpo.yaml"
FORMATS = {"nvfp4_w4a16": W4A16, "nvfp4_w4a4": W4A4, "mxfp8": MXFP8}
# Qwen3-30B-A3B's experts (moe_intermediate 768) on a dense config: 768 / 16 = 48 is not a
# multiple of 32 (MXFP8) and 768 / 32 = 24 not of 16 (NVFP4), at TPs that split its heads.
MOE_MODEL = "policy.model_name=Qwen/Qwen3-30B-A3B"
# the smoke config on NeMo-RL's DTensor trainer (no FP8 KV cache: that needs Megatron)
DTENSOR = (
    "policy.megatron_cfg.enabled=false",
    "policy.dtensor_cfg.enabled=true",
    "policy.generation.vllm_cfg.kv_cache_dtype=auto",
)
# async GRPO needs a BF16 KV cache (fp8_rollout) and vLLM's async engine (async_grpo)
ASYNC_BF16_KV = ("grpo.async_grpo.enabled=true", "policy.generation.vllm_cfg.kv_cache_dtype=auto")
# NeMo-Gym rollouts (main): an async vLLM engine
NEMO_GYM = (
    *ASYNC_BF16_KV,
    "policy.generation.vllm_cfg.async_engine=true",
    "+policy.generation.vllm_cfg.expose_http_server=true",
    "+env.should_use_nemo_gym=true",
)


@functools.cache
def _cached(path: Path, overrides: tuple[str, ...]) -> dict:
    return pf.load_config(path, list(overrides))


def _load(path: Path, overrides=()) -> dict:
    """pf.load_config, memoized (0.2 s per load on a 2-core CI machine); returns a copy."""
    return copy.deepcopy(_cached(path, tuple(overrides)))


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def test_config_tree_is_complete():
    names = {_rel(p) for p in ALL_YAML}
    for arm in ("bf16", "fp8_none", "fp8_tis", "fp8_ais"):
        assert f"arms/{arm}.yaml" in names
        assert f"experiments/qwen3_8b_{arm}.yaml" in names
        assert f"experiments/smoke_{arm}.yaml" in names
    for path in (BASE, QWEN8B, MOE, LLAMA, SMOKE, *FORMATS.values()):
        assert path.is_file()
    for arm in FORMATS:
        assert f"arms/{arm}.yaml" in names


@pytest.mark.parametrize("path", ALL_YAML, ids=_rel)
def test_every_yaml_loads_and_passes_checks(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the job's working directory, with the W4A4 calibration in place
    monkeypatch.setenv("NEMO_RL_DIR", str(tmp_path))  # where the check looks for it when set
    write_input_amax_files(tmp_path)
    cfg = _load(path)
    assert "defaults" not in cfg
    leaves = flat(cfg)
    unresolved = [k for k, v in leaves.items() if isinstance(v, str) and "${" in v]
    assert not unresolved, f"{_rel(path)}: unresolved interpolations {unresolved}"
    # every shipped config runs on NeMo-RL main (v0.7.0: test_main_only_formats_fail_...)
    results = pf.validate_config(cfg, _rel(path), nemo_rl_version="main")  # raises on a failure
    names = {r.name for r in results}
    if pf.is_mixin(cfg):
        assert _rel(path).startswith("arms/")
        # the checks that read a mixin's own sections: loss_fn.ais, and the refit sections where it has them
        assert names == {"loss_fn.ais"} | ({"refit_sections"} if any(k.startswith("ais_") for k in cfg) else set())
    else:
        assert {
            "loss_fn.ais",
            "entry_point_keys",
            "checkpointing",
            "fp8_rollout",
            "trainer_parallel",
            "batch",
            "vllm_parallel",
        } <= names
        # mode tbpo: the one expected warning, that its band replaces loss_fn.ratio_clip_*
        tbpo = flat(cfg).get("loss_fn.ais.mode") == "tbpo"
        told = [r for r in results if r.status == "warn" and "mode='tbpo'" in r.detail]
        assert len(told) == tbpo, [str(r) for r in told]
        # a format Hopper cannot run natively: the one expected warning, which GPUs it needs
        blackwell = pf.rollout_format(cfg) in ("nvfp4_w4a4", "mxfp8")
        gpu = [r for r in results if r.status == "warn" and r.name == "rollout_gpu"]
        assert len(gpu) == blackwell, [str(r) for r in gpu]
        told += gpu
        rest = [r for r in results if r not in told]
        assert all(r.status == "ok" for r in rest), [str(r) for r in rest]


def _amax_warnings(environ):
    results = pf.check_config(_load(W4A4), nemo_rl_version="main", environ=environ)
    assert not [r for r in results if r.status == "fail"]
    return [r.detail for r in results if r.status == "warn" and "input_amax_file" in r.detail]


def test_a_w4a4_calibration_file_not_found_here_is_a_warning(tmp_path, monkeypatch):
    # the launcher refuses it before Ray (test_driver_main); offline it may live on the cluster only
    monkeypatch.chdir(tmp_path)
    (told,) = _amax_warnings({})
    assert "ais_nvfp4_refit.input_amax_file='calibration/qwen3_8b_nvfp4_input_amax.json' is not a file here (set " in (
        told
    )


def test_a_relative_calibration_file_is_looked_for_where_the_job_runs(tmp_path, monkeypatch):
    # both launchers run the job in NEMO_RL_DIR: a relative input_amax_file resolves there, not where the check runs
    job_dir, here = tmp_path / "nemo-rl", tmp_path / "here"
    rel = "calibration/qwen3_8b_nvfp4_input_amax.json"
    (here / "calibration").mkdir(parents=True)
    (here / rel).write_text("{}")
    monkeypatch.chdir(here)
    assert _amax_warnings({}) == []  # no NEMO_RL_DIR: from here
    (told,) = _amax_warnings({"NEMO_RL_DIR": str(job_dir)})
    assert f"{rel!r} is not a file under NEMO_RL_DIR={job_dir}, where the job runs" in told
    (job_dir / "calibration").mkdir(parents=True)
    (job_dir / rel).write_text("{}")
    (here / rel).unlink()
    assert _amax_warnings({"NEMO_RL_DIR": str(job_dir)}) == []


@pytest.mark.parametrize("path", ALL_YAML, ids=_rel)
def test_every_yaml_header_says_what_hardware_and_launch(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lower())
    text = "\n".join(header)
    assert header, f"{_rel(path)} has no header comment"
    for word in ("runs", "hardware", "launch"):
        assert word in text, f"{_rel(path)}: header does not say its {word}"


def test_exemplar_ais_keys_equal_correction_config_fields_and_defaults():
    raw = _load(BASE)["loss_fn"]["ais"]
    assert set(raw) == set(CorrectionConfig.model_fields)
    defaults = CorrectionConfig()
    assert raw == defaults.model_dump()


def test_exemplar_keeps_nemo_rl_importance_sampling_off():
    loss = _load(BASE)["loss_fn"]
    for knob, off in pf.AIS_CONFLICTS.items():
        assert loss[knob] == off, knob


# Hand-worked layouts (see each YAML's header): world = nodes x gpus; DP = world/(TP PP CP).
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (QWEN8B, dict(world=16, tp=2, pp=1, cp=1, ep=1, etp=1, dp=8, vllm_tp=1, vllm_engines=16)),
        (MOE, dict(world=16, tp=2, pp=1, cp=1, ep=8, etp=1, dp=8, vllm_tp=2, vllm_engines=8)),
        (LLAMA, dict(world=16, tp=1, pp=2, cp=1, ep=1, etp=1, dp=8, vllm_tp=1, vllm_engines=16)),
        (SMOKE, dict(world=1, tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, vllm_tp=1, vllm_engines=1)),
    ],
    ids=lambda x: x.name if isinstance(x, Path) else "",
)
def test_parallel_layout_hand_worked(path, expected):
    lay = pf.parallel_layout(_load(path))
    assert {k: getattr(lay, k) for k in expected} == expected


def test_moe_config_expert_arithmetic():
    cfg = _load(MOE)
    dims = pf.find_model_shape(cfg["policy"]["model_name"])
    lay = pf.parallel_layout(cfg)
    assert dims.num_experts == 128 and dims.num_experts % lay.ep == 0  # 16 experts per rank
    assert (lay.world // lay.pp) % (lay.ep * lay.etp) == 0  # expert DP = 16 / 8 = 2
    assert dims.moe_intermediate_size / lay.vllm_tp == 384 == 3 * pf.FP8_BLOCK
    four_nodes = _load(MOE, ["cluster.num_nodes=4"])
    assert pf.parallel_layout(four_nodes).dp == 16
    pf.validate_config(four_nodes)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_smoke_config_fits_any_gpu_count_on_one_node(gpus):
    pf.validate_config(_load(SMOKE, [f"cluster.gpus_per_node={gpus}"]))


def _arm_cfgs(prefix: str) -> dict[str, dict[str, object]]:
    arms = ("bf16", "fp8_none", "fp8_tis", "fp8_ais")
    return {a: flat(_load(CONFIG_DIR / "experiments" / f"{prefix}_{a}.yaml")) for a in arms}


_RUN_NAME_KEYS = {
    "logger.wandb.name",
    "logger.swanlab.name",
    "logger.mlflow.run_name",
    "logger.log_dir",
    "checkpointing.checkpoint_dir",
}


@pytest.mark.parametrize("prefix", ["qwen3_8b", "smoke"])
def test_arms_differ_only_in_rollout_precision_and_correction_mode(prefix):
    arms = _arm_cfgs(prefix)
    ref = arms["fp8_ais"]
    modes = {"bf16": "none", "fp8_none": "none", "fp8_tis": "tis", "fp8_ais": "ais"}
    for arm, leaves in arms.items():
        assert leaves.keys() == ref.keys(), arm
        diff = {k for k in ref if leaves[k] != ref[k]} - _RUN_NAME_KEYS
        if arm == "bf16":
            assert leaves["policy.generation.vllm_cfg.precision"] == "bfloat16"
            assert leaves["policy.generation.vllm_cfg.kv_cache_dtype"] == "auto"
            assert diff == {
                "loss_fn.ais.mode",
                "policy.generation.vllm_cfg.precision",
                "policy.generation.vllm_cfg.kv_cache_dtype",
                "policy.generation.vllm_cfg.use_deep_gemm",
                "ais_fp8_refit.enabled",  # no FP8 weights to quantize at refit
            }
        else:
            assert leaves["policy.generation.vllm_cfg.precision"] == "fp8"
            assert diff == (set() if arm == "fp8_ais" else {"loss_fn.ais.mode"})
        assert leaves["loss_fn.ais.mode"] == modes[arm]
    names = {leaves["logger.wandb.name"] for leaves in arms.values()}
    assert len(names) == 4  # separate log / checkpoint directories per arm


# The rollout-format keys each format arm sets on top of its model config (the AIS arm)
_FORMAT_KEYS = {
    "nvfp4_w4a16": {
        "policy.generation.quant_cfg",
        "policy.generation.real_quant",
        "policy.generation.real_quant_export_cpu_offload",
        "policy.generation.real_quant_ignore",
        "policy.generation.vllm_cfg.precision",
        "policy.generation.vllm_cfg.kv_cache_dtype",
        "policy.generation.vllm_cfg.use_deep_gemm",
        "ais_fp8_refit.enabled",  # precision bfloat16: no block-FP8 refit
        "ais_nvfp4_refit.enabled",  # nemo_ais's NVFP4 refit of the BF16 trainer's weights
    },
    "mxfp8": {
        "policy.generation.vllm_cfg.is_mx",
        "policy.generation.vllm_cfg.kv_cache_dtype",
        "policy.generation.vllm_cfg.use_deep_gemm",
        "policy.generation.vllm_cfg.pow2_weight_scaling_factors",
        "policy.generation.vllm_cfg.pow2_activation_scaling_factors",
        "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
    },
}
_FORMAT_KEYS["nvfp4_w4a4"] = _FORMAT_KEYS["nvfp4_w4a16"] | {
    "ais_nvfp4_refit.format",  # nvfp4_w4a4: the refit streams input_scale too
    "ais_nvfp4_refit.input_amax_file",  # Qwen3-8B's static input amaxes (the experiment's)
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_format_arms_differ_from_the_fp8_ais_arm_only_in_rollout_format_keys(fmt):
    ref = flat(_load(CONFIG_DIR / "experiments" / "qwen3_8b_fp8_ais.yaml"))
    leaves = flat(_load(FORMATS[fmt]))
    diff = {k for k in ref.keys() | leaves.keys() if ref.get(k, "<absent>") != leaves.get(k)}
    assert diff - _RUN_NAME_KEYS == _FORMAT_KEYS[fmt]
    assert leaves["loss_fn.ais.mode"] == "ais"
    assert leaves["policy.megatron_cfg.enabled"] is True  # a BF16 Megatron trainer
    assert leaves["policy.megatron_cfg.fp8_cfg.enabled"] is False
    assert pf.rollout_format(_load(FORMATS[fmt])) == fmt
    assert leaves["policy.generation.vllm_cfg.kv_cache_dtype"] == "auto"  # weights only


def test_qarl_arm_differs_from_the_w4a16_arm_in_trainer_loss_and_refit_only():
    """Same rollout format (the MLP linears NVFP4 W4A16, the rest BF16): the QARL arm swaps
    the BF16 trainer + AIS for NeMo-RL's fake-quant trainer + TBPO, and the refit."""
    ref, leaves = flat(_load(W4A16)), flat(_load(QARL))
    diff = {k for k in ref.keys() | leaves.keys() if ref.get(k, "<absent>") != leaves.get(k)}
    assert diff - _RUN_NAME_KEYS == {
        "policy.quant_cfg",  # NeMo-RL's QAT worker (QARL), upstream's 8B QARL recipe's file
        "policy.generation.quant_cfg",  # the same recipe (MLP-only; attention ignored anyway)
        "loss_fn.ais.mode",  # tbpo
        "loss_fn.token_level_loss",  # false: TBPO's objective is a mean over sequences
        "ais_nvfp4_refit.enabled",  # the QAT worker exports packed NVFP4 itself
    }
    assert leaves["loss_fn.ais.mode"] == "tbpo"
    assert leaves["policy.quant_cfg"] == leaves["policy.generation.quant_cfg"]
    assert pf.rollout_format(_load(QARL)) == pf.rollout_format(_load(W4A16)) == "nvfp4_w4a16"
    assert leaves["policy.generation.real_quant_ignore"] == ref["policy.generation.real_quant_ignore"]


@pytest.mark.parametrize(
    ("path", "refused"),
    [(p, _rel(p) in {"experiments/qwen3_8b_nvfp4_w4a4_ais.yaml",
                     "experiments/qwen3_8b_mxfp8_ais.yaml"}) for p in ALL_YAML],
    ids=lambda x: _rel(x) if isinstance(x, Path) else "",
)  # fmt: skip
def test_main_only_formats_fail_on_v0_7_0_naming_the_switch(path, refused):
    cfg = _load(path)
    failed = {r.name: r.detail for r in pf.check_config(cfg, "v0.7.0") if r.status == "fail"}
    if not refused:
        assert not failed, failed
        return
    assert set(failed) == {"rollout_format"}
    switch = (
        "policy.generation.vllm_cfg.is_mx=true (MXFP8 rollout)"
        if "mxfp8" in path.name
        else "policy.generation.real_quant=true with policy.generation.quant_cfg="
        "'examples/modelopt/quant_configs/nano3_nvfp4_default.yaml' (NVFP4 W4A4"
    )
    assert switch in failed["rollout_format"]
    assert "needs NeMo-RL main; NeMo-RL v0.7.0 lacks it" in failed["rollout_format"]
    # the launcher's refusal (before Ray) is the same line
    assert pf.rollout_format_problems(cfg, "v0.7.0") == [failed["rollout_format"]]
    assert pf.rollout_format_problems(cfg, "main") == []


def test_unknown_nemo_rl_version_warns_only_for_formats_some_versions_lack():
    env = {}  # no NEMO_RL_DIR, no --nemo-rl-version
    for fmt, path in FORMATS.items():
        results = [r for r in pf.check_config(_load(path), environ=env) if r.name == "rollout_format"]
        statuses = [r.status for r in results]
        assert statuses == (["ok"] if fmt == "nvfp4_w4a16" else ["ok", "warn"]), results
        if fmt != "nvfp4_w4a16":
            assert "needs NeMo-RL main; NeMo-RL version unknown (NEMO_RL_DIR unset" in (results[1].detail)
    # not a NeMo-RL checkout: nothing is learned from it
    results = pf.check_config(_load(MXFP8), environ={"NEMO_RL_DIR": str(CONFIG_DIR)})
    (warn,) = [r for r in results if r.status == "warn" and r.name != "rollout_gpu"]
    assert "has no nemo_rl/algorithms/grpo.py" in warn.detail
    with pytest.raises(ValueError, match=r"--nemo-rl-version='v0\.6' is invalid: expected one of"):
        pf.check_config(_load(MXFP8), "v0.6")


def test_cli_takes_the_nemo_rl_version(capsys):
    assert pf.main(["--nemo-rl-version", "v0.7.0", "--quiet", str(MXFP8)]) == 1
    assert "[FAIL] rollout_format: policy.generation.vllm_cfg.is_mx=true" in (capsys.readouterr().err)
    assert pf.main(["--nemo-rl-version", "main", "--quiet", str(MXFP8), str(W4A4)]) == 0


REFIT_SECTION_CASES = (
    ("ais_fp8_refit.family=multipler", "ais_fp8_refit.family='multipler' is invalid"),
    ("ais_fp8_refit.backend=xx", "ais_fp8_refit.backend='xx' is invalid"),
    ("+ais_fp8_refit.foo=1", "ais_fp8_refit.foo is not a known field"),
    ("ais_fp8_refit.enabled=maybe", "ais_fp8_refit.enabled='maybe' is invalid"),
    ("+ais_nvfp4_refit.enabled=false +ais_nvfp4_refit.formt=mxfp8", "ais_nvfp4_refit.formt is not a known field"),
    ("+ais_kv_calibration.reduction=bogus", "ais_kv_calibration.reduction='bogus' is invalid"),
)
"""(override of the FP8 config, what both the offline check and the entry point say)."""


def test_the_refit_check_reads_an_arm_mixins_sections_too():
    """The arm mixins carry the refit sections: a typo there fails offline, as in the config that includes it."""
    mixin = CONFIG_DIR / "arms" / "nvfp4_w4a16.yaml"
    results = {r.name: r for r in pf.check_config(_load(mixin, ["+ais_kv_calibration.reduction=bogus"]))}
    assert results["refit_sections"].status == "fail"
    assert "ais_kv_calibration.reduction='bogus' is invalid" in results["refit_sections"].detail
    assert {r.status for r in pf.check_config(_load(mixin))} <= {"ok", "warn"}


@pytest.mark.parametrize(("override", "fragment"), REFIT_SECTION_CASES)
def test_the_entry_point_refuses_what_the_refit_check_refuses(override, fragment):
    """``launchers/run_grpo_ais.py`` arms the sections with the functions the check calls: the same refusal."""
    run = launcher()
    raw = run.load_config_dict(str(QWEN8B), override.split())
    with pytest.raises((TypeError, ValueError), match=re.escape(fragment)):
        run.configure_kv_calibration(raw, environ={})
        run.configure_fp8_refit(raw, environ={})
        run.configure_block_refit(raw, environ={})


# ---------------------------------------------------------------------------------------
# Broken variants: each must FAIL the named check with a message naming field and numbers.
# ---------------------------------------------------------------------------------------

BROKEN = [
    # (config, overrides, failing check, message fragment)
    # the refit and KV-calibration sections, read as the entry point reads them before Ray (REFIT_SECTION_CASES)
    *((QWEN8B, override.split(), "refit_sections", fragment) for override, fragment in REFIT_SECTION_CASES),
    (
        QWEN8B,
        ["policy.megatron_cfg.tensor_model_parallel_size=3"],
        "trainer_parallel",
        "GPUs = cluster.num_nodes x cluster.gpus_per_node = 16 is not divisible by TP x PP x CP = 3 x 1 x 1 = 3",
    ),
    (
        QWEN8B,
        ["cluster.gpus_per_node=3", "cluster.num_nodes=1"],
        "trainer_parallel",
        "= 3 is not divisible by TP x PP x CP = 2 x 1 x 1 = 2",
    ),
    (
        MOE,
        ["policy.megatron_cfg.expert_model_parallel_size=3"],
        "trainer_parallel",
        "expert_model_parallel_size=3 does not divide the 128 experts",
    ),
    (
        MOE,
        ["policy.megatron_cfg.expert_model_parallel_size=32"],
        "trainer_parallel",
        "ETP x EP = 1 x 32 = 32 must divide GPUs / PP = 16 / 1",
    ),
    (
        MOE,
        ["policy.megatron_cfg.sequence_parallel=false"],
        "trainer_parallel",
        "needs policy.megatron_cfg.sequence_parallel=true",
    ),
    (
        QWEN8B,
        ["policy.megatron_cfg.expert_model_parallel_size=2"],
        "trainer_parallel",
        "expert_model_parallel_size=2 > 1 for a dense model",
    ),
    (
        LLAMA,
        ["cluster.num_nodes=3", "policy.megatron_cfg.pipeline_model_parallel_size=3"],
        "trainer_parallel",
        "pipeline_model_parallel_size=3 does not split the 32 layers: 32 layers left for 3 stage(s)",
    ),
    (  # Megatron-Core's TransformerConfig refuses each of these three (uneven pipeline stages)
        LLAMA,
        [
            "policy.megatron_cfg.pipeline_model_parallel_size=4",
            "+policy.megatron_cfg.num_layers_in_first_pipeline_stage=3",
        ],
        "trainer_parallel",
        "after policy.megatron_cfg.num_layers_in_first_pipeline_stage=3: 29 layers left for 3 stage(s)",
    ),
    (
        LLAMA,
        [
            "+policy.megatron_cfg.num_layers_in_first_pipeline_stage=20",
            "+policy.megatron_cfg.num_layers_in_last_pipeline_stage=20",
        ],
        "trainer_parallel",
        "-8 layers left for 0 stage(s)",
    ),
    (  # NeMo-RL copies the stage sizes into the model config at any PP, PP 1 included
        QWEN8B,
        ["+policy.megatron_cfg.num_layers_in_first_pipeline_stage=2"],
        "trainer_parallel",
        "after policy.megatron_cfg.num_layers_in_first_pipeline_stage=2: 34 layers left for 0 stage(s)",
    ),
    (
        LLAMA,
        ["+policy.megatron_cfg.num_layers_in_first_pipeline_stage=0"],
        "trainer_parallel",
        "num_layers_in_first_pipeline_stage=0 is invalid: expected an integer >= 1",
    ),
    (  # NeMo-RL main's grpo setup() asserts validation sampling = training outside NeMo-Gym (v0.7.0 ignores it)
        SMOKE,
        ["policy.generation.val_temperature=0.6"],
        "vllm_parallel",
        "policy.generation.val_temperature=0.6 vs temperature=1.0: validation sampling that differs from training "
        "runs only on NeMo-Gym vLLM rollouts",
    ),
    (
        SMOKE,
        [*NEMO_GYM, "policy.generation.val_top_k=20"],
        "vllm_parallel",
        "policy.generation.val_top_k=20: NeMo-Gym rollouts honour only val_temperature and val_top_p",
    ),
    (  # NeMo-RL's FP8 engine holds [N/128, K/128] weight scales (FP8_BLOCK_QUANT_KWARGS)
        QWEN8B,
        ["+ais_fp8_refit.block=[64,64]"],
        "fp8_rollout",
        "ais_fp8_refit.block=[64, 64] is invalid: expected [128, 128]",
    ),
    (QWEN8B, ["+ais_fp8_refit.block=128"], "fp8_rollout", "ais_fp8_refit.block=128 is invalid: expected [128, 128]"),
    (  # a value of a type no rule expected is named, not a traceback
        QWEN8B,
        ["policy.generation.vllm_cfg.num_first_layers_in_bf16=null"],
        "fp8_rollout",
        "policy.generation.vllm_cfg.num_first_layers_in_bf16=None is invalid: expected an integer >= 0",
    ),
    (W4A16, ["policy.generation.real_quant_ignore=5"], "nvfp4_rollout", "real_quant_ignore=5 is invalid: expected a"),
    (  # the checks that read the same key without a rule for its type fail too, and say why
        W4A16,
        ["policy.generation.real_quant_ignore=5"],
        "vllm_nvfp4_shards",
        "could not read the config (TypeError: 'int' object is not iterable)",
    ),
    (  # the launcher's refit.configure refuses it before Ray: the same rule, offline
        CONFIG_DIR / "experiments" / "smoke_bf16.yaml",
        ["ais_fp8_refit.enabled=true"],
        "fp8_rollout",
        "ais_fp8_refit.enabled=True needs policy.generation.vllm_cfg.precision: fp8 (got 'bfloat16')",
    ),
    (QWEN8B, ["+ais_fp8_refit.block=null"], "fp8_rollout", "ais_fp8_refit.block=None is invalid: expected [128, 128]"),
    (  # VllmGeneration compares top_p with 0 and 1: null is a TypeError there
        SMOKE,
        ["policy.generation.top_p=null"],
        "vllm_parallel",
        "policy.generation.top_p=None is invalid: expected a fraction in (0, 1]",
    ),
    (  # NeMo-RL's should_use_nemo_gym (v0.7.0 and main) asserts an async engine that serves HTTP
        SMOKE,
        [*ASYNC_BF16_KV, "policy.generation.vllm_cfg.async_engine=true", "+env.should_use_nemo_gym=true"],
        "vllm_parallel",
        "env.should_use_nemo_gym=true needs policy.generation.vllm_cfg.expose_http_server=true",
    ),
    (  # a size the layout reads: one failure before any check divides by it
        MOE,
        ["policy.megatron_cfg.tensor_model_parallel_size=0", "policy.megatron_cfg.expert_tensor_parallel_size=null"],
        "parallel_sizes",
        "policy.megatron_cfg.tensor_model_parallel_size=0 is invalid: expected an integer >= 1; "
        "policy.megatron_cfg.expert_tensor_parallel_size=None is invalid",
    ),
    (
        QWEN8B,
        ["cluster.num_nodes=two", "policy.generation.vllm_cfg.tensor_parallel_size=2.5"],
        "parallel_sizes",
        "cluster.num_nodes='two' is invalid: expected an integer >= 1; "
        "policy.generation.vllm_cfg.tensor_parallel_size=2.5 is invalid",
    ),
    (
        QWEN8B,
        ["grpo.num_prompts_per_step=abc"],
        "batch",
        "grpo.num_prompts_per_step='abc' is invalid: expected an integer >= 1",
    ),
    (
        QWEN8B,
        ["policy.megatron_cfg.tensor_model_parallel_size=4", "policy.logprob_batch_size=2"],
        "trainer_parallel",
        "TP=4 >= 4 needs policy.train_micro_batch_size (1) == policy.logprob_batch_size (2)",
    ),
    (
        MOE,
        ["policy.generation.vllm_cfg.tensor_parallel_size=4"],
        "vllm_fp8_shards",
        "moe_intermediate / 4 = 192 is not divisible by 128",
    ),
    (
        SMOKE,
        [
            "policy.model_name=Qwen/Qwen2.5-1.5B",
            "cluster.gpus_per_node=4",
            "policy.generation.vllm_cfg.tensor_parallel_size=4",
        ],
        "vllm_fp8_shards",
        "intermediate / TP = 2240 is not divisible by 128",
    ),
    (
        QWEN8B,
        ["policy.generation.vllm_cfg.tensor_parallel_size=3"],
        "vllm_parallel",
        "vLLM TP x PP = 3 x 1 = 3 must divide the 16 GPUs",
    ),
    *(
        (QWEN8B, [f"{key}={value}"], "batch", f"{key}={value} is invalid: expected an integer >= 1")
        for key, value in (
            ("policy.train_micro_batch_size", 0),  # passed before as "gbs/DP = 64 = 512 x mbs 0"
            ("policy.logprob_batch_size", -1),
            ("grpo.num_prompts_per_step", -4),
            ("grpo.max_num_steps", -5),
        )
    ),
    *(
        (
            QWEN8B,
            [f"policy.generation.vllm_cfg.gpu_memory_utilization={share}"],
            "vllm_parallel",
            f"gpu_memory_utilization={share} is invalid: expected a fraction in (0, 1]",
        )
        for share in (1.5, -0.5, 0)
    ),
    (
        MOE,
        ["policy.generation.vllm_cfg.expert_parallel_size=3"],
        "vllm_parallel",
        "expert_parallel_size=3 must be a multiple of tensor_parallel_size=2",
    ),
    (
        LLAMA,
        ["policy.generation.vllm_cfg.pipeline_parallel_size=2"],
        "vllm_parallel",
        "pipeline_parallel_size=2 > 1 needs policy.generation.vllm_cfg.async_engine=true",
    ),
    (
        QWEN8B,
        ["policy.train_global_batch_size=384"],
        "batch",
        "64 x 8 = 512 is not a multiple of policy.train_global_batch_size=384",
    ),
    (
        SMOKE,
        ["cluster.gpus_per_node=8", "policy.train_micro_batch_size=8", "policy.sequence_packing.enabled=false"],
        "batch",
        "policy.train_global_batch_size=32 is not divisible by DP x policy.train_micro_batch_size = 8 x 8 = 64",
    ),
    (  # what NeMo-RL's Policy, Megatron setup and VllmGeneration assert
        QWEN8B,
        ["policy.megatron_cfg.context_parallel_size=2", "policy.sequence_packing.enabled=false"],
        "trainer_parallel",
        "context_parallel_size=2 > 1 needs policy.sequence_packing.enabled=true",
    ),
    (
        QWEN8B,
        ["policy.dynamic_batching.enabled=true"],
        "trainer_parallel",
        "policy.sequence_packing.enabled and policy.dynamic_batching.enabled are exclusive",
    ),
    (
        LLAMA,
        ["policy.dynamic_batching.enabled=true", "policy.sequence_packing.enabled=false"],
        "trainer_parallel",
        "policy.dynamic_batching.enabled needs pipeline_model_parallel_size=1, got 2",
    ),
    (
        MOE,
        ["policy.generation.vllm_cfg.expert_parallel_size=4", "policy.generation.vllm_cfg.async_engine=true"],
        "vllm_parallel",
        "expert_parallel_size=4 != tensor_parallel_size=2 (DP inside vLLM) needs "
        "policy.generation.vllm_cfg.async_engine=false",
    ),
    (QWEN8B, ["policy.generation.top_p=0"], "vllm_parallel", "policy.generation.top_p=0 is invalid"),
    (QWEN8B, ["policy.generation.top_k=0"], "vllm_parallel", "policy.generation.top_k=0 is invalid"),
    (
        QWEN8B,
        ["policy.train_global_batch_size=500", "grpo.num_prompts_per_step=125", "grpo.num_generations_per_prompt=4"],
        "batch",
        "policy.train_global_batch_size=500 is not divisible by DP = 8",
    ),
    (  # non-colocated generation: NeMo-RL's GRPO setup splits the GPUs, and Policy trains on its share only
        QWEN8B,
        ["policy.generation.colocated.enabled=false"],
        "gpu_split",
        "policy.generation.colocated.resources.num_nodes=None is invalid: expected the engines' nodes, an integer "
        "in [1, cluster.num_nodes=2)",
    ),
    (
        QWEN8B,
        [
            "cluster.num_nodes=1",
            "cluster.gpus_per_node=8",
            "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.gpus_per_node=8",
        ],
        "gpu_split",
        "gpus_per_node=8 is invalid on one node: expected the engines' GPUs, an integer in [1, cluster.gpus_per_node=8)",
    ),
    (
        QWEN8B,
        [
            "cluster.num_nodes=1",
            "cluster.gpus_per_node=8",
            "policy.megatron_cfg.tensor_model_parallel_size=8",
            "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.gpus_per_node=4",
        ],
        "trainer_parallel",
        "training GPUs (gpu_split) = 4 is not divisible by TP x PP x CP = 8 x 1 x 1 = 8",
    ),
    (  # the launcher's loss without loss_fn.ais is mode none: NeMo-RL's zeros would feed its telemetry
        SMOKE,
        ["~loss_fn.ais", "loss_fn.force_on_policy_ratio=true"],
        "loss_fn.ais",
        "loss_fn.force_on_policy_ratio=True conflicts with the AIS loss (loss_fn.ais.mode none, or no loss_fn.ais",
    ),
    (SMOKE, ["+loss_fn.ais.bogus=1"], "loss_fn.ais", "loss_fn.ais.bogus is not a known field"),
    (
        SMOKE,
        ["+loss_fn.ais_alarm.enabled=true"],  # NeMo-RL's loss_fn keeps it, unread
        "loss_fn.ais",
        "loss_fn.ais_alarm is not a known section: nemo_ais reads loss_fn.ais and "
        "loss_fn.ais_alarms (did you mean loss_fn.ais_alarms?)",
    ),
    (SMOKE, ["loss_fn.ais.weight_cap=0.8"], "loss_fn.ais", "loss_fn.ais.weight_cap=0.8 is invalid"),
    (SMOKE, ["loss_fn.ais.icepop.min=6.0"], "loss_fn.ais", "loss_fn.ais.icepop.min=6.0 must be < max=5.0"),
    (SMOKE, ["+loss_fn.ais.icepop_min=0.6"], "loss_fn.ais", "loss_fn.ais.icepop_min moved: use loss_fn.ais.icepop.min"),
    (
        SMOKE,
        ["loss_fn.use_importance_sampling_correction=true"],
        "loss_fn.ais",
        "loss_fn.use_importance_sampling_correction=True conflicts with loss_fn.ais.mode='ais'",
    ),
    (
        SMOKE,
        ["loss_fn.truncated_importance_sampling_type=tis", "loss_fn.ais.mode=tis"],
        "loss_fn.ais",
        "loss_fn.truncated_importance_sampling_type='tis' conflicts with loss_fn.ais.mode='tis'",
    ),
    (
        LLAMA,
        ["policy.generation.vllm_cfg.kv_cache_dtype=fp8"],
        "fp8_rollout",
        "an FP8 KV cache needs policy.megatron_cfg.pipeline_model_parallel_size=1 (got 2",
    ),
    (
        SMOKE,
        ["policy.generation.vllm_cfg.precision=bfloat16"],
        "fp8_rollout",
        "kv_cache_dtype='fp8' needs policy.generation.vllm_cfg.precision='fp8'",
    ),
    (SMOKE, ["policy.generation.vllm_cfg.kv_cache_dtype=int8"], "fp8_rollout", "kv_cache_dtype='int8' is invalid"),
    (
        SMOKE,
        ["policy.generation.vllm_cfg.num_last_layers_in_bf16=29"],
        "fp8_rollout",
        "= 29 exceeds the model's 28 layers",
    ),
    (
        QWEN8B,
        ["~policy.draft"],
        "entry_point_keys",
        "policy.draft.enabled is missing: NeMo-RL v0.7.0 reads it unguarded (examples/run_grpo.py main())",
    ),
    (
        SMOKE,
        ["logger.mlflow_enabled=true", "~logger.mlflow"],
        "entry_point_keys",
        "logger.mlflow is missing: NeMo-RL v0.7.0 reads it unguarded (Logger, with logger.mlflow_enabled=true)",
    ),
    (
        SMOKE,
        ["+data_plane.enabled=true"],
        "entry_point_keys",
        "data_plane.enabled=true (TransferQueue: TQPolicy + grpo_train_sync) is not supported",
    ),
    (SMOKE, ["loss_fn.ais_alarms.jump_factor=0.5"], "loss_fn.ais", "loss_fn.ais_alarms.jump_factor=0.5 is invalid"),
    (
        QWEN8B,
        ["grpo.val_at_start=true"],
        "fp8_rollout",
        "grpo.val_at_start=true with policy.generation.vllm_cfg.kv_cache_dtype='fp8' is invalid: expected false",
    ),
    # a DTensor trainer: the messages name the dtensor_cfg fields, not Megatron's
    (
        SMOKE,
        [*DTENSOR, "+policy.dtensor_cfg.tensor_parallel_size=3", "cluster.gpus_per_node=4"],
        "trainer_parallel",
        "GPUs = cluster.num_nodes x cluster.gpus_per_node = 4 is not divisible by TP x CP = "
        "3 x 1 = 3 (policy.dtensor_cfg.tensor_parallel_size x context_parallel_size)",
    ),
    (
        SMOKE,
        [*DTENSOR, "+policy.dtensor_cfg.tensor_parallel_size=3", "cluster.gpus_per_node=3"],
        "trainer_parallel",
        "policy.dtensor_cfg.tensor_parallel_size=3 must divide the 16 query heads and 8 KV heads",
    ),
    # NeMo-RL's own asserts (tests/upstream/test_preflight_mirrors_upstream.py raises each
    # through upstream's real code): an FP8 rollout with no correction at all...
    (
        SMOKE,
        ["~loss_fn.ais"],
        "fp8_rollout",
        "policy.generation.vllm_cfg.precision='fp8' needs an importance-sampling correction: add a loss_fn.ais section",
    ),
    # ...async GRPO without vLLM's async engine, without a correction, with DAPO options
    (
        SMOKE,
        [*ASYNC_BF16_KV],
        "async_grpo",
        "grpo.async_grpo.enabled=true needs policy.generation.vllm_cfg.async_engine=true",
    ),
    (
        CONFIG_DIR / "experiments" / "smoke_bf16.yaml",
        [*ASYNC_BF16_KV, "policy.generation.vllm_cfg.async_engine=true", "~loss_fn.ais"],
        "async_grpo",
        "grpo.async_grpo.enabled=true needs an importance-sampling correction",
    ),
    (
        SMOKE,
        [*ASYNC_BF16_KV, "policy.generation.vllm_cfg.async_engine=true", "grpo.use_dynamic_sampling=true"],
        "async_grpo",
        "grpo.use_dynamic_sampling=true is not supported with grpo.async_grpo.enabled=true",
    ),
    (
        QWEN8B,
        ["checkpointing.model_save_format=safetensors"],
        "checkpointing",
        "checkpointing.model_save_format='safetensors' is invalid without policy.dtensor_cfg._v2=true: expected null",
    ),
    # Low-precision rollout formats: a vLLM TP whose shards break the format's block along K
    # (a model whose expert down_proj splits below it; Qwen3-8B never does at a legal TP)...
    (
        MXFP8,
        [MOE_MODEL, "policy.generation.vllm_cfg.tensor_parallel_size=16"],
        "vllm_mxfp8_shards",
        "policy.generation.vllm_cfg.tensor_parallel_size=16: experts down_proj in = "
        "moe_intermediate / TP = 768 / 16 = 48 is not divisible by 32: expected a multiple of "
        "32 per TP rank",
    ),
    (
        W4A16,
        [MOE_MODEL, "cluster.num_nodes=4", "policy.generation.vllm_cfg.tensor_parallel_size=32"],
        "vllm_nvfp4_shards",
        "policy.generation.vllm_cfg.tensor_parallel_size=32: experts down_proj in = "
        "moe_intermediate / TP = 768 / 32 = 24 is not divisible by 16: expected a multiple of "
        "16 per TP rank",
    ),
    (
        W4A4,
        [MOE_MODEL, "cluster.num_nodes=4", "policy.generation.vllm_cfg.tensor_parallel_size=32"],
        "vllm_nvfp4_shards",
        "experts down_proj in = moe_intermediate / TP = 768 / 32 = 24 is not divisible by 16",
    ),
    # ...NeMo-RL's switches for each format, as its source reads them...
    (
        MXFP8,
        ["policy.generation.vllm_cfg.pow2_weight_scaling_factors=false"],
        "mxfp8_rollout",
        "policy.generation.vllm_cfg.pow2_weight_scaling_factors=false with "
        "policy.generation.vllm_cfg.is_mx=true is invalid: expected true",
    ),
    (
        MXFP8,
        ["policy.generation.vllm_cfg.precision=bfloat16"],
        "mxfp8_rollout",
        "policy.generation.vllm_cfg.is_mx=true with policy.generation.vllm_cfg.precision="
        "'bfloat16' is invalid: expected 'fp8'",
    ),
    (
        W4A16,
        ["policy.generation.vllm_cfg.precision=fp8"],
        "nvfp4_rollout",
        "policy.generation.real_quant=true with policy.generation.vllm_cfg.precision='fp8' is "
        "invalid: expected bfloat16",
    ),
    (
        W4A16,
        ["policy.generation.quant_cfg=null"],
        "nvfp4_rollout",
        "policy.generation.real_quant=true needs policy.generation.quant_cfg",
    ),
    (
        W4A16,
        ["policy.generation.real_quant=false"],
        "nvfp4_rollout",
        "without policy.generation.real_quant=true selects ModelOpt fake-quant rollouts",
    ),
    (
        W4A4,
        ["~policy.generation.real_quant_export_cpu_offload"],
        "nvfp4_rollout",
        "policy.generation.real_quant_export_cpu_offload=None is invalid: expected true or false",
    ),
    (
        W4A16,
        ["+policy.generation.refit_transport=nccl_reshard"],
        "nvfp4_rollout",
        "policy.generation.refit_transport='nccl_reshard' with policy.generation.real_quant=true "
        "is invalid: expected null",
    ),
    # ...QARL (policy.quant_cfg: NeMo-RL's ModelOpt QAT worker) exports its own NVFP4...
    (
        W4A16,
        ["+policy.quant_cfg=examples/modelopt/quant_configs/nvfp4_a16.yaml"],
        "qarl_trainer",
        "ais_nvfp4_refit.enabled=True is invalid with policy.quant_cfg="
        "'examples/modelopt/quant_configs/nvfp4_a16.yaml': expected false",
    ),
    (
        QARL,
        ["policy.quant_cfg=examples/modelopt/quant_configs/nvfp4_a16.yaml"],
        "qarl_trainer",
        "policy.generation.quant_cfg='examples/modelopt/quant_configs/nvfp4_a16_mlp_only.yaml' "
        "is invalid with policy.quant_cfg='examples/modelopt/quant_configs/nvfp4_a16.yaml': "
        "expected the same recipe",
    ),
    (
        QARL,
        ["policy.megatron_cfg.gradient_accumulation_fusion=true"],
        "qarl_trainer",
        "policy.megatron_cfg.gradient_accumulation_fusion=True is invalid with policy.quant_cfg: expected false",
    ),
    (
        QARL,
        ["policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"],
        "qarl_trainer",
        "policy.quant_cfg='examples/modelopt/quant_configs/nvfp4_a16_mlp_only.yaml' needs "
        "policy.megatron_cfg.enabled=true",
    ),
    (
        QARL,
        ["policy.generation.real_quant=false"],
        "nvfp4_rollout",
        "(a fake-quant rollout is not the NVFP4-kernel format the comparison arms run)",
    ),
    # ...and the refit a BF16 trainer needs: upstream cannot load BF16 into NVFP4 parameters
    (
        W4A16,
        ["ais_nvfp4_refit.enabled=false"],
        "nvfp4_rollout",
        "ais_nvfp4_refit.enabled is False: expected true with a BF16 trainer",
    ),
    (W4A4, ["~ais_nvfp4_refit"], "nvfp4_rollout", "ais_nvfp4_refit.enabled is None: expected true with a BF16 trainer"),
    (
        W4A4,
        ["~ais_nvfp4_refit.format"],
        "nvfp4_rollout",
        "ais_nvfp4_refit.format='nvfp4_w4a16' is invalid with policy.generation.quant_cfg="
        "'examples/modelopt/quant_configs/nano3_nvfp4_default.yaml': expected 'nvfp4_w4a4'",
    ),
    (
        W4A16,
        ["+ais_nvfp4_refit.format=nvfp4_w4a4", "+ais_nvfp4_refit.input_amax_file=amax.json"],
        "nvfp4_rollout",
        "ais_nvfp4_refit.format='nvfp4_w4a4' is invalid with policy.generation.quant_cfg="
        "'examples/modelopt/quant_configs/nvfp4_a16.yaml': expected 'nvfp4_w4a16'",
    ),
    (
        W4A4,
        ["ais_nvfp4_refit.input_amax_file=null"],
        "nvfp4_rollout",
        "ais_nvfp4_refit.input_amax_file=None is invalid with format 'nvfp4_w4a4': expected a JSON file",
    ),
]


@pytest.mark.parametrize(
    ("path", "overrides", "check", "fragment"), BROKEN, ids=[f"{b[2]}-{i}" for i, b in enumerate(BROKEN)]
)
def test_broken_variant_fails_named_check(path, overrides, check, fragment):
    cfg = _load(path, overrides)
    failed = {r.name: r.detail for r in pf.check_config(cfg) if r.status == "fail"}
    assert check in failed, f"expected {check} to fail, failures: {failed}"
    assert fragment in failed[check]
    with pytest.raises(ValueError, match=r"check\(s\) failed") as info:
        pf.validate_config(cfg, path.name)
    assert fragment in str(info.value) and path.name in str(info.value)


@pytest.mark.parametrize(
    ("path", "overrides"),
    [
        # NeMo-RL's own TIS with our loss in mode none: exactly ClippedPGLossFn (allowed).
        (
            SMOKE,
            [
                "loss_fn.ais.mode=none",
                "loss_fn.use_importance_sampling_correction=true",
                "loss_fn.truncated_importance_sampling_type=tis",
                "loss_fn.truncated_importance_sampling_ratio=2.0",
            ],
        ),
        # vLLM expert parallelism keeps experts whole: TP=4 is fine for the MoE then.
        (
            MOE,
            ["policy.generation.vllm_cfg.tensor_parallel_size=4", "policy.generation.vllm_cfg.expert_parallel_size=4"],
        ),
        # More KV-head replication than heads (TP 8 > 8 kv heads is not needed; 4 kv at TP 8).
        (
            MOE,
            ["policy.generation.vllm_cfg.tensor_parallel_size=8", "policy.generation.vllm_cfg.expert_parallel_size=8"],
        ),
        (QWEN8B, ["policy.generation.vllm_cfg.tensor_parallel_size=8"]),
        (LLAMA, ["policy.generation.vllm_cfg.tensor_parallel_size=8"]),
        # A save format is NeMo-RL's DTensor v2 field; no save, no check.
        (QWEN8B, ["checkpointing.model_save_format=safetensors", "+policy.dtensor_cfg._v2=true"]),
        (SMOKE, ["checkpointing.model_save_format=safetensors"]),
        # NeMo-RL's own correction instead of ours: setup()'s FP8 assert is satisfied
        (SMOKE, ["~loss_fn.ais", "loss_fn.use_importance_sampling_correction=true"]),
        # async GRPO as upstream runs it: async engine, BF16 KV cache, a correction
        (SMOKE, [*ASYNC_BF16_KV, "policy.generation.vllm_cfg.async_engine=true"]),
        # MXFP8 blocks are 1 x 32, not 128 x 128: intermediate / 4 = 2240 = 70 x 32 is fine
        # (vllm_fp8_shards fails the block-FP8 smoke config on the same shard, BROKEN above)
        (MXFP8, ["policy.model_name=Qwen/Qwen2.5-1.5B", "policy.generation.vllm_cfg.tensor_parallel_size=4"]),
        # vLLM TP 8 on Qwen3-8B: o_proj 512 and down_proj 1536 in, multiples of 16 and 32
        (MXFP8, ["policy.generation.vllm_cfg.tensor_parallel_size=8"]),
        (W4A16, ["policy.generation.vllm_cfg.tensor_parallel_size=8"]),
        (W4A4, ["policy.generation.vllm_cfg.tensor_parallel_size=8"]),
        # NVFP4 with the MoE at TP 16: 768 / 16 = 48 = 3 x 16 (MXFP8 fails there, BROKEN)
        (W4A16, [MOE_MODEL, "policy.generation.vllm_cfg.tensor_parallel_size=16"]),
        # validation sampling of its own on NeMo-Gym vLLM rollouts (NeMo-RL main)
        (
            SMOKE,
            [*NEMO_GYM, "policy.generation.val_temperature=0.6", "policy.generation.val_top_p=0.95"],
        ),
        # a refit section without `enabled` is on, as RefitConfig defaults it (once: "enabled is None")
        (W4A16, ["~ais_nvfp4_refit.enabled"]),
        # the DTensor trainer has no pipeline stages: a Megatron stage key left in the YAML is inert
        (SMOKE, [*DTENSOR, "+policy.megatron_cfg.num_layers_in_first_pipeline_stage=2"]),
    ],
)
def test_legal_variants_pass(path, overrides):
    pf.validate_config(_load(path, overrides), nemo_rl_version="main")


def test_unknown_model_warns_and_skips_shape_checks(hf_cache):
    cfg = _load(SMOKE, ["policy.model_name=/ckpt/my-model"])
    results = {r.name: r for r in pf.check_config(cfg)}
    assert results["model_shapes"].status == "warn"
    assert results["model_shapes"].detail == (
        "policy.model_name='/ckpt/my-model': no config.json in a local directory /ckpt/my-model "
        f"or in the HF cache {hf_cache} (nothing is downloaded), and not in MODEL_SHAPES: head, "
        "expert and FP8 shard checks skipped (put the model's config.json there)"
    )
    assert "vllm_fp8_shards" not in results
    pf.validate_config(cfg)  # warnings do not fail


def test_model_shape_lookup_by_basename():
    assert pf.find_model_shape("Qwen/Qwen3-8B") is pf.MODEL_SHAPES["qwen3-8b"]
    assert pf.find_model_shape("/models/Qwen3-8B/") is pf.MODEL_SHAPES["qwen3-8b"]
    assert pf.find_model_shape("meta-llama/Llama-3.1-8B-Instruct").intermediate_size == 14336
    moe = pf.find_model_shape("Qwen/Qwen3-30B-A3B")
    assert (moe.num_experts, moe.moe_intermediate_size, moe.num_layers) == (128, 768, 48)


# ---------------------------------------------------------------------------------------
# Fallback loader semantics (NeMo-RL's load_config: defaults, _override_, Hydra overrides);
# tests/adapters/test_master_config.py proves it equal to NeMo-RL's on every shipped config
# ---------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_loader_defaults_order_override_marker_and_interpolation(tmp_path):
    _write(tmp_path / "a.yaml", "x: 1\nsec: {p: 1, q: 2}\nn: ${mul:${x}, 3}\n")
    _write(tmp_path / "sub" / "b.yaml", "defaults: ../a.yaml\nx: 2\n")
    _write(tmp_path / "c.yaml", "y: 7\nsec: {_override_: true, r: 3}\n")
    child = _write(tmp_path / "child.yaml", "defaults: [sub/b.yaml, c.yaml]\ny: 8\n")
    cfg = pf.load_config_fallback(child)
    # b overrides a (x=2), c's _override_ replaces sec, the child wins (y=8), mul resolves.
    assert cfg == {"x": 2, "sec": {"r": 3}, "n": 6, "y": 8}


def test_loader_overrides(tmp_path):
    path = _write(tmp_path / "a.yaml", "a: {b: 1, c: [1, 2]}\n")
    assert pf.load_config_fallback(path, ["a.b=null", "+a.d=x", "++a.e=3", "~a.c"]) == {
        "a": {"b": None, "d": "x", "e": 3}
    }
    # Hydra's own messages (struct mode: a plain key=value adds no key, in a dict value either)
    with pytest.raises(ValueError, match=r"Could not override 'a\.z'\. To append to your config use \+a\.z=1"):
        pf.load_config_fallback(path, ["a.z=1"])
    with pytest.raises(ValueError, match=r"Could not override 'a'"):
        pf.load_config_fallback(path, ["a={z: 1}"])
    with pytest.raises(ValueError, match=r"Error parsing override 'a\.b'"):
        pf.load_config_fallback(path, ["a.b"])
    with pytest.raises(ValueError, match=r"Could not delete from config\. 'a\.q' does not exist"):
        pf.load_config_fallback(path, ["~a.q"])


def test_loader_errors(tmp_path):
    _write(tmp_path / "x.yaml", "defaults: y.yaml\n")
    _write(tmp_path / "y.yaml", "defaults: x.yaml\n")
    with pytest.raises(ValueError, match="inheritance cycle"):
        pf.load_config_fallback(tmp_path / "x.yaml")
    missing = _write(tmp_path / "m.yaml", "defaults: nope.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml does not exist \(a defaults: entry of"):
        pf.load_config_fallback(missing)
    listy = _write(tmp_path / "l.yaml", "- 1\n- 2\n")
    with pytest.raises(TypeError, match="expected a YAML mapping"):
        pf.load_config_fallback(listy)


@pytest.mark.parametrize("loader", ["load_config", "load_config_fallback"])
def test_malformed_yaml_is_one_line_naming_the_file(tmp_path, capsys, loader):
    """A YAML syntax error (here, or in a defaults: parent) is a ValueError, not a traceback.

    ``load_config`` is NeMo-RL's own loader here (the vendored tree); the fallback is ours.
    """
    assert pf.loader.nemo_rl_loader() is not None
    load = getattr(pf, loader)
    bad = _write(tmp_path / "bad.yaml", "a: [1, 2\n")
    child = _write(tmp_path / "child.yaml", "defaults: bad.yaml\n")
    for path in (bad, child):
        with pytest.raises(ValueError, match=r"malformed YAML: .* in \".*bad\.yaml\", line 1"):
            load(path)
    assert pf.main([str(child)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{child}: cannot load: malformed YAML:") and err.count("\n") == 1
    with pytest.raises(ValueError, match=r"'(grpo\.max_num_steps=)?\[1,'") as bad_override:
        load(QWEN8B, ["grpo.max_num_steps=[1,"])  # names the override, not a file
    assert "malformed YAML" not in str(bad_override.value)


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def test_cli_prints_results_and_exit_codes(capsys):
    assert pf.main([str(QWEN8B)]) == 0
    out = capsys.readouterr().out
    assert "(Qwen/Qwen3-8B, 2 node(s) x 8 GPU(s) = 16)" in out
    assert "[OK  ] trainer_parallel: megatron, GPUs=16: TP=2 PP=1 CP=1 -> DP=8" in out
    assert pf.main([str(QWEN8B), "policy.train_global_batch_size=384"]) == 1
    assert "[FAIL] batch:" in capsys.readouterr().out


def test_docs_list_every_registered_check_and_print_what_the_command_prints(capsys, hf_cache):
    """docs/cluster.md's check table has a row per registered check; its sample run is current."""
    from nemo_ais.preflight.checks import CHECKS

    doc = (Path(__file__).parents[2] / "docs" / "cluster.md").read_text()
    rows = {line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")}
    assert set(CHECKS) - rows == set(), "docs/cluster.md's check table lacks these checks"
    assert pf.main([str(MOE)]) == 0
    printed = capsys.readouterr().out.splitlines()[2:]  # the model_shapes line names the cache
    sample = doc.split(f"$ python -m nemo_ais.preflight configs/nemo_rl/{MOE.name}\n")[1]
    assert "\n".join(printed) in sample, "docs/cluster.md's sample output is stale"


def test_cli_get_prints_yaml_spellings_and_refuses_absent_keys(capsys):
    keys = ["checkpointing.checkpoint_must_save_by", "checkpointing.enabled", "cluster.num_nodes"]
    assert pf.main([*(f"--get={k}" for k in keys), str(QWEN8B)]) == 0
    assert capsys.readouterr().out == "null true 2\n"  # present but null: null
    assert pf.main(["--get", "checkpointing.no_such_key", str(QWEN8B)]) == 1
    assert "checkpointing.no_such_key not set" in capsys.readouterr().err


def test_cli_get_and_quiet(capsys):
    assert pf.main(["--get", "cluster.num_nodes", "--get", "cluster.gpus_per_node", str(MOE)]) == 0
    assert capsys.readouterr().out == "2 8\n"
    assert pf.main(["--get", "cluster.num_nodes", str(MOE), "cluster.num_nodes=3"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "[FAIL] batch: policy.train_global_batch_size=512 is not divisible by DP" in captured.err
    assert pf.main(["--quiet", str(SMOKE)]) == 0
    assert capsys.readouterr().out == ""


def _keys(paths):
    return {p.key for p in paths}


def test_cli_paths_prints_each_path_the_job_writes_or_reads_after_the_get_line(capsys, tmp_path, monkeypatch):
    from nemo_ais.preflight.cli import job_paths

    monkeypatch.delenv("NEMO_RL_DIR", raising=False)
    assert pf.main(["--get", "cluster.num_nodes", "--paths", str(QWEN8B), "logger.log_dir=/lustre/my logs"]) == 0
    ckpt = pf.load_config(QWEN8B)["checkpointing"]["checkpoint_dir"]
    out = f"2\nwrites checkpointing.checkpoint_dir={ckpt}\nwrites logger.log_dir=/lustre/my logs\n"
    assert capsys.readouterr().out == out
    amax = "ais_nvfp4_refit.input_amax_file"
    w4a4 = pf.load_config(W4A4)
    assert job_paths(w4a4)[-1] == (amax, "calibration/qwen3_8b_nvfp4_input_amax.json", False)
    model = pf.load_config(QWEN8B, ["policy.model_name=/lustre/models/Qwen3-8B"])
    assert [p for p in job_paths(model) if not p.writes] == [
        ("policy.model_name", "/lustre/models/Qwen3-8B", False),
        ("policy.tokenizer.name", "/lustre/models/Qwen3-8B", False),  # ${policy.model_name}
    ]
    assert all(p.writes for p in job_paths(pf.load_config(QWEN8B)))  # Qwen/Qwen3-8B: a Hub id
    listed = {"data": {"train": [{"data_path": "/d/a.jsonl"}, {"prompt_file": "rel.txt"}], "default": {"x": 1}}}
    start = {"checkpointing": {"pretrained_checkpoint": {"path": "/ckpt/iter_1"}}}
    assert job_paths({**listed, **start}) == [  # a list of datasets (main's multiple dataloaders); relative: not
        ("checkpointing.pretrained_checkpoint.path", "/ckpt/iter_1", False),
        ("data.train.0.data_path", "/d/a.jsonl", False),
    ]
    assert amax not in _keys(job_paths(pf.load_config(W4A4, ["ais_nvfp4_refit.enabled=false"])))
    assert amax not in _keys(job_paths(pf.load_config(QWEN8B)))  # the section absent
    w4a16 = pf.load_config(W4A4, ["ais_nvfp4_refit.format=nvfp4_w4a16"])
    assert amax not in _keys(job_paths(w4a16))  # W4A16 streams no input scale: nothing reads the file
    # a YAML string may hold a newline (an override may not): it would split the lines a launcher reads
    newline = tmp_path / "newline.yaml"
    newline.write_text(
        f'defaults: [{os.path.relpath(W4A4, tmp_path)}]\nais_nvfp4_refit:\n  input_amax_file: "/a\\nb"\n'
    )
    assert pf.main(["--paths", "--nemo-rl-version=main", str(newline)]) == 1
    assert f"{amax}='/a\\nb' is invalid: expected a value without a newline" in capsys.readouterr().err
    newline.write_text(f'defaults: [{os.path.relpath(QWEN8B, tmp_path)}]\nlogger:\n  wandb:\n    name: "a\\n/etc"\n')
    assert pf.main(["--get", "logger.wandb.name", str(newline)]) == 1
    assert "logger.wandb.name='a\\n/etc' is invalid: expected a value without a newline" in capsys.readouterr().err


def test_cli_get_says_the_warnings_on_stderr_and_quiet_keeps_them_back(capsys):
    assert pf.main(["--get", "cluster.num_nodes", "--nemo-rl-version=main", str(W4A4)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "2\n"
    assert captured.err.startswith(f"{W4A4}:\n  [WARN] ") and "[WARN] rollout_gpu: " in captured.err
    assert pf.main(["--get", "cluster.num_nodes", "--quiet", "--nemo-rl-version=main", str(W4A4)]) == 0
    assert capsys.readouterr() == ("2\n", "")


@pytest.mark.parametrize(
    ("key", "flag"),
    [(k, f) for k, _, f in pf.ENTRY_POINT_KEYS if f is not None],
    ids=[k for k, _, f in pf.ENTRY_POINT_KEYS if f is not None],
)
def test_a_flagged_entry_point_key_is_required_only_with_its_flag_on(key, flag):
    # upstream reads these only in the branch the flag turns on (tests/upstream/
    # test_setup_real.py drops each one, flag on, through NeMo-RL's real setup())
    cfg = copy.deepcopy(pf.load_config(SMOKE))
    node = cfg
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node.pop(leaf, None)
    flag_parent, _, flag_leaf = flag.rpartition(".")
    flags = functools.reduce(lambda d, p: d[p], flag_parent.split("."), cfg)

    def entry_point(on: bool) -> pf.CheckResult:
        flags[flag_leaf] = on
        (result,) = [r for r in pf.check_config(cfg) if r.name == "entry_point_keys"]
        return result

    assert f"{key} is missing" not in entry_point(False).detail
    assert f"{key} is missing" in entry_point(True).detail


def test_a_yaml_that_is_no_grpo_config_fails_naming_the_missing_sections(tmp_path, capsys):
    path = _write(tmp_path / "foo.yaml", "foo: 1\n")
    assert pf.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(path)  # no layout line: there is no layout
    assert (
        "[FAIL] sections: policy, loss_fn, env, data, grpo, logger, cluster, checkpointing "
        "are missing: NeMo-RL's GRPO MasterConfig requires each" in out
    )
    # one missing section of a real config; the other checks wait for it
    failed = [r for r in pf.check_config(_load(QWEN8B, ["~env"])) if r.status == "fail"]
    assert [(r.name, r.detail.split(":")[0]) for r in failed] == [("sections", "env is missing")]
    # an arm mixin (loss_fn.ais and no policy/cluster) is still not a full config
    assert pf.main([str(CONFIG_DIR / "arms" / "fp8_tis.yaml")]) == 0


# ---------------------------------------------------------------------------------------
# Model shapes: the model's own config.json (local path, HF cache), else the table
# ---------------------------------------------------------------------------------------

# The published config.json values (the keys ModelShape reads), written by hand from each
# model's Hugging Face page; the table must parse back from them exactly.
HF_CONFIGS = {
    "Qwen/Qwen3-0.6B": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=6144,
        vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=12288,
        vocab_size=151936, tie_word_embeddings=False),
    "Qwen/Qwen3-30B-A3B": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        vocab_size=151936, tie_word_embeddings=False, num_experts=128,
        moe_intermediate_size=768, num_experts_per_tok=8),
    "Qwen/Qwen2.5-1.5B": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
        vocab_size=151936, tie_word_embeddings=True),
    "meta-llama/Llama-3.1-8B": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        vocab_size=128256, tie_word_embeddings=False),
}  # fmt: skip


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """Every test: an empty HF cache at HF_HOME=tmp/hf (HF_HUB_CACHE unset), so a
    developer's real cache cannot change a result; returns its hub folder."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def _cache_model(hub: Path, model_id: str, config: dict, revision: str = "0123abc") -> Path:
    """The huggingface_hub cache layout: models--org--name/{refs/main, snapshots/<rev>/}."""
    repo = hub / ("models--" + model_id.replace("/", "--"))
    _write(repo / "refs" / "main", revision)
    return _write(repo / "snapshots" / revision / "config.json", json.dumps(config))


@pytest.mark.parametrize("model_id", sorted(HF_CONFIGS))
def test_the_table_is_what_each_config_json_says(hf_cache, model_id):
    path = _cache_model(hf_cache, model_id, HF_CONFIGS[model_id])
    found = pf.resolve_model_shape(model_id)
    assert found.detail == f"{model_id}: shapes from {path}"
    table = pf.MODEL_SHAPES[model_id.split("/")[1].lower()]
    assert dataclasses.replace(found.shape, source=table.source) == table


def test_config_json_in_the_hf_cache_wins_over_the_table(hf_cache):
    # a Qwen3-8B whose config.json says 20 heads: the check uses config.json's numbers
    _cache_model(hf_cache, "Qwen/Qwen3-8B", {**HF_CONFIGS["Qwen/Qwen3-8B"], "num_attention_heads": 20})
    results = {r.name: r for r in pf.check_config(_load(QWEN8B, ["policy.megatron_cfg.tensor_model_parallel_size=8"]))}
    assert results["model_shapes"].status == "ok"
    assert results["model_shapes"].detail.startswith("Qwen/Qwen3-8B: shapes from " + str(hf_cache))
    assert "must divide the 20 query heads and 8 KV heads" in results["trainer_parallel"].detail


def test_hf_hub_cache_takes_precedence_over_hf_home(hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub2"))
    _cache_model(hf_cache, "org/Tiny", HF_CONFIGS["Qwen/Qwen3-0.6B"])  # under HF_HOME: not read
    assert pf.resolve_model_shape("org/Tiny").shape is None
    path = _cache_model(tmp_path / "hub2", "org/Tiny", HF_CONFIGS["Qwen/Qwen3-0.6B"])
    assert pf.resolve_model_shape("org/Tiny").detail == f"org/Tiny: shapes from {path}"


def test_a_local_checkpoint_directory_is_read(hf_cache, tmp_path):
    ckpt = tmp_path / "ckpt" / "my-model"
    _write(ckpt / "config.json", json.dumps(HF_CONFIGS["Qwen/Qwen3-30B-A3B"]))
    cfg = _load(SMOKE, [f"policy.model_name={ckpt}", "policy.generation.vllm_cfg.tensor_parallel_size=1"])
    results = {r.name: r for r in pf.check_config(cfg)}
    assert results["model_shapes"].detail == f"{ckpt}: shapes from {ckpt / 'config.json'}"
    assert "vllm_fp8_shards" in results  # the shape checks ran on the MoE's numbers
    assert pf.resolve_model_shape(str(ckpt)).shape.num_experts == 128


def test_the_table_only_when_no_config_json_is_there_saying_so(hf_cache):
    results = {r.name: r for r in pf.check_config(_load(QWEN8B))}
    assert results["model_shapes"].status == "ok"
    assert results["model_shapes"].detail == (
        "Qwen/Qwen3-8B: shapes from the built-in table (hf:Qwen/Qwen3-8B config.json): no "
        f"config.json in a local directory Qwen/Qwen3-8B or in the HF cache {hf_cache} "
        "(nothing is downloaded)"
    )


def test_an_unreadable_config_json_warns_and_falls_back(hf_cache):
    broken = {k: v for k, v in HF_CONFIGS["Qwen/Qwen3-8B"].items() if k != "hidden_size"}
    path = _cache_model(hf_cache, "Qwen/Qwen3-8B", broken)
    found = pf.resolve_model_shape("Qwen/Qwen3-8B")
    assert found.shape is pf.MODEL_SHAPES["qwen3-8b"]
    assert not found.ok
    assert f"{path}: no hidden_size" in found.detail
    assert "shapes from the built-in table" in found.detail


# ---------------------------------------------------------------------------------------
# Extending: a check is one decorated function
# ---------------------------------------------------------------------------------------


def test_a_new_check_is_one_decorated_function():
    @pf.check("nvfp4_demo", needs_shape=True)
    def check_nvfp4_demo(ctx: pf.Context) -> pf.Verdict | None:
        if ctx.get("policy.generation.vllm_cfg.precision") != "fp8":
            return None  # does not apply: no line
        shards = pf.block_quantized_shards(ctx.shape, ctx.layout.vllm_tp, ctx.layout.vllm_ep)
        problems = [f"{name} = {size:g} % 512 != 0" for name, size in shards.items() if size % 512]
        return pf.Verdict(problems, "every shard is a multiple of 512", ["a demo"])

    try:
        results = [r for r in pf.check_config(_load(QWEN8B)) if r.name == "nvfp4_demo"]
        # Qwen3-8B at vLLM TP 1: k/v out = 8 x 128 = 1024 = 2 x 512; gate/up 12288 = 24 x 512
        assert [(r.status, r.detail) for r in results] == [
            ("ok", "every shard is a multiple of 512"),
            ("warn", "a demo"),
        ]
        moe = [r for r in pf.check_config(_load(MOE)) if r.name == "nvfp4_demo"]
        # Qwen3-30B-A3B at TP 2: k/v out = 2 x 128 = 256; experts 768 / 2 = 384
        assert moe[0].status == "fail"
        assert moe[0].detail == (
            "k/v_proj out = max(kv_heads / TP, 1) x head_dim = 256 % 512 != 0; "
            "expert gate/up out / down in = moe_intermediate / 2 = 384 % 512 != 0"
        )
        bf16 = pf.check_config(_load(CONFIG_DIR / "experiments" / "smoke_bf16.yaml"))
        assert "nvfp4_demo" not in {r.name for r in bf16}  # None: not applicable
        unknown = pf.check_config(_load(SMOKE, ["policy.model_name=/ckpt/my-model"]))
        assert "nvfp4_demo" not in {r.name for r in unknown}  # needs_shape, shapes unknown
        mixin = pf.check_config(_load(CONFIG_DIR / "arms" / "fp8_ais.yaml"))
        assert [r.name for r in mixin] == ["loss_fn.ais"]  # mixins=False
        with pytest.raises(ValueError, match="check 'nvfp4_demo' is registered twice"):
            pf.check("nvfp4_demo")(check_nvfp4_demo)
    finally:
        pf.CHECKS.pop("nvfp4_demo")


# ---------------------------------------------------------------------------------------
# NVFP4 / MXFP8 shards: what each format quantizes, and K per vLLM TP rank
# ---------------------------------------------------------------------------------------


def test_quantized_linears_hand_worked_qwen3_8b_at_tp2():
    shape = pf.MODEL_SHAPES["qwen3-8b"]  # hidden 4096, 32 q / 8 kv heads x 128, I = 12288
    got = {lin.module: (lin.k, lin.params) for lin in pf.quantized_linears(shape, 2, 1)}
    assert got == {
        "qkv_proj": (4096, 4096 * (4096 + 2 * 1024) / 2),  # K = hidden (column-parallel)
        "o_proj": (2048, 4096 * 4096 / 2),  # K = 32 x 128 / 2
        "gate_up_proj": (4096, 2 * 4096 * 12288 / 2),
        "down_proj": (6144, 12288 * 4096 / 2),  # K = 12288 / 2
    }
    moe = pf.MODEL_SHAPES["qwen3-30b-a3b"]  # 128 experts of 768; with vLLM EP 4 kept whole
    experts = {lin.module: lin.k for lin in pf.quantized_linears(moe, 4, 4)}
    assert experts["experts down_proj"] == 768
    assert {lin.module: lin.k for lin in pf.quantized_linears(moe, 4, 1)}["experts down_proj"] == 192


def _local_model(tmp_path: Path, **config) -> str:
    base = dict(model_type="llama", hidden_size=1024, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                intermediate_size=2816, vocab_size=32000)  # fmt: skip
    path = _write(tmp_path / "ckpt" / "tiny" / "config.json", json.dumps({**base, **config}))
    return str(path.parent)


def _failed(cfg: dict) -> dict[str, str]:
    return {r.name: r.detail for r in pf.check_config(cfg, "main") if r.status == "fail"}


def test_a_hidden_size_off_the_block_fails_gate_up_in_every_format(tmp_path):
    model = _local_model(tmp_path, hidden_size=1000)  # 1000 = 62 x 16 + 8 = 31 x 32 + 8
    for path, check, block in ((W4A16, "vllm_nvfp4_shards", 16), (MXFP8, "vllm_mxfp8_shards", 32)):
        failed = _failed(_load(path, [f"policy.model_name={model}"]))
        assert set(failed) == {check}, failed
        assert failed[check] == (
            "policy.generation.vllm_cfg.tensor_parallel_size=1: gate_up_proj in = hidden_size = "
            f"1000 = 1000 is not divisible by {block}: expected a multiple of {block} per TP "
            f"rank ({'one E4M3 scale per 16 inputs; vLLM refuses input_size_per_partition % 16' if block == 16 else 'one UE8M0 scale per 32 inputs'})"
        )  # fmt: skip
    # q/k/v take hidden too, but stay BF16 (real_quant_ignore's *self_attn*) unless quantized
    failed = _failed(_load(W4A16, [f"policy.model_name={model}",
                                   "policy.generation.real_quant_ignore=[lm_head]"]))  # fmt: skip
    assert "qkv_proj in = hidden_size = 1000" in failed["vllm_nvfp4_shards"]


def test_excluded_attention_is_not_held_to_the_block(tmp_path):
    # 12 heads x 80 = 960; vLLM TP 4: o_proj in = 240 = 15 x 16, not a multiple of 32
    model = _local_model(tmp_path, num_attention_heads=12, num_key_value_heads=12, head_dim=80)
    overrides = [f"policy.model_name={model}", "policy.generation.vllm_cfg.tensor_parallel_size=4"]
    assert _failed(_load(MXFP8, overrides)) == {}  # the arm keeps q/k/v/o_proj BF16
    failed = _failed(_load(MXFP8, [*overrides, "policy.generation.vllm_cfg.quantization_ignored_layer_kws=[]"]))
    assert (
        "o_proj in = heads x head_dim / TP = 12 x 80 / 4 = 240 is not divisible by 32" in (failed["vllm_mxfp8_shards"])
    )
    assert _failed(_load(W4A16, [*overrides, "policy.generation.real_quant_ignore=[lm_head]"])) == {}
    # ...and BF16 in every layer means BF16: NeMo-RL's per-layer switches count too
    every_layer = [*overrides, "policy.generation.vllm_cfg.quantization_ignored_layer_kws=[]",
                   "policy.generation.vllm_cfg.num_first_layers_in_bf16=4"]  # fmt: skip
    checked = [r for r in pf.check_config(_load(MXFP8, every_layer), "main")
               if r.name == "vllm_mxfp8_shards"]  # fmt: skip
    assert [(r.status, r.detail) for r in checked] == [("ok", "no linear: input dims at TP=4 are multiples of 32")]


def test_kept_in_bf16_follows_nemo_rls_switches():
    from nemo_ais.preflight.checks.formats import kept_in_bf16

    w4a16 = kept_in_bf16(_load(W4A16), 36)
    assert w4a16("model.layers.0.self_attn.q_proj") and w4a16("lm_head")
    assert not w4a16("model.layers.0.mlp.down_proj")
    mx = kept_in_bf16(_load(MXFP8, ["policy.generation.vllm_cfg.num_last_layers_in_bf16=2"]), 36)
    assert mx("model.layers.3.self_attn.o_proj") and mx("model.layers.34.mlp.up_proj")
    assert not mx("model.layers.33.mlp.up_proj")
    bf16 = kept_in_bf16(_load(CONFIG_DIR / "experiments" / "qwen3_8b_bf16.yaml"), 36)
    assert bf16("model.layers.0.mlp.down_proj")


def test_packed_micro_batches_are_cut_by_tokens_not_by_the_micro_batch_size():
    """With sequence packing NeMo-RL shards the global batch over DP and never reads train_micro_batch_size."""
    results = {r.name: r for r in pf.check_config(pf.load_config(QWEN8B, ["policy.train_micro_batch_size=3"]))}
    assert results["batch"].status == "ok", results["batch"]
    assert results["batch"].detail.endswith("gbs/DP = 64 = micro-batches by tokens (sequence_packing)")


def test_a_non_colocated_split_checks_training_and_rollout_gpus_apart():
    cfg = pf.load_config(
        QWEN8B,
        [
            "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.num_nodes=1",
            "policy.generation.colocated.resources.gpus_per_node=8",
        ],
    )
    results = {r.name: r for r in pf.check_config(cfg) if r.status != "warn"}
    assert results["trainer_parallel"].detail == "megatron, GPUs=8: TP=2 PP=1 CP=1 -> DP=4"
    assert results["vllm_parallel"].detail == "8 engine(s) of TP=1 PP=1 EP=1 on 8 rollout GPUs (8 train)"
    assert pf.gpu_split(cfg) == (8, 8) and pf.gpu_split(pf.load_config(QWEN8B)) == (16, 16)
