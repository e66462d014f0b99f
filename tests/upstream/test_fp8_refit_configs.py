# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every shipped FP8 config arms the AIS FP8 refit; BF16 ones do not (issue 11, defect 6).

Each full config under ``configs/nemo_rl/`` (recursive, arm mixins excluded) is loaded
with the launcher's ``load_config_dict`` (NeMo-RL's real ``load_config``, resolvers and
``OmegaConf.to_container``) and passed to the launcher's real ``configure_fp8_refit``
with a private environment dict. For an FP8 rollout (``vllm_cfg.precision: fp8``) it must
return an enabled :class:`~nemo_ais.fp8.Fp8SyncConfig` with ``backend: auto`` whose JSON is
in ``NEMO_AIS_REFIT`` and put ``nemo_ais/nemo_rl/_vllm_hook`` first on ``PYTHONPATH``;
for a BF16 rollout it must leave the environment untouched. Then, for the smoke config:
NeMo-RL's real ``init_ray`` (the Ray start stubbed: ``ray.init`` records its
``runtime_env``, ``ray.cluster_resources`` is an external cluster's) hands
both variables to every Ray worker. A fresh interpreter started with that environment (a
Ray worker) holds only the stdlib trampoline, no torch and no nemo_ais; as a vLLM worker it
gets NeMo-RL's real FP8 module wrapped when it imports it (success logged at WARNING); a
broken arming fails that import loudly instead of refitting with NeMo-RL's quantizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nemo_rl.distributed.virtual_cluster as nrl_virtual_cluster
import pytest
from nemo_rl.utils.config import register_omegaconf_resolvers
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, launcher

from nemo_ais.fp8 import Fp8SyncConfig
from nemo_ais.nemo_rl.refit import ENV_VAR

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]
HOOK_DIR = REPO_ROOT / "nemo_ais" / "nemo_rl" / "_vllm_hook"

run = launcher()


def _load(path: Path) -> dict:
    register_omegaconf_resolvers()
    return run.load_config_dict(str(path), [])


def _vllm_cfg(cfg: dict) -> dict:
    return cfg["policy"]["generation"]["vllm_cfg"]


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def test_the_shipped_configs_cover_fp8_and_bf16_rollouts():
    precisions = {_rel(p): _vllm_cfg(_load(p))["precision"] for p in FULL_CONFIGS}
    fp8 = sorted(k for k, v in precisions.items() if v == "fp8")
    assert "grpo_ais_base.yaml" in fp8 and "qwen3_8b_2n8g_fp8.yaml" in fp8
    assert "experiments/qwen3_8b_fp8_ais.yaml" in fp8
    assert sorted(k for k, v in precisions.items() if v != "fp8") == [
        "experiments/qwen3_8b_bf16.yaml",
        "experiments/qwen3_8b_nvfp4_qarl_tbpo.yaml",  # NVFP4 packed by NeMo-RL's QAT worker
        "experiments/qwen3_8b_nvfp4_w4a16_ais.yaml",  # NVFP4 is vLLM's ModelOpt quantization:
        "experiments/qwen3_8b_nvfp4_w4a4_ais.yaml",  # precision bfloat16, ais_nvfp4_refit
        "experiments/smoke_bf16.yaml",
    ]
    assert "experiments/qwen3_8b_mxfp8_ais.yaml" in fp8  # MXFP8: upstream's, through the hook


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_every_fp8_config_arms_the_refit_hook_and_bf16_ones_do_not(path):
    cfg = _load(path)
    env = {"PYTHONPATH": "/opt/site:/x"}
    refit = run.configure_fp8_refit(cfg, env)
    vllm_cfg = _vllm_cfg(cfg)
    if vllm_cfg["precision"] != "fp8":
        assert refit is None and env == {"PYTHONPATH": "/opt/site:/x"}
        return
    assert isinstance(refit, Fp8SyncConfig) and refit.enabled
    assert refit.backend == "auto"
    assert refit.family == "multiplier"  # Transformer Engine's formula: auto may pick TE
    assert refit.tp_size == vllm_cfg["tensor_parallel_size"]
    assert refit.ue8m0 == vllm_cfg["pow2_weight_scaling_factors"]
    assert refit.num_first_layers_in_bf16 == vllm_cfg["num_first_layers_in_bf16"]
    assert refit.num_last_layers_in_bf16 == vllm_cfg["num_last_layers_in_bf16"]
    assert Fp8SyncConfig.model_validate(json.loads(env[ENV_VAR])) == refit
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/opt/site", "/x"]
    assert (HOOK_DIR / "sitecustomize.py").is_file()


