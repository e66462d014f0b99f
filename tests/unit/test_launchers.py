# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""launchers/*.sh: syntax, --help, exact --dry-run output, errors, and dry-run == real run.

The "real run" tests put a fake ``sbatch`` (or RUNNER) on PATH that records its argv,
working directory and environment, so we check that what --dry-run prints is exactly
what the launcher executes. No Slurm, NeMo-RL or GPU is needed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from torch_free import ALLOWED, torch_free_env

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "launchers" / "local_grpo_ais.sh"
SLURM = REPO / "launchers" / "slurm_grpo_ais.sh"
CFG = REPO / "configs" / "nemo_rl"
QWEN8B = CFG / "qwen3_8b_2n8g_fp8.yaml"
MOE = CFG / "qwen3_30b_a3b_2n8g_fp8_ep8.yaml"
SMOKE = CFG / "smoke_qwen3_0.6b_1n.yaml"
ENTRY = REPO / "launchers" / "run_grpo_ais.py"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# What the Slurm COMMAND runs first: PYTHONPATH is joined in the job, by _pythonpath.sh.
_JOB_PYTHONPATH = f'source {REPO}/launchers/_pythonpath.sh && export PYTHONPATH="$(pythonpath_with {REPO})"'

# Records argv (one per line), cwd and selected environment variables.
_RECORDER = """#!/usr/bin/env bash
{{
  echo "cwd=$PWD"
  for v in COMMAND CONTAINER MOUNTS GPUS_PER_NODE PYTHONPATH; do echo "env:$v=${{!v-<unset>}}"; done
  for a in "$@"; do echo "arg=$a"; done
}} > {out}
"""


# A fake `stat -f -c %T DIR` (first on PATH in _slurm_env): "lustre" under ROOT/lustre and
# the fixture's checkout ROOT/NeMo-RL, a node-local type elsewhere, so the shared-filesystem check is independent of this machine.
_FAKE_STAT = """#!/usr/bin/env bash
case "${{@: -1}}" in {root}/lustre | {root}/lustre/* | {root}/NeMo-RL | {root}/NeMo-RL/*) echo lustre ;;
  *) echo ext2/ext3 ;; esac
"""


@pytest.fixture
def nemo_rl_dir(tmp_path: Path) -> Path:
    """A NeMo-RL checkout; beside it lustre/hf (a shared HF_HOME) and fsbin/stat."""
    root = tmp_path / "NeMo-RL"
    (root / "nemo_rl").mkdir(parents=True)
    (root / "ray.sub").write_text("#!/bin/bash\n")
    (tmp_path / "lustre" / "hf").mkdir(parents=True)
    (tmp_path / "fsbin").mkdir()
    (tmp_path / "fsbin" / "stat").write_text(_FAKE_STAT.format(root=tmp_path))
    (tmp_path / "fsbin" / "stat").chmod(0o755)
    return root


def _env(**extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": "",
        "PYTHON": sys.executable,
    }
    env.update(extra)
    return env


