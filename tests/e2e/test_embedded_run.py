# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""End-to-end tests of `nemo-ais run`: outputs, resume, DP equivalence, failure modes.

Every run here is a few GRPO steps of the tiny policy; they go through the real CLI entry
point (``nemo_ais.cli.main``), the real FP8 twin and the real core loss.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import nemo_ais.embedded.recipe as recipe_mod
from nemo_ais.cli import main
from nemo_ais.embedded.checkpoint import checkpoint_path, load_checkpoint
from nemo_ais.embedded.config import CONFIG_DIR, load_config

pytestmark = pytest.mark.timeout(300)

# One tiny config for the resume / DP / failure tests: one arm, 4 prompts x 4 samples in
# two chunks (so two DP ranks own one chunk each), 4 steps, checkpoints every 2.
TINY = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "rollout.prompts_per_chunk=2",
    "grpo.max_num_steps=4",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "data.eval_size=32",
    "policy.train_micro_batch_size=8",
    "experiment.include=[fp8-ais]",
    "experiment.seeds=[0]",
    # a larger lr so the policy visibly moves within 4 steps (resume must replay it)
    "policy.optimizer.lr=1e-3",
    "logger.progress_bar=false",
    "logger.plots=false",
]


def _run(tmp_path, cache_dir, name, *extra):
    argv = [
        "run",
        "--quick",
        f"logger.run_dir={tmp_path}",
        f"logger.name={name}",
        f"policy.warm_start.cache_dir={cache_dir}",
        *extra,
    ]
    return main(argv)


def _records(run_dir, kind=None):
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in out if kind is None or r["kind"] == kind]


def _strip_times(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


# The uninterrupted TINY runs, one per process count, shared by the tests that compare
# against them (cache_dir: tests/e2e/conftest.py, one warm start per config and session).
@pytest.fixture(scope="module")
def tiny_dp1(tmp_path_factory, cache_dir):
    """The run directory of TINY on one process (the quick preset's ``cluster.dp_size=1``)."""
    root = tmp_path_factory.mktemp("tiny_dp1")
    assert _run(root, cache_dir, "dp1", *TINY, "cluster.dp_size=1") == 0
    return root / "dp1"


@pytest.fixture(scope="module")
def tiny_dp2(tmp_path_factory, cache_dir):
    """The run directory of TINY on two data-parallel processes."""
    root = tmp_path_factory.mktemp("tiny_dp2")
    assert _run(root, cache_dir, "dp2", *TINY, "cluster.dp_size=2") == 0
    return root / "dp2"


def test_quick_preset_outputs_are_sensible(tmp_path, cache_dir, capsys):
    assert _run(tmp_path, cache_dir, "quick", "logger.progress_bar=false") == 0
    run_dir = tmp_path / "quick"
    for name in ("metrics.jsonl", "summary.md", "reward.png", "accuracy.png", "diagnostics.png"):
        assert (run_dir / name).stat().st_size > 0, name
    train = _records(run_dir, "train")
    arms = ["bf16", "fp8-none", "fp8-tis", "fp8-ais"]
    assert sorted({r["arm"] for r in train}) == sorted(arms)
    assert len(train) == 4 * 4  # 4 arms x 4 steps (quick: 1 seed)
    for r in train:
        for k, v in r.items():
            if isinstance(v, float):
                assert math.isfinite(v), (r["arm"], r["step"], k)
        assert 0.0 <= r["reward"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0
        assert 0.0 <= r["alpha"] <= 1.0 and 0.0 <= r["ais/alpha"] <= 1.0
        assert 0.0 < r["ais/ess_seq"] <= 1.0
        assert r["ais/n_tok"] > 0 and r["ais/empty_batch"] == 0.0
        if r["arm"] == "bf16":
            # the BF16 twin is the trainer's model; what remains is fp32 rounding between
            # the KV-cached decode and the full-sequence forward (~1e-7), no FP8 error
            assert r["ais/severity"] < 1e-5
        else:
            assert r["ais/severity"] > 1e-3  # W8A8 FP8 moves log-probs by ~5e-3 here
    applied = {r["arm"]: r["alpha"] for r in train}
    assert applied["bf16"] == 0.0 and applied["fp8-none"] == 0.0 and applied["fp8-tis"] == 1.0
    assert 0.0 < applied["fp8-ais"] < 1.0
    _assert_arms_train_differently(run_dir, train)
    val = _records(run_dir, "val")
    assert {(r["arm"], r["step"]) for r in val} == {(a, s) for a in arms for s in (0, 2, 4)}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in val)
    summary = (run_dir / "summary.md").read_text()
    assert all(f"| {a} |" in summary for a in arms)
    # the report subcommand redraws everything from metrics.jsonl alone
    (run_dir / "summary.md").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "summary.md").read_text() == summary
    # a finished run re-launched is a no-op (every (arm, seed) is complete)
    before = (run_dir / "metrics.jsonl").read_text()
    assert _run(tmp_path, cache_dir, "quick", "logger.progress_bar=false") == 0
    assert (run_dir / "metrics.jsonl").read_text() == before