@pytest.fixture
def smoke_env(monkeypatch):
    """The launcher's environment after configure_fp8_refit on the smoke config."""
    monkeypatch.setenv(ENV_VAR, "")  # recorded: removed again at teardown
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    refit = run.configure_fp8_refit(_load(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"))
    assert refit is not None
    return refit


def test_nemo_rl_init_ray_forwards_the_hook_to_every_worker(smoke_env, monkeypatch):
    calls = []

    def ray_init(*args, **kwargs):  # the Ray start; record what every worker will inherit
        calls.append(kwargs)

    monkeypatch.setattr(nrl_virtual_cluster.ray, "init", ray_init)
    # an attached, externally managed cluster (as under ray.sub): init_ray returns
    monkeypatch.setattr(nrl_virtual_cluster.ray, "cluster_resources", lambda: {"GPU": 8.0})
    nrl_virtual_cluster.init_ray()
    assert len(calls) == 1 and calls[0]["address"] == "auto"
    worker_env = calls[0]["runtime_env"]["env_vars"]
    assert Fp8SyncConfig.model_validate_json(worker_env[ENV_VAR]) == smoke_env
    assert worker_env["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK_DIR)


# What a fresh Ray worker interpreter does with the launcher's environment: before any
# import, only the stdlib trampoline (no torch, no nemo_ais); then, as a vLLM worker, it
# imports NeMo-RL's real FP8 module (vLLM names: tests/_vllm_boundary.py placeholders).
_WORKER_PROBE = """
import json, sys
before = {"torch": "torch" in sys.modules, "nemo_ais": "nemo_ais" in sys.modules,
          "hooks": [type(f).__name__ for f in sys.meta_path
                    if getattr(f, "nemo_ais_fp8_refit", False)]}
if sys.argv[1] == "vllm":
    sys.path.insert(0, sys.argv[2])
    import _vllm_boundary
    sys.modules.update(_vllm_boundary._vllm_modules())
    import nemo_rl.models.generation.vllm.quantization.fp8 as fp8
    from nemo_ais.nemo_rl import refit
    status = refit.hook_status()._asdict()
    status["is_ours"] = getattr(fp8.load_weights, "__nemo_ais_refit__", False)
else:
    status = None
print(json.dumps({"before": before, "status": status}))
"""


def _fresh_worker(env: dict, role: str) -> tuple[dict, str]:
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_PROBE, role, str(REPO_ROOT / "tests")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _worker_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO_ROOT)])
    return env


def test_a_fresh_worker_interpreter_arms_the_hook_without_importing_torch(smoke_env):
    result, _ = _fresh_worker(_worker_env(), "ray-worker")
    assert result["before"] == {"torch": False, "nemo_ais": False,
                                "hooks": ["AISFp8RefitTrampoline"]}  # fmt: skip


def test_the_vllm_worker_gets_the_patch_when_it_imports_nemo_rls_fp8_module(smoke_env):
    result, stderr = _fresh_worker(_worker_env(), "vllm")
    status = result["status"]
    assert (status["configured"], status["armed"], status["imported"], status["patched"]) == (True, True, True, True)
    assert status["error"] is None and status["is_ours"] is True
    # success is logged at WARNING (seen with Python's default logging level)
    assert "load_weights wrapped in pid" in stderr and "quantized to fp8 by nemo_ais" in stderr


def test_a_broken_refit_config_fails_the_vllm_worker_loudly(smoke_env):
    env = _worker_env()
    env[ENV_VAR] = '{"famly": "a"}'  # a typo in the JSON the launcher would never write
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_PROBE, "vllm", str(REPO_ROOT / "tests")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0  # the import of NeMo-RL's FP8 module fails: no silent fallback
    assert "AIS FP8 refit could NOT be armed" in out.stderr
    assert "famly" in out.stderr and "Extra inputs are not permitted" in out.stderr