def _run(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _slurm_env(nemo_rl_dir: Path, **extra: str) -> dict[str, str]:
    """The required variables, HF_HOME on the (fake) shared filesystem, the fake stat."""
    root = nemo_rl_dir.parent
    return _env(
        **{
            "NEMO_RL_DIR": str(nemo_rl_dir),
            "CONTAINER": "/images/nemo_rl-v0.7.0.sqsh",
            "ACCOUNT": "my_acct",
            "PARTITION": "batch",
            "HF_HOME": str(root / "lustre" / "hf"),
            "PATH": f"{root / 'fsbin'}:{os.environ['PATH']}",
            **extra,
        }
    )


def _hf(nemo_rl_dir: Path) -> str:
    return str(nemo_rl_dir.parent / "lustre" / "hf")


@pytest.mark.parametrize("script", [LOCAL, SLURM], ids=lambda p: p.name)
def test_syntax_and_help(script):
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    text = script.read_text()
    assert "set -euo pipefail" in text
    res = _run(script, "--help", env=_env())
    assert res.returncode == 0
    assert res.stdout.startswith(f"Usage: launchers/{script.name} [--dry-run]")
    assert "--dry-run" in res.stdout and "NEMO_RL_DIR" in res.stdout


# ------------------------------------------------------------------------------- local


def test_local_dry_run_exact(nemo_rl_dir):
    res = _run(
        LOCAL,
        "--dry-run",
        SMOKE,
        "grpo.max_num_steps=2",
        'logger.wandb.name="it\'s me"',  # Hydra's grammar: a quote in a quoted value
        env=_env(NEMO_RL_DIR=str(nemo_rl_dir)),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"cd {nemo_rl_dir}",
        f"export PYTHONPATH={REPO}",
        f"uv run python {ENTRY} --config {SMOKE} grpo.max_num_steps=2 'logger.wandb.name=\"it'\\''s me\"'",
    ]
    # The printed lines are valid shell that re-creates the same argv.
    assert shlex.split(res.stdout.splitlines()[2])[-1] == 'logger.wandb.name="it\'s me"'


def test_local_real_run_matches_dry_run(nemo_rl_dir, tmp_path):
    record = tmp_path / "record.txt"
    runner = tmp_path / "fake_runner"
    runner.write_text(_RECORDER.format(out=record))
    runner.chmod(0o755)
    env = _env(NEMO_RL_DIR=str(nemo_rl_dir), RUNNER=f"{runner} -u", PYTHONPATH="/opt/x")
    dry = _run(LOCAL, "--dry-run", SMOKE, "loss_fn.ais.mode=tis", env=env)
    assert dry.returncode == 0, dry.stderr
    real = _run(LOCAL, SMOKE, "loss_fn.ais.mode=tis", env=env)
    assert real.returncode == 0, real.stderr
    lines = record.read_text().splitlines()
    assert lines[0] == f"cwd={nemo_rl_dir}"
    assert f"env:PYTHONPATH={REPO}:/opt/x" in lines
    argv = [line.removeprefix("arg=") for line in lines if line.startswith("arg=")]
    assert dry.stdout.splitlines() == [
        f"cd {nemo_rl_dir}",
        f"export PYTHONPATH={REPO}:/opt/x",
        shlex.join([str(runner), *argv]),
    ]
    assert argv == ["-u", str(ENTRY), "--config", str(SMOKE), "loss_fn.ais.mode=tis"]


def test_local_errors(nemo_rl_dir, tmp_path):
    res = _run(LOCAL, "--dry-run", SMOKE, env=_env())
    assert res.returncode == 2
    assert "NEMO_RL_DIR is not set" in res.stderr
    res = _run(LOCAL, "--dry-run", SMOKE, env=_env(NEMO_RL_DIR=str(tmp_path)))
    assert res.returncode == 2 and "is not a NeMo-RL checkout" in res.stderr
    res = _run(LOCAL, "--dry-run", tmp_path / "nope.yaml", env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 2 and "nope.yaml does not exist" in res.stderr
    res = _run(LOCAL, "--dry-run", QWEN8B, env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 2
    assert "runs on cluster.num_nodes=2: use launchers/slurm_grpo_ais.sh" in res.stderr
    res = _run(LOCAL, "--bogus", SMOKE, env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 2 and "unknown option --bogus" in res.stderr
    assert res.stdout == ""


def test_local_refuses_an_arm_mixin(nemo_rl_dir):
    res = _run(LOCAL, "--dry-run", CFG / "arms" / "fp8_ais.yaml", env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 2 and res.stdout == ""
    assert "fp8_ais.yaml: an arm mixin (no policy/cluster section), not a full config" in res.stderr


def test_local_refuses_a_broken_layout(nemo_rl_dir):
    res = _run(
        LOCAL,
        "--dry-run",
        SMOKE,
        "policy.megatron_cfg.tensor_model_parallel_size=3",
        env=_env(NEMO_RL_DIR=str(nemo_rl_dir)),
    )
    assert res.returncode == 2
    assert res.stdout == ""  # nothing printed as "would run"
    assert "[FAIL] trainer_parallel: GPUs = cluster.num_nodes x cluster.gpus_per_node = 1" in res.stderr
    # the command it names reproduces the failure: the overrides and NEMO_RL_DIR (the version) are part of it
    assert (
        f"fails the offline checks above (NEMO_RL_DIR={nemo_rl_dir} python -m nemo_ais.preflight {SMOKE} "
        "policy.megatron_cfg.tensor_model_parallel_size=3)" in res.stderr
    )


# ------------------------------------------------------------------------------- slurm


def test_slurm_dry_run_exact(nemo_rl_dir):
    res = _run(SLURM, "--dry-run", QWEN8B, "loss_fn.ais.mode=tis", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    hf = _hf(nemo_rl_dir)
    command = (
        f"export HF_HOME={hf} && {_JOB_PYTHONPATH} && uv run python {ENTRY} --config {QWEN8B} "
        "loss_fn.ais.mode=tis checkpointing.checkpoint_must_save_by=00:03:40:00"
    )
    assert res.stdout.splitlines() == [
        f"cd {nemo_rl_dir}",
        f"export COMMAND='{command}'",
        "export CONTAINER=/images/nemo_rl-v0.7.0.sqsh",
        f"export MOUNTS={nemo_rl_dir}:{nemo_rl_dir},{REPO}:{REPO},{hf}:{hf}",
        "export GPUS_PER_NODE=8",
        f"sbatch --nodes=2 --account=my_acct --partition=batch "
        f"--job-name=nemo-ais-qwen3_8b_2n8g_fp8 --time=04:00:00 {nemo_rl_dir}/ray.sub",
    ]


def test_slurm_dry_run_options_and_node_override(nemo_rl_dir):
    env = _slurm_env(
        nemo_rl_dir,
        HF_HOME="/data/hf",
        GRES="gpu:8",
        TIME="1:00:00",
        JOB_NAME="moe4",
        SBATCH_ARGS="--exclusive --mem=0",
        EXTRA_MOUNTS="/scratch:/scratch",
        NUM_NODES="4",
    )
    res = _run(SLURM, "--dry-run", MOE, "cluster.num_nodes=4", env=env)
    assert res.returncode == 0, res.stderr
    # /data does not exist on this (login) node: not refused, but said, and that it cannot be created here
    assert res.stderr == (
        "slurm_grpo_ais.sh: warning: cannot tell from this node whether HF_HOME=/data/hf is on "
        "a filesystem every node mounts (/data does not exist here)\n"
        "slurm_grpo_ais.sh: warning: HF_HOME=/data/hf is not created here (/data does not exist on this node): it "
        "must exist on the compute nodes before the job starts (a container mount needs its source)\n"
    )
    lines = res.stdout.splitlines()
    assert lines[1] == (
        f"export COMMAND='export HF_HOME=/data/hf && {_JOB_PYTHONPATH} "
        f"&& uv run python {ENTRY} --config {MOE} cluster.num_nodes=4 "
        "checkpointing.checkpoint_must_save_by=00:00:40:00'"  # TIME 1:00:00 - 20 min
    )
    assert lines[3] == (f"export MOUNTS={nemo_rl_dir}:{nemo_rl_dir},{REPO}:{REPO},/data/hf:/data/hf,/scratch:/scratch")
    assert lines[5] == (
        f"sbatch --nodes=4 --account=my_acct --partition=batch --job-name=moe4 --time=1:00:00 "
        f"--gres=gpu:8 --exclusive --mem=0 {nemo_rl_dir}/ray.sub"
    )


def test_slurm_real_run_matches_dry_run(nemo_rl_dir, tmp_path):
    record = tmp_path / "record.txt"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(_RECORDER.format(out=record))
    (bindir / "sbatch").chmod(0o755)
    env = _slurm_env(nemo_rl_dir)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    dry = _run(SLURM, "--dry-run", QWEN8B, "grpo.seed=7", env=env)
    real = _run(SLURM, QWEN8B, "grpo.seed=7", env=env)
    assert dry.returncode == 0 and real.returncode == 0, (dry.stderr, real.stderr)
    lines = record.read_text().splitlines()
    argv = [line.removeprefix("arg=") for line in lines if line.startswith("arg=")]
    recorded_env = dict(line.removeprefix("env:").split("=", 1) for line in lines if line.startswith("env:"))
    # Re-play the dry-run's exports in a shell and compare with what sbatch received.
    replay = subprocess.run(
        ["bash", "-c", dry.stdout.rsplit("\n", 2)[0] + '\nprintf "%s\\n" "$COMMAND" "$MOUNTS"'],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    ).stdout.splitlines()
    assert lines[0] == f"cwd={nemo_rl_dir}"
    assert replay == [recorded_env["COMMAND"], recorded_env["MOUNTS"]]
    assert recorded_env["CONTAINER"] == "/images/nemo_rl-v0.7.0.sqsh"
    assert recorded_env["GPUS_PER_NODE"] == "8"
    assert dry.stdout.splitlines()[-1] == shlex.join(["sbatch", *argv])


def test_slurm_missing_env_names_every_variable(nemo_rl_dir):
    res = _run(SLURM, "--dry-run", QWEN8B, env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 2
    assert "set CONTAINER ACCOUNT PARTITION (see --help)" in res.stderr
    res = _run(SLURM, "--dry-run", QWEN8B, env=_env())
    assert "set NEMO_RL_DIR CONTAINER ACCOUNT PARTITION" in res.stderr
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir.parent))
    assert res.returncode == 2 and "has no ray.sub" in res.stderr


def test_slurm_node_count_must_match_config(nemo_rl_dir):
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, NUM_NODES="4"))
    assert res.returncode == 2
    assert "NUM_NODES=4 but the config has cluster.num_nodes=2 (override it: cluster.num_nodes=4)" in res.stderr
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, GPUS_PER_NODE="4"))
    assert "GPUS_PER_NODE=4 but the config has cluster.gpus_per_node=8" in res.stderr


def test_slurm_refuses_a_broken_layout(nemo_rl_dir):
    res = _run(
        SLURM, "--dry-run", MOE, "policy.generation.vllm_cfg.tensor_parallel_size=4", env=_slurm_env(nemo_rl_dir)
    )
    assert res.returncode == 2 and res.stdout == ""
    assert "[FAIL] vllm_fp8_shards: expert gate/up out / down in = moe_intermediate / 4 = 192" in res.stderr
    assert (
        f"fails the offline checks above (NEMO_RL_DIR={nemo_rl_dir} python -m nemo_ais.preflight {MOE} "
        "policy.generation.vllm_cfg.tensor_parallel_size=4)" in res.stderr
    )


def test_slurm_skip_check_needs_sizes_and_then_runs_without_python(nemo_rl_dir):
    env = _slurm_env(nemo_rl_dir, PYTHON="/nonexistent/python")
    res = _run(SLURM, "--dry-run", "--skip-check", QWEN8B, env=env)
    assert res.returncode == 2 and "--skip-check needs NUM_NODES and GPUS_PER_NODE" in res.stderr
    res = _run(SLURM, "--dry-run", "--skip-check", QWEN8B, env={**env, "NUM_NODES": "2", "GPUS_PER_NODE": "8"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].startswith("sbatch --nodes=2 ")
    # the config is not read: an absolute checkpoint or log directory is the user's to mount
    assert "--skip-check does not read the config, so it neither creates, mounts nor checks an absolute " in res.stderr
    assert "does not mount what the job reads (an absolute model, pretrained checkpoint or data path, " in res.stderr
    assert res.stderr.endswith("Create them and add them to EXTRA_MOUNTS (src:dst)\n")


def test_slurm_config_outside_the_repo_is_mounted(nemo_rl_dir, tmp_path):
    outside = tmp_path / "mine"
    outside.mkdir()
    cfg = outside / "my.yaml"
    cfg.write_text(f"defaults: {QWEN8B}\n")
    res = _run(SLURM, "--dry-run", cfg, env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    hf = _hf(nemo_rl_dir)
    assert res.stdout.splitlines()[3] == (
        f"export MOUNTS={nemo_rl_dir}:{nemo_rl_dir},{REPO}:{REPO},{outside}:{outside},{hf}:{hf}"
    )


# ------------------------------------------------------------------ PYTHONPATH: no empty entry
# An empty PYTHONPATH entry (leading/trailing ':' or '::') is the working directory: on the
# driver's and every Ray worker's sys.path it lets any file there shadow a module.

UNSET = None  # PYTHONPATH not in the environment at all


def _assert_clean_pythonpath(value: str, first: str) -> None:
    assert value.split(":")[0] == first, value
    assert "" not in value.split(":"), f"empty PYTHONPATH entry in {value!r}"
    assert not value.startswith(":") and not value.endswith(":") and "::" not in value, value


def _env_with_pythonpath(inherited: str | None, **extra: str) -> dict[str, str]:
    env = _env(**extra)
    if inherited is UNSET:
        del env["PYTHONPATH"]
    else:
        env["PYTHONPATH"] = inherited
    return env


@pytest.mark.parametrize(
    ("inherited", "expected"),
    [
        (UNSET, "/repo"),
        ("", "/repo"),
        ("/a", "/repo:/a"),
        ("/a:/b", "/repo:/a:/b"),
        (":/a::/b:", "/repo:/a:/b"),  # empty entries in the inherited value are dropped too
        ("::", "/repo"),
        ("/repo:/a", "/repo:/a"),  # not repeated
        ("/a b:/c", "/repo:/a b:/c"),
    ],
)
def test_pythonpath_with_never_has_an_empty_entry(inherited, expected):
    script = f"source {shlex.quote(str(REPO / 'launchers' / '_pythonpath.sh'))}; pythonpath_with /repo"
    res = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=_env_with_pythonpath(inherited),
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected + "\n"
    _assert_clean_pythonpath(res.stdout.strip(), "/repo")


@pytest.mark.parametrize("inherited", [UNSET, "", "/opt/x", "/opt/x::/opt/y:"])
def test_local_pythonpath_has_no_empty_entry(nemo_rl_dir, tmp_path, inherited):
    record = tmp_path / "record.txt"
    runner = tmp_path / "fake_runner"
    runner.write_text(_RECORDER.format(out=record))
    runner.chmod(0o755)
    env = _env_with_pythonpath(inherited, NEMO_RL_DIR=str(nemo_rl_dir), RUNNER=str(runner))
    real = _run(LOCAL, SMOKE, env=env)
    assert real.returncode == 0, real.stderr
    lines = record.read_text().splitlines()
    pythonpath = next(x for x in lines if x.startswith("env:PYTHONPATH=")).split("=", 1)[1]
    _assert_clean_pythonpath(pythonpath, str(REPO))
    assert pythonpath == ":".join([str(REPO), *filter(None, (inherited or "").split(":"))])
    dry = _run(LOCAL, "--dry-run", SMOKE, env=env)
    assert dry.stdout.splitlines()[1] == f"export PYTHONPATH={shlex.quote(pythonpath)}"


@pytest.mark.parametrize("container_pythonpath", [UNSET, "", "/opt/nemo-rl", "/opt/a::/opt/b:"])
def test_slurm_job_pythonpath_has_no_empty_entry(nemo_rl_dir, tmp_path, container_pythonpath):
    """Run the job's COMMAND as ray.sub does (`bash -c "$COMMAND"` in the container)."""
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    exports = res.stdout.rsplit("\n", 2)[0]
    command = subprocess.run(
        ["bash", "-c", exports + '\nprintf "%s" "$COMMAND"'], capture_output=True, text=True, check=True, env=_env()
    ).stdout
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "record.txt"
    (bindir / "uv").write_text(_RECORDER.format(out=record))
    (bindir / "uv").chmod(0o755)
    job = subprocess.run(
        ["bash", "-c", command],
        env=_env_with_pythonpath(container_pythonpath, PATH=f"{bindir}:{os.environ['PATH']}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert job.returncode == 0, job.stderr
    lines = record.read_text().splitlines()
    pythonpath = next(x for x in lines if x.startswith("env:PYTHONPATH=")).split("=", 1)[1]
    _assert_clean_pythonpath(pythonpath, str(REPO))
    kept = list(filter(None, (container_pythonpath or "").split(":")))
    assert pythonpath == ":".join([str(REPO), *kept])
    argv = [x.removeprefix("arg=") for x in lines if x.startswith("arg=")]
    assert argv == [
        "run",
        "python",
        str(ENTRY),
        "--config",
        str(QWEN8B),
        "checkpointing.checkpoint_must_save_by=00:03:40:00",
    ]


def test_nemo_ais_dir_with_a_colon_is_refused(nemo_rl_dir, tmp_path):
    res = _run(LOCAL, "--dry-run", SMOKE, env=_env(NEMO_RL_DIR=str(nemo_rl_dir), NEMO_AIS_DIR=f"{tmp_path}/a:b"))
    assert res.returncode == 2 and res.stdout == ""
    assert "contains ':' (it must be one PYTHONPATH entry)" in res.stderr


# ------------------------------------------------- the offline check's Python (login node)


def _fake_python(tmp_path: Path, stderr: str) -> Path:
    """An interpreter that cannot run the probe (e.g. Python 2: a SyntaxError traceback)."""
    fake = tmp_path / "python2"
    fake.write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' {shlex.quote(stderr)} >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def _no_pydantic_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A Python whose pydantic cannot be imported (everything but it allowed)."""
    env = torch_free_env(tmp_path, _env(**extra), allowed=set(ALLOWED) - {"pydantic"})
    return env


@pytest.mark.parametrize("script", [LOCAL, SLURM], ids=lambda p: p.name)
@pytest.mark.parametrize("case", ["missing", "no-pydantic", "python2"])
def test_a_python_that_cannot_run_the_check_is_named_in_one_line(script, case, nemo_rl_dir, tmp_path):
    env = _slurm_env(nemo_rl_dir) if script == SLURM else _env(NEMO_RL_DIR=str(nemo_rl_dir))
    if case == "missing":
        env["PYTHON"] = "/nonexistent/python3"
        why = "/nonexistent/python3: No such file or directory"
    elif case == "no-pydantic":
        env = {**env, "PYTHONPATH": _no_pydantic_env(tmp_path)["PYTHONPATH"]}
        why = "pydantic is not importable (No module named 'pydantic'"
    else:
        fake = _fake_python(tmp_path, '  File "x", line 1\nSyntaxError: invalid syntax')
        env["PYTHON"] = str(fake)
        why = "SyntaxError: invalid syntax"
    res = _run(script, "--dry-run", SMOKE, env=env)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()  # one line: no traceback, no "the config fails"
    python = env["PYTHON"]
    assert line.startswith(f"{script.name}: error: PYTHON={python} cannot run the offline check")
    assert why in line
    assert line.endswith(
        "set PYTHON=/path/to/python (Python >= 3.11 with pydantic>=2.7, omegaconf>=2.3, "
        "pyyaml>=6.0, hydra-core>=1.3; launchers/README.md), or pass --skip-check"
    )
    assert "fails the offline checks" not in line


def test_what_the_launchers_ask_for_is_what_the_probe_checks_and_pyproject_declares():
    from nemo_ais.preflight import requirements

    common = (REPO / "launchers" / "_common.sh").read_text()
    assert f'PREFLIGHT_NEEDS="{requirements.describe()}"\n' in common
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=" + ".".join(map(str, requirements.PYTHON))
    for _, dist, floor in requirements.REQUIREMENTS:
        assert f"{dist}>={'.'.join(map(str, floor))}" in project["dependencies"], dist
    # and this interpreter (the test suite's) passes the probe
    probe = REPO / "nemo_ais" / "preflight" / "requirements.py"
    res = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, check=False)
    assert (res.returncode, res.stdout) == (0, "")


# ------------------------------------ several nodes: the converted checkpoint's directory
# NeMo-RL converts the HF checkpoint to Megatron format once, in NRL_MEGATRON_CHECKPOINT_DIR,
# else $HF_HOME/nemo_rl, else ~/.cache/huggingface/nemo_rl, and every node reads it.


def test_several_nodes_need_a_shared_hf_home_or_checkpoint_dir(nemo_rl_dir):
    env = _slurm_env(nemo_rl_dir)
    del env["HF_HOME"]
    res = _run(SLURM, "--dry-run", QWEN8B, env=env)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        "slurm_grpo_ais.sh: error: cluster.num_nodes=2: set HF_HOME (or "
        "NRL_MEGATRON_CHECKPOINT_DIR) to a directory on a filesystem every node mounts (e.g. "
        "HF_HOME=/lustre/$USER/hf): NeMo-RL converts the model to Megatron format once, in "
        "$NRL_MEGATRON_CHECKPOINT_DIR, else $HF_HOME/nemo_rl, else "
        "~/.cache/huggingface/nemo_rl, and every node reads it\n"
    )
    one_node = _run(SLURM, "--dry-run", SMOKE, env=env)  # one node: nothing to share
    assert one_node.returncode == 0, one_node.stderr


@pytest.mark.parametrize("var", ["HF_HOME", "NRL_MEGATRON_CHECKPOINT_DIR"])
def test_a_node_local_directory_is_refused_naming_its_variable(nemo_rl_dir, tmp_path, var):
    local = tmp_path / "local" / "hf"
    local.mkdir(parents=True)
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, **{var: str(local)}))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        f"slurm_grpo_ais.sh: error: {var}={local} is on a node-local filesystem (ext2/ext3 at "
        f"{local} on this node): with cluster.num_nodes=2 it must be on a filesystem every "
        "node mounts (NFS, Lustre, GPFS, ...)\n"
    )
    not_yet = tmp_path / "local" / "new" / "hf"  # does not exist: its nearest parent's filesystem
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, **{var: str(not_yet)}))
    assert f"{var}={not_yet} is on a node-local filesystem (ext2/ext3 at {tmp_path / 'local'}" in (res.stderr)
    relative = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, **{var: "hf"}))
    assert relative.returncode == 2
    assert f"error: {var}=hf is not an absolute path: with cluster.num_nodes=2" in relative.stderr


