# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A corrupt warm-start cache or run checkpoint: one line at the CLI, nothing else lost.

Every case damages a real file written by a real run (truncation, garbage bytes, a
valid torch file that is not what it claims to be) and goes through ``nemo_ais.cli.main``:
exit 1, one stderr line naming the file and the fix, no traceback, and every other file of
the run (other arms' checkpoints, metrics.jsonl, other cache files) byte-identical.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from nemo_ais.cli import main
from nemo_ais.embedded.checkpoint import (
    UnreadableFileError,
    atomic_torch_save,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from nemo_ais.embedded.config import CONFIG_DIR, load_config, validate_config
from nemo_ais.embedded.dist import RecipeError
from nemo_ais.embedded.warmstart import load_warm_start, warm_start_path

pytestmark = pytest.mark.timeout(300)

# Two arms x one seed, 2 GRPO steps each (checkpoint at step 2), the quick preset's warm
# start (data and warm start as quick.yaml: its cache file is shared, tests/e2e/conftest.py).
ARMS = ("bf16", "fp8-ais")
SMALL = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "rollout.prompts_per_chunk=2",
    "grpo.max_num_steps=2",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "policy.train_micro_batch_size=8",
    f"experiment.include=[{','.join(ARMS)}]",
    "experiment.seeds=[0]",
    "cluster.dp_size=1",
    "logger.progress_bar=false",
    "logger.plots=false",
]


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path):
    data = bytearray(path.read_bytes())
    data[:64] = bytes(range(64))  # the zip's local header and the first member's name
    path.write_bytes(bytes(data))


def _not_a_dict(path):
    torch.save([1, 2, 3], path)


DAMAGE = {"truncated": _truncate, "garbled": _garble, "not_a_dict": _not_a_dict}


# Relative paths (every test runs in its own cwd), so that a copy of the finished run has
# the very config the run directory pins and resumes instead of being refused.
RUNS, CACHE = Path("runs"), Path("cache")
ARGV = ["run", "--quick", f"logger.run_dir={RUNS}", "logger.name=run", f"policy.warm_start.cache_dir={CACHE}", *SMALL]


def _digests(root):
    return {
        p.relative_to(root): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _one_line_error(capsys, *needles):
    """The error is one line; the warm start's own progress lines (which cache file it
    reuses or trains, how long it took) may precede it."""
    lines = capsys.readouterr().err.strip().splitlines()
    err = "\n".join(ln for ln in lines if not ln.startswith("warm start: "))
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir):
    """A finished two-arm run and its warm-start cache, pristine; copied by ``run_copy``.

    Its cache starts as a copy of the session's (``cache_dir``), and the session's gets the
    warm start this run trained, if it trained one.
    """
    root = tmp_path_factory.mktemp("bad_files")
    shutil.copytree(cache_dir, root / CACHE)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert main(ARGV) == 0
        trained = root / _warm_start_file()
    assert trained.is_file()
    if not (cache_dir / trained.name).exists():
        shutil.copy2(trained, cache_dir / trained.name)
    return root


@pytest.fixture
def run_copy(finished_run, tmp_path, monkeypatch):
    """A private copy of the finished run in the cwd: ``(run_dir, cache_dir)``, relative."""
    shutil.copytree(finished_run / RUNS, tmp_path / RUNS)
    shutil.copytree(finished_run / CACHE, tmp_path / CACHE)
    monkeypatch.chdir(tmp_path)
    return RUNS / "run", CACHE


def _warm_start_file():
    return warm_start_path(validate_config(load_config(CONFIG_DIR / "quick.yaml", ARGV[2:])))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_corrupt_checkpoint_names_the_file_and_keeps_every_other_file(run_copy, capsys, damage):
    run_dir, _ = run_copy
    bad = checkpoint_path(run_dir, ARMS[1], 0)
    DAMAGE[damage](bad)
    before = _digests(run_dir)

    assert main(ARGV) == 1
    _one_line_error(capsys, f"checkpoint {bad}", f"rm {bad}", "--overwrite")
    # nothing was truncated, rewritten or deleted: the other arm's checkpoint, the metrics
    # of both arms and the damaged file itself are as they were
    assert _digests(run_dir) == before


def test_a_corrupt_checkpoint_stops_the_launch_before_an_earlier_run_resumes(run_copy, capsys):
    """Every checkpoint is read before any run trains: an unfinished first run is not resumed (its checkpoint and
    metrics rewritten) before a later run's damaged checkpoint stops the launch."""
    run_dir, _ = run_copy
    first = checkpoint_path(run_dir, ARMS[0], 0)
    blob = load_checkpoint(first)
    atomic_torch_save({**blob, "finished": False, "step": 1}, first)  # the first run, unfinished at step 1
    bad = checkpoint_path(run_dir, ARMS[1], 0)
    DAMAGE["garbled"](bad)
    before = _digests(run_dir)

    assert main(ARGV) == 1
    _one_line_error(capsys, f"checkpoint {bad}", f"rm {bad}")
    assert _digests(run_dir) == before