def _assert_arms_train_differently(run_dir, train):
    """The smoke run exercises the corrections: nonzero reward, so the FP8 arms diverge.

    With a reward of 0 everywhere every advantage is 0, the loss and its gradient vanish
    and fp8-none, fp8-tis and fp8-ais train bit-identically (they share rollouts and
    differ only in the weights applied to the advantages).
    """
    assert any(r["reward"] > 0.0 for r in train), "the reward is 0 on every step and arm"
    fp8_arms = ("fp8-none", "fp8-tis", "fp8-ais")
    losses = {a: [r["loss"] for r in train if r["arm"] == a] for a in fp8_arms}
    policies = {a: load_checkpoint(checkpoint_path(run_dir, a, 0))["policy"] for a in fp8_arms}
    for i, a in enumerate(fp8_arms):
        for b in fp8_arms[i + 1 :]:
            assert losses[a] != losses[b], f"{a} and {b} logged the same losses {losses[a]}"
            same = all(torch.equal(policies[a][k], policies[b][k]) for k in policies[a])
            assert not same, f"{a} and {b} end with bit-identical parameters"


def test_fp4_quick_preset_shows_the_4bit_mismatch(tmp_path, cache_dir):
    """--preset fp4-quick: quick.yaml with NVFP4 rollouts; W4A4 + NVFP4 KV mismatch > FP8's.

    The QaRL arm (aligned trainer + TBPO) sees no mismatch: its trainer log-probs are the
    rollout's up to fp32 accumulation order.
    """
    argv = ["run", "--preset", "fp4-quick", f"logger.run_dir={tmp_path}"]
    argv += [f"policy.warm_start.cache_dir={cache_dir}", "logger.progress_bar=false"]
    t0 = time.perf_counter()
    assert main(argv) == 0
    seconds = time.perf_counter() - t0
    run_dir = tmp_path / "fp4-quick"
    train = _records(run_dir, "train")
    w4a4 = ("nvfp4_w4a4-none", "nvfp4_w4a4-tis", "nvfp4_w4a4-ais")
    arms = ("bf16", "fp8-none", "nvfp4_w4a16-none", *w4a4, "nvfp4_w4a4-qarl")
    assert [r["arm"] for r in train] == [a for a in arms for _ in range(4)]  # 4 steps each
    for r in train:
        bad = [k for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
        assert not bad, (r["arm"], r["step"], bad)
        # error tokens, logged for every arm: repeat, invalid <= either <= 1
        rates = [r[f"error_tokens/{k}_frac"] for k in ("repeat", "invalid", "error")]
        assert min(rates) >= 0.0 and max(rates[:2]) <= rates[2] <= 1.0, (r["arm"], rates)
    qarl = [r for r in train if r["arm"] == "nvfp4_w4a4-qarl"]
    assert all(r["ais/severity"] < 1e-6 and r["alpha"] == 1.0 for r in qarl), qarl
    # step 1: every arm rolls out from the same warm-started policy, so the engines compare
    first = {r["arm"]: r for r in train if r["step"] == 1}
    assert first["bf16"]["ais/severity"] < 1e-5
    # W4A4 + NVFP4 KV is about 3x FP8's mismatch here (severity 0.032 vs 0.011), W4A16 1.5x
    for key, floor in (("ais/severity", 0.0), ("ais/token_mult_prob_error", 1.0)):
        fp8 = first["fp8-none"][key] - floor
        assert first["nvfp4_w4a16-none"][key] - floor > 1.2 * fp8, key
        assert all(first[a][key] - floor > 2 * fp8 for a in w4a4), (key, first)
    assert all(first[a]["ais/kl_k3"] > 2 * first["fp8-none"]["ais/kl_k3"] for a in w4a4)
    applied = {r["arm"]: r["alpha"] for r in train}
    assert applied["nvfp4_w4a4-none"] == 0.0 and applied["nvfp4_w4a4-tis"] == 1.0
    assert 0.0 < applied["nvfp4_w4a4-ais"] < 1.0
    losses = {a: [r["loss"] for r in train if r["arm"] == a] for a in w4a4}
    assert len({tuple(v) for v in losses.values()}) == 3, losses  # the corrections differ
    # at theta = theta_old TBPO's loss value is the uncorrected one; the update is not
    none, aligned = (
        load_checkpoint(checkpoint_path(run_dir, a, 0))["policy"] for a in ("nvfp4_w4a4-none", "nvfp4_w4a4-qarl")
    )
    assert not all(torch.equal(none[k], aligned[k]) for k in none)
    summary = (run_dir / "summary.md").read_text()
    assert all(f"| {a} |" in summary for a in arms)
    # a 4-step, 1-seed run says it is a smoke run and leaves out what it is too short for
    opening = summary.split("\n\n")[1]
    assert opening.startswith("**Smoke run, not evidence:** 4 GRPO steps (evidence: >= 20); 1 seed")
    assert "collapse step (seed mean)" not in summary and "Collapse step: left out" in summary
    assert "first 10 steps →" not in summary and "nan" not in summary.lower()
    assert "FP8 twin" not in summary and "reward (all 4 steps)" in summary
    assert seconds < 180, f"fp4-quick took {seconds:.0f} s (budget 90 s on 2 idle cores)"


def test_interrupt_then_resume_equals_uninterrupted(tmp_path, cache_dir, tiny_dp1, monkeypatch, capsys):
    straight = _records(tiny_dp1)

    original_log = recipe_mod.GRPORecipe._log

    def log_then_interrupt(self, step, *args, **kwargs):
        original_log(self, step, *args, **kwargs)
        if step == 3:  # after the step-2 checkpoint and the step-3 record: mid-run
            raise KeyboardInterrupt

    monkeypatch.setattr(recipe_mod.GRPORecipe, "_log", log_then_interrupt)
    assert _run(tmp_path, cache_dir, "resumed", *TINY) == 130
    assert "re-run the same command to resume" in capsys.readouterr().err
    run_dir = tmp_path / "resumed"
    assert checkpoint_path(run_dir, "fp8-ais", 0).is_file()  # the checkpoint is kept
    assert max(r["step"] for r in _records(run_dir, "train")) == 3  # step 3 was logged

    monkeypatch.setattr(recipe_mod.GRPORecipe, "_log", original_log)
    assert _run(tmp_path, cache_dir, "resumed", *TINY) == 0
    resumed = _records(run_dir)
    # exact: every random stream is keyed by (seed, step, chunk) and the checkpoint holds
    # policy, AdamW state and the AIS EMA state; the re-done step 3 replaces the old record
    assert _strip_times(resumed) == _strip_times(straight)
    assert [r["step"] for r in _records(run_dir, "train")] == [1, 2, 3, 4]


@pytest.mark.distributed
def test_two_dp_processes_equal_one(tiny_dp1, tiny_dp2):
    one, two = _records(tiny_dp1), _records(tiny_dp2)
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    # Same samples by construction (per-chunk generators). What differs is fp32 summation
    # order: gradients (sum of two rank sums vs one sum) and per-rank float32 reward sums,
    # ~1e-7 relative per step; after 4 AdamW steps that stays below 1e-5.
    for a, b in zip(_strip_times(one), _strip_times(two), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float):
                assert math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6), (a["step"], k)
            else:
                assert a[k] == b[k], (a["step"], k)