def test_a_shared_checkpoint_dir_is_mounted_and_exported_to_the_job(nemo_rl_dir):
    ckpt = str(nemo_rl_dir.parent / "lustre" / "mcore")
    env = _slurm_env(nemo_rl_dir, NRL_MEGATRON_CHECKPOINT_DIR=ckpt)
    del env["HF_HOME"]
    res = _run(SLURM, "--dry-run", QWEN8B, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].startswith(f"export COMMAND='export NRL_MEGATRON_CHECKPOINT_DIR={ckpt} && ")
    assert lines[3].endswith(f",{ckpt}:{ckpt}")


# ------------------------------------------- save before the time limit, then resubmit
# NeMo-RL's grpo_train saves a checkpoint and stops once checkpoint_must_save_by
# (DD:HH:MM:SS since the training loop started) is near; the launcher sets it from TIME.

SAVE_BY = "checkpointing.checkpoint_must_save_by"


def _save_by_override(res: subprocess.CompletedProcess) -> str | None:
    """The deadline override at the end of the job's COMMAND, if any."""
    assert res.returncode == 0, res.stderr
    command = shlex.split(res.stdout.splitlines()[1].removeprefix("export COMMAND="))[0]
    last = shlex.split(command)[-1]
    return last.removeprefix(SAVE_BY + "=") if last.startswith(SAVE_BY + "=") else None


