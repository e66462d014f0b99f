# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The pre-flight tool on a login node: a Python that has no torch (issue 18, item 1).

Every command runs in a subprocess where only the standard library, ``nemo_ais`` and
pydantic / omegaconf / pyyaml can be imported (``tests/torch_free.py``): torch,
transformers, tqdm, numpy and NeMo-RL raise ``ModuleNotFoundError``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, RUNS_ON
from torch_free import torch_free_env

REPO = Path(__file__).resolve().parents[2]
ALL_YAML = sorted(CONFIG_DIR.rglob("*.yaml"))
QWEN8B = CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"
SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return torch_free_env(tmp_path, {"PATH": os.environ["PATH"], "HOME": str(tmp_path)})


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_blocker_blocks(env):
    for module in ("torch", "transformers", "tqdm", "numpy", "nemo_rl"):
        res = _python(env, "-c", f"import {module}")
        assert res.returncode == 1 and f"No module named '{module}'" in res.stderr, module


@pytest.mark.parametrize("module", ["nemo_ais.preflight", "nemo_ais.nemo_rl.cluster_check"], ids=["name", "alias"])
def test_every_shipped_config_is_checked_without_torch(env, module):
    # nemo_ais.nemo_rl.cluster_check: the former name, kept as a documented alias
    res = _python(env, "-m", module, *map(str, ALL_YAML))
    assert res.returncode == 0, res.stderr
    for path in ALL_YAML:
        assert str(path) in res.stdout
    assert res.stdout.count("[OK  ] loss_fn.ais:") == len(ALL_YAML)
    assert "[FAIL]" not in res.stdout


def test_a_failing_config_fails_without_torch(env):
    res = _python(env, "-m", "nemo_ais.preflight", str(QWEN8B), "policy.train_global_batch_size=384")
    assert res.returncode == 1
    assert "[FAIL] batch: grpo.num_prompts_per_step x" in res.stdout


@pytest.mark.parametrize("module", ["nemo_ais.preflight.memory_budget", "nemo_ais.nemo_rl.memory_budget"])
def test_memory_budget_runs_without_torch(env, module):
    res = _python(env, "-m", module, str(QWEN8B))
    assert res.returncode == 0, res.stderr
    assert "| qwen3_8b_2n8g_fp8 | Qwen/Qwen3-8B; 16 GPUs: TP2 PP1 CP1 DP8" in res.stdout


def _launcher(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "launchers" / script), "--dry-run", *args],
        env={**env, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_both_launchers_dry_run_with_a_python_without_torch(env, tmp_path):
    nemo_rl = tmp_path / "NeMo-RL"
    (nemo_rl / "nemo_rl").mkdir(parents=True)
    (nemo_rl / "ray.sub").write_text("#!/bin/bash\n")
    local = _launcher("local_grpo_ais.sh", str(SMOKE), env={**env, "NEMO_RL_DIR": str(nemo_rl)})
    assert local.returncode == 0, local.stderr
    assert local.stdout.splitlines()[-1].endswith(f"--config {SMOKE}")
    slurm_env = {
        **env,
        "NEMO_RL_DIR": str(nemo_rl),
        "CONTAINER": "/images/nemo_rl.sqsh",
        "ACCOUNT": "acct",
        "PARTITION": "batch",
    }
    slurm = _launcher("slurm_grpo_ais.sh", str(SMOKE), env=slurm_env)
    assert slurm.returncode == 0, slurm.stderr
    assert slurm.stdout.splitlines()[-1].startswith("sbatch --nodes=1 ")
    # ...and the check did run there: a broken layout is refused by the same Python
    broken = _launcher("slurm_grpo_ais.sh", str(SMOKE), "cluster.gpus_per_node=3", env=slurm_env)
    assert broken.returncode == 2, broken.stderr
    assert "[FAIL] batch: policy.train_global_batch_size=32 is not divisible" in broken.stderr


FORMAT_CONFIGS = [
    CONFIG_DIR / "experiments" / f"qwen3_8b_{fmt}_ais.yaml" for fmt in ("nvfp4_w4a16", "nvfp4_w4a4", "mxfp8")
]
MAIN_TREE = REPO.parent / "shared" / "vendor" / "nemo-rl-main-7ea279a"


def test_the_rollout_format_checks_run_without_torch(env):
    # nemo_ais.preflight.checks.formats and .nemo_rl_target: version table, switches, shards
    res = _python(env, "-m", "nemo_ais.preflight", "--nemo-rl-version", "main",
                  *map(str, FORMAT_CONFIGS))  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("[OK  ] rollout_format:") == 3
    assert res.stdout.count("[OK  ] vllm_nvfp4_shards:") == 2
    assert res.stdout.count("[OK  ] vllm_mxfp8_shards:") == 1
    assert "[OK  ] nvfp4_rollout: NVFP4 W4A4 real-quant" in res.stdout
    assert "[OK  ] mxfp8_rollout: MXFP8" in res.stdout
    refused = _python(env, "-m", "nemo_ais.preflight", "--nemo-rl-version", "v0.7.0",
                      str(FORMAT_CONFIGS[1]))  # fmt: skip
    assert refused.returncode == 1
    assert "needs NeMo-RL main; NeMo-RL v0.7.0 lacks it" in refused.stdout
    # NEMO_RL_DIR: main's source is read (never imported: nemo_rl stays unimportable here)
    by_source = _python({**env, "NEMO_RL_DIR": str(MAIN_TREE)}, "-m", "nemo_ais.preflight",
                        str(FORMAT_CONFIGS[2]))  # fmt: skip
    assert by_source.returncode == 0, by_source.stdout + by_source.stderr
    assert f"checked against the NeMo-RL at NEMO_RL_DIR={MAIN_TREE}" in by_source.stdout


VENDOR = REPO.parent / "shared" / "vendor"
TREES = {"v0.7.0": VENDOR / "nemo-rl-v0.7.0", "main": VENDOR / "nemo-rl-main-7ea279a"}


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_full_config_dry_runs_through_its_launcher_without_torch(env, path):
    # the NeMo-RL the config runs on (main for W4A4 / MXFP8): its real tree, read, not imported
    tree = TREES["v0.7.0" if "v0.7.0" in RUNS_ON[path] else "main"]
    slurm_env = {
        **env,
        "NEMO_RL_DIR": str(tree),
        "CONTAINER": "/images/nemo_rl.sqsh",
        "ACCOUNT": "acct",
        "PARTITION": "batch",
        "HF_HOME": "/lustre/hf",  # multi-node: a path every node mounts (not on this node)
    }
    slurm = _launcher("slurm_grpo_ais.sh", str(path), env=slurm_env)
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    assert slurm.stdout.splitlines()[-1].startswith("sbatch --nodes=")
    nodes = subprocess.run(
        [sys.executable, "-m", "nemo_ais.preflight", "--get", "cluster.num_nodes", str(path)],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if nodes == "1":  # the local launcher takes single-node configs only
        local = _launcher("local_grpo_ais.sh", str(path), env={**env, "NEMO_RL_DIR": str(tree)})
        assert local.returncode == 0, local.stdout + local.stderr
        assert local.stdout.splitlines()[-1].endswith(f"--config {path}")