def test_nan_in_training_stops_with_a_clear_message(tmp_path, cache_dir, monkeypatch, capsys):
    original = recipe_mod.GRPORecipe._logprobs
    calls = {"n": 0}

    def nan_at_step_2(self, sequences, *, grad):
        out = original(self, sequences, grad=grad)
        if not grad:  # (log-probs, entropy) of pi_old
            calls["n"] += 1
            if calls["n"] == 2:  # the trainer log-probs of step 2
                out = (out[0] * float("nan"), out[1])
        return out

    monkeypatch.setattr(recipe_mod.GRPORecipe, "_logprobs", nan_at_step_2)
    assert _run(tmp_path, cache_dir, "nan", *TINY) == 1
    err = capsys.readouterr().err
    assert "step 2 (arm fp8-ais, seed 0)" in err and "prev_logprobs" in err
    train = _records(tmp_path / "nan", "train")
    assert [r["step"] for r in train] == [1]  # metrics so far are flushed, step 2 is not


def test_nan_gradient_is_detected(tmp_path, cache_dir, monkeypatch, capsys):
    original = recipe_mod.clipped_pg_loss

    def nan_loss(*args, **kwargs):
        out = original(*args, **kwargs)
        return out._replace(loss=out.loss * float("nan"))

    monkeypatch.setattr(recipe_mod, "clipped_pg_loss", nan_loss)
    assert _run(tmp_path, cache_dir, "nangrad", *TINY) == 1
    err = capsys.readouterr().err
    assert "non-finite gradient norm" in err and "step 1 (arm fp8-ais, seed 0)" in err