@pytest.mark.parametrize(
    ("time", "margin", "save_by"),
    [
        (None, None, "00:03:40:00"),  # TIME 04:00:00, SAVE_MARGIN 20 (minutes)
        ("4:00:00", "5", "00:03:55:00"),
        ("90", None, "00:01:10:00"),  # minutes
        ("30:00", None, "00:00:10:00"),  # minutes:seconds
        ("1-00:00:00", None, "00:23:40:00"),  # days-hours:minutes:seconds
        ("2-12", None, "02:11:40:00"),  # days-hours
        ("1-2:30", "1:00:00", "01:01:30:00"),  # 26 h 30 min - a one-hour margin
    ],
)
def test_checkpoint_must_save_by_comes_from_the_time_limit(nemo_rl_dir, time, margin, save_by):
    extra = {k: v for k, v in (("TIME", time), ("SAVE_MARGIN", margin)) if v is not None}
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, **extra))
    assert _save_by_override(res) == save_by
    assert f"--time={time or '04:00:00'} " in res.stdout.splitlines()[-1]


def test_the_override_reaches_nemo_rls_timeout_checker_as_the_deadline(nemo_rl_dir):
    """NeMo-RL's own loader and TimeoutChecker read the override: 3 h 40 min = 13200 s."""
    from nemo_rl.utils.timer import TimeoutChecker

    from nemo_ais.preflight import load_config  # NeMo-RL's loader (importable in tests)

    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir))
    cfg = load_config(QWEN8B, [f"{SAVE_BY}={_save_by_override(res)}"])
    deadline = cfg["checkpointing"]["checkpoint_must_save_by"]
    assert deadline == "00:03:40:00"  # a string, as upstream's TimeoutChecker wants
    assert TimeoutChecker(deadline, fit_last_save_time=True).last_save_time == 13200