def test_checkpoint_that_does_not_fit_the_run_is_one_line(run_copy, capsys):
    # readable, every key present, but the policy has another shape (e.g. a checkpoint
    # copied from a run with another policy.model): refused before anything is truncated
    run_dir, _ = run_copy
    bad = checkpoint_path(run_dir, ARMS[1], 0)
    blob = torch.load(bad, weights_only=False)
    name = next(iter(blob["policy"]))
    blob["policy"][name] = torch.zeros(3, 5)
    torch.save(blob, bad)
    before = _digests(run_dir)
    assert main(ARGV) == 1
    _one_line_error(capsys, f"checkpoint {bad} does not fit this run", f"rm {bad}", "--overwrite")
    assert _digests(run_dir) == before


@pytest.mark.distributed
def test_corrupt_checkpoint_on_two_dp_ranks_is_one_line(run_copy, capsys):
    # every rank loads the checkpoint; the ranks' errors come back through the launcher
    run_dir, _ = run_copy
    bad = checkpoint_path(run_dir, ARMS[0], 0)
    _garble(bad)
    before = _digests(run_dir)
    assert main([*ARGV, "cluster.dp_size=2"]) == 1
    _one_line_error(capsys, f"checkpoint {bad}", f"rm {bad}", "--overwrite")
    after = _digests(run_dir)
    # config.yaml now pins cluster.dp_size=2 (a resume-free key); nothing else changed
    assert after.pop(Path("config.yaml")) != before.pop(Path("config.yaml"))
    assert after == before


def test_following_the_checkpoint_remedy_redoes_only_that_run(run_copy, capsys):
    run_dir, _ = run_copy
    bad = checkpoint_path(run_dir, ARMS[1], 0)
    good = checkpoint_path(run_dir, ARMS[0], 0)
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    _truncate(bad)
    good_bytes = good.read_bytes()

    assert main(ARGV) == 1
    _one_line_error(capsys, f"rm {bad}")
    bad.unlink()  # what the message says to do
    assert main(ARGV) == 0
    assert good.read_bytes() == good_bytes  # the finished arm was not redone
    assert load_checkpoint(bad)["step"] == 2  # the deleted arm ran again, to the end
    again = (run_dir / "metrics.jsonl").read_text().splitlines()

    def strip(lines, arm):
        rows = [json.loads(x) for x in lines]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r.get("arm") == arm]

    for arm in ARMS:  # same seeded streams: the redone arm reproduces its records exactly
        assert strip(again, arm) == strip(records, arm), arm


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_corrupt_warm_start_cache_names_the_file(run_copy, capsys, damage):
    run_dir, cache_dir = run_copy
    bad = _warm_start_file()
    assert bad.is_file() and bad.parent == cache_dir
    (cache_dir / "warmstart-other.pt").write_bytes(b"another config's cache")
    DAMAGE[damage](bad)
    before_run, before_cache = _digests(run_dir), _digests(cache_dir)

    assert main(ARGV) == 1
    _one_line_error(capsys, f"warm-start cache {bad}", f"rm {bad}")
    assert _digests(run_dir) == before_run
    assert _digests(cache_dir) == before_cache  # not retrained over, nothing else removed


@pytest.mark.usefixtures("run_copy")
def test_warm_start_cache_that_does_not_fit_the_policy(capsys):
    bad = _warm_start_file()
    blob = torch.load(bad, weights_only=True)
    name = next(iter(blob["state_dict"]))
    blob["state_dict"][name] = blob["state_dict"][name][:1]  # right key, wrong shape
    torch.save(blob, bad)

    assert main(ARGV) == 1
    _one_line_error(capsys, f"warm-start cache {bad}", "does not fit", name, f"rm {bad}")


def test_unwritable_warm_start_cache_dir_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    argv = [
        *ARGV,
        f"logger.run_dir={tmp_path}",
        f"policy.warm_start.cache_dir={blocker / 'cache'}",
        "policy.warm_start.steps=1",
    ]
    assert main(argv) == 1
    _one_line_error(capsys, f"{blocker / 'cache'}", "policy.warm_start.cache_dir=")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_load_checkpoint_raises_a_recipe_error_naming_the_file(tmp_path, damage):
    path = tmp_path / "latest.pt"
    policy = torch.nn.Linear(2, 2)
    save_checkpoint(
        path,
        step=3,
        finished=False,
        policy=policy,
        optimizer=torch.optim.AdamW(policy.parameters()),
        ais_state={"ema": 0.5},
    )
    assert load_checkpoint(path)["step"] == 3
    DAMAGE[damage](path)
    with pytest.raises(UnreadableFileError, match=f"checkpoint {path}.*rm {path}") as info:
        load_checkpoint(path)
    assert isinstance(info.value, RecipeError)  # what the CLI prints as one line (exit 1)
    assert "\n" not in str(info.value)


def test_load_checkpoint_missing_keys_and_absent_file(tmp_path):
    assert load_checkpoint(tmp_path / "absent.pt") is None
    path = tmp_path / "latest.pt"
    torch.save({"step": 1, "policy": {}}, path)
    with pytest.raises(UnreadableFileError, match=f"{path} lacks finished, optimizer"):
        load_checkpoint(path)
    with pytest.raises(UnreadableFileError, match=f"warm-start cache {path} is not a warm-start"):
        load_warm_start(path)
