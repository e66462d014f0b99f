# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The offline check says which GPU a rollout format needs; v0.7.0 refuses an NVFP4 MoE refit.

Issue 27 items 3 and 5, offline (torch-free, no NeMo-RL): vLLM silently runs NVFP4 W4A4
as W4A16 and MXFP8 as W8A16 below compute capability 10.0, so a config that names them
gets a warning saying which GPUs it needs (the launcher refuses the fallback when the
engines start: tests/upstream/test_driver_main.py). NeMo-RL v0.7.0 re-processes only
dense NVFP4 layers after a refit, so ``ais_nvfp4_refit`` with an MoE policy is refused on
v0.7.0 before Ray, naming the section and the model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from shipped_configs import CONFIG_DIR

from nemo_ais import preflight as pf
from nemo_ais.preflight.loader import load_config
from nemo_ais.rules.native_kernels import HOPPER, NATIVE_KERNELS

EXPERIMENTS = CONFIG_DIR / "experiments"


def _load(path: Path) -> dict:
    return load_config(path)


def _gpu_results(cfg: dict):
    return [r for r in pf.check_config(cfg, "main") if r.name == "rollout_gpu"]


@pytest.mark.parametrize(
    ("name", "fmt"), [("qwen3_8b_nvfp4_w4a4_ais.yaml", "nvfp4_w4a4"), ("qwen3_8b_mxfp8_ais.yaml", "mxfp8")]
)
def test_a_format_hopper_cannot_run_warns_naming_the_gpus_it_needs(name, fmt):
    (result,) = _gpu_results(_load(EXPERIMENTS / name))
    assert result.status == "warn"
    assert f"({fmt}) needs GPUs of compute capability >= 10.0 (Blackwell (SM100))" in (result.detail)
    assert "on H100 / H200 (9.0) vLLM runs weight-only Marlin" in result.detail


@pytest.mark.parametrize(
    ("name", "fmt"), [("qwen3_8b_fp8_ais.yaml", "fp8"), ("qwen3_8b_nvfp4_w4a16_ais.yaml", "nvfp4_w4a16")]
)
def test_formats_hopper_runs_natively_say_so_without_a_warning(name, fmt):
    (result,) = _gpu_results(_load(EXPERIMENTS / name))
    assert result.status == "ok"
    want = ".".join(map(str, NATIVE_KERNELS[fmt].min_capability))
    assert result.detail == f"{fmt} runs natively from compute capability {want}"
    assert NATIVE_KERNELS[fmt].min_capability <= HOPPER


def test_a_bf16_rollout_has_no_gpu_line():
    assert _gpu_results(_load(EXPERIMENTS / "qwen3_8b_bf16.yaml")) == []


def _moe_nvfp4(base: dict) -> dict:
    """The W4A16 arm (ais_nvfp4_refit armed) on the MoE model's name."""
    cfg = copy.deepcopy(base)
    cfg["policy"]["model_name"] = "Qwen/Qwen3-30B-A3B"
    return cfg


def test_an_nvfp4_refit_of_an_moe_policy_is_refused_on_v0_7_0_only():
    dense = _load(EXPERIMENTS / "qwen3_8b_nvfp4_w4a16_ais.yaml")
    assert dense.get("ais_nvfp4_refit", {}).get("enabled") is True
    assert pf.rollout_format_problems(dense, "v0.7.0") == []
    moe = _moe_nvfp4(dense)
    assert pf.is_moe(moe) and not pf.is_moe(dense)
    (problem,) = pf.rollout_format_problems(moe, "v0.7.0")
    assert problem.startswith("ais_nvfp4_refit with an MoE policy ('Qwen/Qwen3-30B-A3B')")
    assert "re-processes dense NVFP4 layers only" in problem and "NeMo-RL main" in problem
    assert pf.rollout_format_problems(moe, "main") == []
    # an unknown model with expert parallelism is an MoE too
    unknown = copy.deepcopy(moe)
    unknown["policy"]["model_name"] = "my-org/unlisted-moe"
    unknown["policy"]["megatron_cfg"]["expert_model_parallel_size"] = 4
    assert len(pf.rollout_format_problems(unknown, "v0.7.0")) == 1
    # the offline check fails it for v0.7.0 and warns when the version is unknown
    failed = {r.name: r.detail for r in pf.check_config(moe, "v0.7.0") if r.status == "fail"}
    assert "re-processes dense NVFP4 layers only" in failed["nvfp4_rollout"]
    assert not [r for r in pf.check_config(moe, "main") if r.status == "fail"]
    warned = [r.detail for r in pf.check_config(moe, environ={}) if r.status == "warn"]
    assert any("an MoE policy needs NeMo-RL main" in w for w in warned)
    off = copy.deepcopy(moe)
    off["ais_nvfp4_refit"]["enabled"] = False
    assert pf.rollout_format_problems(off, "v0.7.0") == []


@pytest.mark.parametrize("version", ["v0.7.0", "main", None])
@pytest.mark.parametrize("key", ["num_first_layers_in_bf16", "num_last_layers_in_bf16"])
def test_v070s_nested_bf16_layers_warn_on_v070_only(version, key):
    cfg = _load(EXPERIMENTS / "qwen3_8b_fp8_ais.yaml")
    cfg["policy"]["generation"]["vllm_cfg"][key] = 1
    results = [r for r in pf.check_config(cfg, version, {}) if r.name == "fp8_rollout"]
    nested = [r for r in results if "its init_fp8 hands vLLM those layers' names" in r.detail]
    if version == "v0.7.0":
        (warning,) = nested
        assert warning.status == "warn" and "on NeMo-RL v0.7.0: " in warning.detail
    else:  # main flattens the list; an unknown version says nothing it cannot know
        assert nested == []
    assert all(r.status != "fail" for r in results)