def test_a_deadline_the_config_sets_is_kept_and_checked(nemo_rl_dir):
    env = _slurm_env(nemo_rl_dir)
    kept = _run(SLURM, "--dry-run", QWEN8B, f"{SAVE_BY}=00:03:00:00", env=env)
    assert _save_by_override(kept) == "00:03:00:00"  # the user's, once (not ours after it)
    assert kept.stdout.count(SAVE_BY) == 1
    late = _run(SLURM, "--dry-run", QWEN8B, f"{SAVE_BY}=00:04:30:00", env=env)
    assert late.returncode == 2 and late.stdout == ""
    assert late.stderr == (
        f"slurm_grpo_ais.sh: error: {SAVE_BY}=00:04:30:00 is after the job's time limit "
        "TIME=04:00:00: the job is killed before it saves (expected at most 00:04:00:00, e.g. "
        f"{SAVE_BY}=00:03:40:00, SAVE_MARGIN=20 before it)\n"
    )


def test_no_deadline_without_checkpoints_or_a_limit(nemo_rl_dir):
    env = _slurm_env(nemo_rl_dir)
    off = _run(SLURM, "--dry-run", QWEN8B, "checkpointing.enabled=false", env=env)
    assert _save_by_override(off) is None
    unlimited = _run(SLURM, "--dry-run", QWEN8B, env={**env, "TIME": "UNLIMITED"})
    assert _save_by_override(unlimited) is None


def test_bad_time_or_margin_is_refused_naming_the_variable(nemo_rl_dir):
    env = _slurm_env(nemo_rl_dir)
    short = _run(SLURM, "--dry-run", QWEN8B, env={**env, "TIME": "15"})
    assert short.returncode == 2
    assert short.stderr == (
        "slurm_grpo_ais.sh: error: TIME=15 leaves no time to train before SAVE_MARGIN=20 "
        "(the save and the job's start-up): raise TIME or lower SAVE_MARGIN\n"
    )
    bad = _run(SLURM, "--dry-run", QWEN8B, env={**env, "TIME": "4h"})
    assert bad.returncode == 2
    assert "TIME=4h is not a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)" in bad.stderr
    bad = _run(SLURM, "--dry-run", QWEN8B, env={**env, "SAVE_MARGIN": "x"})
    assert "SAVE_MARGIN=x is not a Slurm time limit" in bad.stderr


def test_skip_check_sets_no_deadline(nemo_rl_dir):
    # without the check the launcher cannot read checkpointing.enabled, and a deadline
    # without checkpoints makes NeMo-RL stop early without saving
    env = _slurm_env(nemo_rl_dir, NUM_NODES="2", GPUS_PER_NODE="8")
    res = _run(SLURM, "--dry-run", "--skip-check", QWEN8B, env=env)
    assert _save_by_override(res) is None
    mine = _run(SLURM, "--dry-run", "--skip-check", QWEN8B, f"{SAVE_BY}=00:02:00:00", env=env)
    assert _save_by_override(mine) == "00:02:00:00" and mine.stdout.count(SAVE_BY) == 1


# ------------------------------------------- the run's own directories, and what SBATCH_ARGS may not set


def _fake_sbatch(env: dict[str, str], tmp_path: Path) -> Path:
    """Put a recording ``sbatch`` first on ``env``'s PATH; the file it writes."""
    record, bindir = tmp_path / "record.txt", tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "sbatch").write_text(_RECORDER.format(out=record))
    (bindir / "sbatch").chmod(0o755)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    return record