def test_unwritable_run_dir_and_config_mismatch(tmp_path, cache_dir, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    assert main(["run", "--quick", f"logger.run_dir={blocker}"]) == 1
    assert "is not writable" in capsys.readouterr().err
    # a run directory holding another config is not silently mixed with a new one
    run_dir = tmp_path / "mix"
    run_dir.mkdir()
    overrides = [f"logger.run_dir={tmp_path}", "logger.name=mix", *TINY]
    old = load_config(CONFIG_DIR / "quick.yaml", [*overrides, "grpo.max_num_steps=99"])
    old["policy"]["warm_start"]["cache_dir"] = str(cache_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old))
    (run_dir / "metrics.jsonl").write_text("")  # the pinned config's results (none yet: an interrupted first step)
    assert _run(tmp_path, cache_dir, "mix", *TINY) == 1
    err = capsys.readouterr().err
    assert "different config" in err and "grpo.max_num_steps: 99 -> 4" in err


def _wait_for(proc, marker, timeout_s):
    """Poll until ``marker`` is a file; fail (never skip) if the run ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not marker.is_file():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before writing {marker}:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {marker} within {timeout_s} s:\n{proc.communicate()[0]}")
        time.sleep(0.05)


@pytest.mark.distributed
def test_ctrl_c_on_two_dp_processes_keeps_checkpoint_and_resumes_exactly(tmp_path, cache_dir, tiny_dp2):
    # A real SIGINT to the whole process group (what Ctrl-C does) while 2 ranks train. It is
    # sent as soon as the first checkpoint (step 1 of 4, save_period 1) appears: then 3
    # steps and 2 evaluations are left, seconds of work against a 50 ms poll, and a slower
    # machine stretches both alike. If the signal still lands too late, the test fails.
    # The reference is the uninterrupted TINY run on 2 ranks (tiny_dp2, save_period 2):
    # checkpoints are written and read outside every random stream, so where they fall
    # does not change a record.
    steps, save_period = 4, 1
    args = [
        f"logger.run_dir={tmp_path}",
        f"policy.warm_start.cache_dir={cache_dir}",
        *TINY,
        f"grpo.max_num_steps={steps}",
        f"checkpointing.save_period={save_period}",
        "cluster.dp_size=2",
    ]
    cmd = [sys.executable, "-m", "nemo_ais", "run", "--quick", "logger.name=ctrlc", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.setpgrp()),
    )
    ckpt = checkpoint_path(tmp_path / "ctrlc", "fp8-ais", 0)
    _wait_for(proc, ckpt, timeout_s=200)  # the pytest timeout (300 s) stays the backstop
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # never leave the ranks running
        pytest.fail(f"the run did not stop within 60 s of SIGINT:\n{proc.communicate()[0]}")
    assert proc.returncode == 130, f"SIGINT did not interrupt the run (exit {proc.returncode}):\n{out}"
    assert "re-run the same command to resume" in out
    # interrupted mid-run: an unfinished checkpoint, and metrics that stop before the end
    blob = load_checkpoint(ckpt)
    assert not blob["finished"] and save_period <= blob["step"] < steps, blob["step"]
    logged = [r["step"] for r in _records(tmp_path / "ctrlc", "train")]
    assert blob["step"] <= max(logged) < steps, logged
    assert _run(tmp_path, cache_dir, "ctrlc", *args) == 0
    assert _strip_times(_records(tmp_path / "ctrlc")) == _strip_times(_records(tiny_dp2))


@pytest.mark.distributed
def test_a_killed_launcher_takes_its_ranks_with_it(tmp_path, cache_dir):
    """SIGKILL to the launcher alone (``kill <pid>``, not its group): its two ranks end within seconds instead of
    training on beside a re-run, and the re-run finishes with one record per step."""
    steps = 60  # the killed ranks, left alone, would train on for ~10 s (6 s with TINY's 12 steps: too close)
    args = [f"logger.run_dir={tmp_path}", f"policy.warm_start.cache_dir={cache_dir}", *TINY, "cluster.dp_size=2"]
    args += [f"grpo.max_num_steps={steps}", "checkpointing.save_period=1"]
    cmd = [sys.executable, "-m", "nemo_ais", "run", "--quick", "logger.name=orphan", *args]
    log = (tmp_path / "orphan.log").open("w")  # not a pipe: its reader would wait for the ranks to close it
    # SIGINT ignored, as for a job started with `&` or nohup: torch's spawn asks the kernel for a SIGINT to each rank
    # when its parent dies, which such a rank ignores
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=ignore_sigint)
    _wait_for(proc, checkpoint_path(tmp_path / "orphan", "fp8-ais", 0), timeout_s=200)
    ranks = [pid for pid in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 2, ranks
    proc.kill()  # the launcher only: its ranks see their parent go
    proc.wait()
    log.close()
    deadline = time.monotonic() + 4  # each rank checks its parent every second
    while alive := [pid for pid in ranks if _running(pid)]:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the ranks {alive} of a killed launcher still run 4 s later")
        time.sleep(0.1)
    assert _run(tmp_path, cache_dir, "orphan", *args) == 0
    train = [(r["arm"], r["step"]) for r in _records(tmp_path / "orphan", "train")]
    assert sorted(train) == [("fp8-ais", step) for step in range(1, steps + 1)]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan is reaped by whoever adopts it, maybe not at once)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_bypass_skips_the_trainers_pi_old_forward(tmp_path, cache_dir, tiny_dp1):
    """loss_fn.ais.bypass: pi_old := mu, so the trainer's pi_old forward is not run.

    The step's logged batch (NeMo-RL's train_data layout) has prev_logprobs equal to the
    rollout's; the trainer's entropy (a by-product of that forward) is not computed (NaN);
    the training itself runs and differs from the same arm without bypass.
    """
    arm = "experiment.arms.fp8-ais.loss_fn.ais.bypass=true"
    assert _run(tmp_path, cache_dir, "bypass", *TINY, arm) == 0
    by, plain = _records(tmp_path / "bypass", "train"), _records(tiny_dp1, "train")
    assert len(by) == len(plain) > 0
    assert all(math.isnan(r["entropy"]) for r in by)
    assert all(math.isfinite(r["entropy"]) for r in plain)
    assert [r["loss"] for r in by] != [r["loss"] for r in plain]
    logs = sorted((tmp_path / "bypass" / "logs" / "fp8-ais_seed0").glob("train_data_step*.jsonl"))
    assert logs
    for path in logs:
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            assert sample["prev_logprobs"] == sample["generation_logprobs"]
    assert main(["report", str(tmp_path / "bypass")]) == 0  # the report takes the NaN entropy
    assert "| fp8-ais |" in (tmp_path / "bypass" / "summary.md").read_text()