def test_an_absolute_checkpoint_or_log_dir_is_created_mounted_and_must_be_shared(nemo_rl_dir, tmp_path):
    shared = tmp_path / "lustre" / "runs" / "my_run"
    overrides = [f"checkpointing.checkpoint_dir={shared}/ckpt", f"logger.log_dir={shared}/logs"]
    res = _run(SLURM, "--dry-run", QWEN8B, *overrides, env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    mounts = next(line for line in res.stdout.splitlines() if line.startswith("export MOUNTS="))
    assert f",{shared}/ckpt:{shared}/ckpt,{shared}/logs:{shared}/logs," in mounts
    # pyxis bind-mounts each source, which must exist: a fresh run's directories are created first
    assert res.stdout.splitlines()[-2] == f"mkdir -p -- {shared}/ckpt {shared}/logs"
    env = _slurm_env(nemo_rl_dir)
    record = _fake_sbatch(env, tmp_path)
    real = _run(SLURM, QWEN8B, *overrides, env=env)
    assert real.returncode == 0 and record.is_file(), real.stderr
    assert (shared / "ckpt").is_dir() and (shared / "logs").is_dir()
    local = tmp_path / "local" / "ckpt"  # every node would write its shards into its own copy
    res = _run(SLURM, "--dry-run", QWEN8B, f"checkpointing.checkpoint_dir={local}", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        f"slurm_grpo_ais.sh: error: checkpointing.checkpoint_dir={local} is on a node-local filesystem (ext2/ext3 "
        f"at {tmp_path} on this node): with cluster.num_nodes=2 it must be on a filesystem every node mounts "
        "(NFS, Lustre, GPFS, ...)\n"
    )
    relative = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir))  # the shipped relative paths
    assert relative.returncode == 0, relative.stderr
    assert "mkdir" not in relative.stdout  # NeMo-RL creates them in the job, under NEMO_RL_DIR


@pytest.mark.parametrize("name", ["my run", "a,b", "a:b"])
def test_a_path_ray_sub_or_pyxis_would_split_is_refused_naming_it(nemo_rl_dir, tmp_path, name):
    # ray.sub pastes MOUNTS unquoted into srun's arguments; pyxis splits it at ',' (mounts) and ':' (src:dst)
    shared = tmp_path / "lustre" / name
    res = _run(SLURM, "--dry-run", QWEN8B, f"logger.log_dir='{shared}'", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        f"slurm_grpo_ais.sh: error: logger.log_dir={shared} cannot be mounted into the job's containers: ray.sub "
        "splits MOUNTS at whitespace and pyxis at ',' and ':' (expected a path without them)\n"
    )
    hf = tmp_path / "lustre" / f"hf {name}"
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, HF_HOME=str(hf)))
    assert res.returncode == 2 and res.stderr.startswith(f"slurm_grpo_ais.sh: error: HF_HOME={hf} cannot be mounted")


@pytest.mark.parametrize("arg", ["--time=02:00:00", "-t", "-t02:00:00", "--job-name=other", "-J", "--nodes=4", "-N2"])
def test_sbatch_args_may_not_undo_the_deadline_the_chain_or_the_size(nemo_rl_dir, arg):
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, SBATCH_ARGS=f"--exclusive {arg}"))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"slurm_grpo_ais.sh: error: SBATCH_ARGS: {arg} is set by this script (use TIME=")


def test_a_node_local_nemo_rl_dir_is_warned_about_when_the_run_writes_into_it(nemo_rl_dir, tmp_path):
    local = tmp_path / "local" / "NeMo-RL"  # e.g. one clone per node on its scratch disk
    local.mkdir(parents=True)
    (local / "ray.sub").write_text("#!/bin/bash\n")
    env = _slurm_env(nemo_rl_dir, NEMO_RL_DIR=str(local))
    res = _run(SLURM, "--dry-run", QWEN8B, env=env)  # the shipped configs: relative checkpoint and log dirs
    assert res.returncode == 0 and res.stdout.startswith(f"cd {local}\n")
    assert res.stderr == (
        f"slurm_grpo_ais.sh: warning: NEMO_RL_DIR={local} is on a node-local filesystem (ext2/ext3 at {local} on "
        "this node): with cluster.num_nodes=2 it must be on a filesystem every node mounts (NFS, Lustre, GPFS, ...): "
        "the config's checkpointing.checkpoint_dir logger.log_dir resolve under it, the job's working directory "
        "(each node would keep its own part of every checkpoint; each node would keep its own logs)\n"
    )
    shared = tmp_path / "lustre" / "runs"
    elsewhere = [f"checkpointing.checkpoint_dir={shared}/ckpt", f"logger.log_dir={shared}/logs"]
    assert _run(SLURM, "--dry-run", QWEN8B, *elsewhere, env=env).stderr == ""  # nothing of the run in it
    assert _run(SLURM, "--dry-run", SMOKE, env=env).stderr == ""  # one node


# ------------------------------------------- the files the job reads, and what the offline check says


W4A4 = CFG / "experiments" / "qwen3_8b_nvfp4_w4a4_ais.yaml"
AMAX_KEY = "ais_nvfp4_refit.input_amax_file"


def test_the_directory_of_an_absolute_input_amax_file_is_mounted_and_one_on_each_node_warned_about(nemo_rl_dir):
    # every vLLM worker reads it when the refit hook arms: a path the container lacks fails on every node
    root = nemo_rl_dir.parent
    shared = root / "lustre" / "calibration"
    shared.mkdir()
    (shared / "amax.json").write_text("{}")
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}={shared}/amax.json", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    mounts = next(line for line in res.stdout.splitlines() if line.startswith("export MOUNTS="))
    assert mounts.removeprefix("export MOUNTS=").split(",")[2] == f"{shared}:{shared}"
    assert "mkdir" not in res.stdout  # a file the job reads is not created
    spaced = root / "lustre" / "my calibration"
    spaced.mkdir()
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}='{spaced}/amax.json'", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2
    assert f"error: the directory of {AMAX_KEY}={spaced} cannot be mounted into the job's containers" in res.stderr
    local = root / "local"
    local.mkdir()
    (local / "amax.json").write_text("{}")
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}={local}/amax.json", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and f",{local}:{local}," in res.stdout  # a copy on each node's disk may be meant
    assert (
        f"slurm_grpo_ais.sh: warning: {AMAX_KEY}={local}/amax.json is on a node-local filesystem (ext2/ext3 at "
        f"{local}/amax.json on this node): with cluster.num_nodes=2 every node reads it: each node needs its own "
        "copy at this path, or put it on a filesystem every node mounts\n"
    ) in res.stderr
    missing = root / "lustre" / "nowhere" / "amax.json"  # on the compute nodes only, or in the image
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}={missing}", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and "nowhere" not in next(line for line in res.stdout.splitlines() if "MOUNTS=" in line)
    assert (
        f"slurm_grpo_ais.sh: warning: {AMAX_KEY}={missing} is not on this node: not mounted (the job finds it only "
        "if the container image holds it; else add it to EXTRA_MOUNTS)\n"
    ) in res.stderr


def _mounts(res: subprocess.CompletedProcess) -> list[str]:
    line = next(line for line in res.stdout.splitlines() if line.startswith("export MOUNTS="))
    return line.removeprefix("export MOUNTS=").split(",")


def test_what_the_job_reads_is_mounted_when_this_node_has_it(nemo_rl_dir):
    # compute nodes often have no internet: the model, a checkpoint to start from and the data are directories
    # and files on the cluster's filesystem, which the container did not see (ray.sub mounts only MOUNTS)
    lustre = nemo_rl_dir.parent / "lustre"
    model, tokenizer, start, data = (lustre / d for d in ("models/Qwen3-0.6B", "tok", "ckpt/iter_0000100", "data"))
    for d in (model, tokenizer, start, data):
        d.mkdir(parents=True)
    reads = [
        f"policy.model_name={model}",
        f"+policy.pretrained_checkpoint.path={start}",
        "data.train.dataset_name=ResponseDataset",
        f"+data.train.data_path={data}/train.jsonl",  # a file: its directory (it may be written later)
    ]
    res = _run(SLURM, "--dry-run", SMOKE, *reads, env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and res.stderr == "", res.stderr
    hf = _hf(nemo_rl_dir)
    assert _mounts(res)[2:] == [f"{p}:{p}" for p in (model, start, data, hf)]  # the tokenizer's ${...}: once
    res = _run(SLURM, "--dry-run", SMOKE, *reads[:1], f"policy.tokenizer.name={tokenizer}", env=_slurm_env(nemo_rl_dir))
    assert _mounts(res)[2:4] == [f"{model}:{model}", f"{tokenizer}:{tokenizer}"]
    hub = _run(SLURM, "--dry-run", SMOKE, env=_slurm_env(nemo_rl_dir))  # Qwen/Qwen3-0.6B: a Hub id, no path
    assert _mounts(hub)[2:] == [f"{hf}:{hf}"]


def test_a_read_path_this_node_lacks_is_named_and_its_parent_not_mounted(nemo_rl_dir):
    # it may be in the container image (mounting its parent would hide the image's); or on the compute nodes only
    (nemo_rl_dir.parent / "raid" / "models").mkdir(parents=True)  # node-local: no shared-filesystem warning too
    missing = nemo_rl_dir.parent / "raid" / "models" / "Qwen3-8B"
    res = _run(SLURM, "--dry-run", QWEN8B, f"policy.model_name={missing}", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and _mounts(res)[2:] == [f"{_hf(nemo_rl_dir)}:{_hf(nemo_rl_dir)}"]
    assert res.stderr == (  # once, for the model and the tokenizer that names it, with two nodes too
        f"slurm_grpo_ais.sh: warning: policy.model_name={missing} is not on this node: not mounted (the job finds "
        "it only if the container image holds it; else add it to EXTRA_MOUNTS)\n"
    )


def test_a_node_local_model_is_mounted_with_a_warning_on_several_nodes(nemo_rl_dir, tmp_path):
    model = tmp_path / "raid" / "Qwen3-8B"  # a copy on each node's local disk: a common layout
    model.mkdir(parents=True)
    res = _run(SLURM, "--dry-run", QWEN8B, f"policy.model_name={model}", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and f"{model}:{model}" in _mounts(res)
    assert res.stderr == (
        f"slurm_grpo_ais.sh: warning: policy.model_name={model} is on a node-local filesystem (ext2/ext3 at {model} "
        "on this node): with cluster.num_nodes=2 every node reads it: each node needs its own copy at this path, or "
        "put it on a filesystem every node mounts\n"
    )


def test_a_hugging_face_cache_snapshot_is_mounted_with_the_blobs_it_links_to(nemo_rl_dir):
    entry = nemo_rl_dir.parent / "lustre" / "other_hf" / "hub" / "models--Qwen--Qwen3-0.6B"
    (entry / "snapshots" / "abc123").mkdir(parents=True)
    (entry / "blobs").mkdir()
    res = _run(SLURM, "--dry-run", SMOKE, f"policy.model_name={entry}/snapshots/abc123", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0 and _mounts(res)[2] == f"{entry}:{entry}"


def test_a_relative_input_amax_file_in_a_node_local_checkout_is_warned_about(nemo_rl_dir, tmp_path):
    local = tmp_path / "local" / "NeMo-RL"
    local.mkdir(parents=True)
    (local / "ray.sub").write_text("#!/bin/bash\n")
    res = _run(SLURM, "--dry-run", W4A4, env=_slurm_env(nemo_rl_dir, NEMO_RL_DIR=str(local)))
    assert res.returncode == 0, res.stderr
    assert (
        f"the config's checkpointing.checkpoint_dir logger.log_dir {AMAX_KEY} resolve under it, the job's working "
        "directory (each node would keep its own part of every checkpoint; each node would keep its own logs; each "
        "node reads a file only where it has its own copy)\n"
    ) in res.stderr
    shared = tmp_path / "lustre" / "runs"
    elsewhere = [f"checkpointing.checkpoint_dir={shared}/ckpt", f"logger.log_dir={shared}/logs"]
    res = _run(SLURM, "--dry-run", W4A4, *elsewhere, env=_slurm_env(nemo_rl_dir, NEMO_RL_DIR=str(local)))
    assert res.returncode == 0, res.stderr
    assert (
        f"the config's {AMAX_KEY} resolves under it, the job's working directory (each node reads a file only where "
        "it has its own copy)\n"
    ) in res.stderr


def test_an_input_amax_file_outside_the_checkout_is_mounted_once_and_one_in_it_not_again(nemo_rl_dir):
    root = nemo_rl_dir.parent
    (root / "lustre" / "calibration").mkdir()
    (root / "lustre" / "calibration" / "amax.json").write_text("{}")
    cases = {  # the override -> the mount it adds
        "../lustre/calibration/amax.json": f"{root}/lustre/calibration",  # resolves outside the checkout
        f"{nemo_rl_dir}/amax.json": None,  # in the checkout's top directory, which is mounted
        "calibration/amax.json": None,  # under it
    }
    for path, mounted in cases.items():
        res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}={path}", env=_slurm_env(nemo_rl_dir))
        assert res.returncode == 0, res.stderr
        mounts = next(line for line in res.stdout.splitlines() if line.startswith("export MOUNTS="))
        extra = mounts.removeprefix("export MOUNTS=").split(",")[2:]
        hf = _hf(nemo_rl_dir)
        assert extra == ([f"{mounted}:{mounted}"] if mounted else []) + [f"{hf}:{hf}"], path
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}=/amax.json", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2
    assert f"error: {AMAX_KEY}=/amax.json is in /: mounting / would hide the container's own" in res.stderr


def test_the_offline_checks_warnings_are_said_once_by_either_launcher(nemo_rl_dir):
    # they were never shown: the launchers ran the check only to --get values
    res = _run(SLURM, "--dry-run", W4A4, env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    head = f"{W4A4}:\n"
    assert res.stderr.startswith(head) and res.stderr.count(head) == 1
    said = [line.split("]")[1].split(":")[0] for line in res.stderr.splitlines()[1:] if line.startswith("  [WARN]")]
    assert sorted(said) == [" nvfp4_rollout", " rollout_format", " rollout_gpu"]  # each once
    assert f"{AMAX_KEY}='calibration/qwen3_8b_nvfp4_input_amax.json' is not a file under NEMO_RL_DIR=" in res.stderr
    one_node = ["cluster.num_nodes=1", "policy.generation.vllm_cfg.tensor_parallel_size=1"]
    res = _run(LOCAL, "--dry-run", W4A4, *one_node, env=_env(NEMO_RL_DIR=str(nemo_rl_dir)))
    assert res.returncode == 0 and res.stderr.count(head) == 1 and "[WARN] rollout_gpu:" in res.stderr


def test_a_value_that_would_shift_the_launchers_fields_is_refused(nemo_rl_dir):
    # the launcher reads the four --get values as words: one holding a space would shift the others
    res = _run(SLURM, "--dry-run", QWEN8B, f"{SAVE_BY}='00:01:00:00 x'", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.endswith(
        "error: the offline check printed '2 8 true 00:01:00:00 x' for cluster.num_nodes, cluster.gpus_per_node, "
        "checkpointing.enabled and checkpointing.checkpoint_must_save_by (expected four words)\n"
    )


def test_every_path_is_folded_before_it_is_mounted_or_created(nemo_rl_dir):
    # a ".." inside an absolute path hid it from the checkout comparison, and /./x slipped past the "/" refusal
    root = nemo_rl_dir.parent
    via_checkout = f"{nemo_rl_dir}/../lustre/ckpt"
    res = _run(SLURM, "--dry-run", QWEN8B, f"checkpointing.checkpoint_dir={via_checkout}", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 0, res.stderr
    assert f",{root}/lustre/ckpt:{root}/lustre/ckpt," in res.stdout
    assert f"mkdir -p -- {root}/lustre/ckpt\n" in res.stdout
    res = _run(SLURM, "--dry-run", W4A4, f"{AMAX_KEY}=/./amax.json", env=_slurm_env(nemo_rl_dir))
    assert res.returncode == 2 and f"error: {AMAX_KEY}=/amax.json is in /" in res.stderr


def test_a_missing_conversion_directory_is_created_and_one_that_cannot_be_is_named(nemo_rl_dir, tmp_path):
    new = nemo_rl_dir.parent / "lustre" / "mcore_new"
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, NRL_MEGATRON_CHECKPOINT_DIR=str(new)))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-2] == f"mkdir -p -- {new}"
    one_node = [SMOKE]  # one node: no shared-filesystem check says that /scratchX is not here
    res = _run(
        SLURM, "--dry-run", *one_node, "checkpointing.checkpoint_dir=/scratchX/me/ckpt", env=_slurm_env(nemo_rl_dir)
    )
    assert res.returncode == 0 and "mkdir" not in res.stdout
    assert res.stderr == (
        "slurm_grpo_ais.sh: warning: checkpointing.checkpoint_dir=/scratchX/me/ckpt is not created here (/scratchX "
        "does not exist on this node): it must exist on the compute nodes before the job starts (a container mount "
        "needs its source)\n"
    )


def test_extra_mounts_with_whitespace_and_a_relative_nemo_rl_dir(nemo_rl_dir):
    res = _run(SLURM, "--dry-run", QWEN8B, env=_slurm_env(nemo_rl_dir, EXTRA_MOUNTS="/data/my set:/data/my set"))
    assert res.returncode == 2
    assert res.stderr.startswith("slurm_grpo_ais.sh: error: EXTRA_MOUNTS=/data/my set:/data/my set holds whitespace")
    # a relative NEMO_RL_DIR (from where the launcher runs) is made absolute: sbatch runs from inside it
    env = _slurm_env(nemo_rl_dir, NEMO_RL_DIR=nemo_rl_dir.name)
    res = subprocess.run(
        ["bash", str(SLURM), "--dry-run", str(SMOKE)], env=env, cwd=nemo_rl_dir.parent, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"cd {nemo_rl_dir}\n") and f"{nemo_rl_dir}/ray.sub\n" in res.stdout
    assert f"export MOUNTS={nemo_rl_dir}:{nemo_rl_dir}," in res.stdout


def test_a_directory_the_job_writes_that_this_node_cannot_create_is_named_on_several_nodes(nemo_rl_dir):
    res = _run(
        SLURM, "--dry-run", QWEN8B, "checkpointing.checkpoint_dir=/scratchX/me/ckpt", env=_slurm_env(nemo_rl_dir)
    )
    assert res.returncode == 0 and "mkdir" not in res.stdout
    assert (
        "slurm_grpo_ais.sh: warning: checkpointing.checkpoint_dir=/scratchX/me/ckpt is not created here (/scratchX "
        "does not exist on this node): it must exist on the compute nodes before the job starts"
    ) in res.stderr


def test_a_file_read_straight_from_a_directory_the_image_has_is_warned_about(nemo_rl_dir):
    res = _run(
        SLURM,
        "--dry-run",
        QWEN8B,
        "data.train.dataset_name=ResponseDataset",
        "+data.train.data_path=/tmp/t.jsonl",
        env=_slurm_env(nemo_rl_dir),
    )
    assert res.returncode == 0 and "/tmp:/tmp" in res.stdout
    assert (
        "slurm_grpo_ais.sh: warning: the directory of data.train.data_path=/tmp: mounting it hides the container "
        "image's own /tmp (put what the job reads in a directory of its own)\n"
    ) in res.stderr
