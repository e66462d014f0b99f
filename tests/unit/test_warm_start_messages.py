# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A first run says what it is doing before GRPO: the warm start, its cache file, its time.

Issue 28, item 3: the first ``nemo-ais run`` of a fresh clone trains the warm start
(1000 steps) (most of its time on a 2-core CPU) without saying so or where it goes. It now names
the absolute cache file it trains or reuses, and the time training took; the cache is
relative to the working directory (``runs/.cache``), so a run from another directory
trains it again, as the message says.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm, validate_config
from nemo_ais.embedded.dist import RecipeError
from nemo_ais.embedded.experiment import prepare_run_dir
from nemo_ais.embedded.warmstart import build_task, warm_start

TINY = ["policy.warm_start.steps=2", "policy.warm_start.batch_size=4", "data.eval_size=8"]


def _cfg(*extra):
    return resolve_arm(load_config(CONFIG_DIR / "quick.yaml", [*TINY, *extra]), None)


def test_the_warm_start_names_its_cache_file_and_its_time(tmp_path, capsys):
    cfg = _cfg(f"policy.warm_start.cache_dir={tmp_path / 'cache'}")
    path = warm_start(cfg, build_task(cfg), progress=False)
    err = capsys.readouterr().err.splitlines()
    assert path.parent == tmp_path / "cache" and path.is_file()
    assert err[0].startswith(
        f"warm start: training 2 SFT steps once (batch 4); cached at {path} for every later "
        f"run with policy.warm_start.cache_dir={tmp_path / 'cache'}"
    )
    assert re.fullmatch(
        r"warm start: 2 steps in \d+ s, loss \d+\.\d{4}, held-out greedy accuracy \d\.\d{3} "
        r"\(chains right in either notation: \d\.\d{3}\)",
        err[1],
    ), err[1]
    assert warm_start(cfg, build_task(cfg), progress=False) == path  # the second run reuses it
    assert capsys.readouterr().err.splitlines() == [f"warm start: reusing {path}"]


def test_the_default_cache_is_per_working_directory(tmp_path, capsys, monkeypatch):
    cfg = _cfg()  # cache_dir: runs/.cache, as every shipped preset
    paths = []
    for clone in ("clone_a", "clone_b"):
        (tmp_path / clone).mkdir()
        monkeypatch.chdir(tmp_path / clone)
        paths.append(warm_start(cfg, build_task(cfg), progress=False).resolve())
        assert "warm start: training 2 SFT steps once" in capsys.readouterr().err
    assert paths[0].parent == tmp_path / "clone_a" / "runs" / ".cache"
    assert paths[1].parent == tmp_path / "clone_b" / "runs" / ".cache"


def test_the_transition_curve_does_not_change_the_trained_weights(tmp_path):
    """``train_sft(curve_every=...)`` (bench_warm_start --curve) trains the same bits."""
    import torch

    from nemo_ais.embedded.warmstart import greedy_scores, train_sft

    cfg = _cfg("policy.warm_start.steps=4")
    task = build_task(cfg)
    plain, loss, none = train_sft(cfg, task, progress=False)
    traced, loss2, points = train_sft(cfg, task, progress=False, curve_every=2)
    assert none == [] and loss2 == loss and [s for s, *_ in points] == [2, 4]
    traced_state = traced.state_dict()
    for name, a in plain.state_dict().items():
        assert torch.equal(a, traced_state[name]), name
    assert points[-1][1:] == greedy_scores(plain, task, task.eval_problems)


def test_chains_right_accepts_either_notation_and_nothing_else():
    """The warm start's criterion: the chain, closed by <eos> or by the stray `=` + <eos>."""
    import torch

    cfg = resolve_arm(load_config(CONFIG_DIR / "default.yaml", TINY), None)  # the chain task
    task = build_task(cfg)
    problems = task.eval_problems[:4]
    tok = task.tokenizer
    texts = [
        task.answer(problems[0]),  # exact
        task.alt_answer(problems[1]),  # the stray '='
        task.answer(problems[2])[:-1] + ("1" if task.answer(problems[2])[-1] != "1" else "2"),
        task.alt_answer(problems[3]) + "=",  # two '=': neither notation
    ]
    width = max(len(tok.encode(t, eos=True)) for t in texts)
    rows = [tok.encode(t, eos=True) for t in texts]
    ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    assert task.chains_right(problems, ids).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert task.correct(problems, ids).tolist() == [1.0, 0.0, 0.0, 0.0]
    no_eos = ids.clone()
    no_eos[no_eos == tok.eos_id] = tok.pad_id
    assert task.chains_right(problems, no_eos).tolist() == [0.0] * 4


def test_an_unwritable_cache_fails_before_the_warm_start_trains(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cfg = _cfg(f"policy.warm_start.cache_dir={blocker / 'cache'}")
    with pytest.raises(RecipeError, match=f"warm-start cache {blocker / 'cache'}/warmstart-"):
        warm_start(cfg, build_task(cfg), progress=False)
    assert "warm start: training" not in capsys.readouterr().err  # nothing trained, then lost


def test_a_run_resumes_with_another_cache_dir(tmp_path):
    """The cache file is named by the settings that change results; its folder changes none."""
    raw = load_config(CONFIG_DIR / "quick.yaml", [*TINY, f"logger.run_dir={tmp_path}"])
    run_dir = prepare_run_dir(raw, validate_config(raw), overwrite=False)
    (run_dir / "metrics.jsonl").write_text("{}\n")  # a result of the pinned config
    moved = copy.deepcopy(raw)
    moved["policy"]["warm_start"]["cache_dir"] = str(tmp_path / "shared_cache")
    prepare_run_dir(moved, validate_config(moved), overwrite=False)  # accepted
    moved["grpo"]["max_num_steps"] = 99
    with pytest.raises(RecipeError, match="different config"):
        prepare_run_dir(moved, validate_config(moved), overwrite=False)


def test_a_config_pinned_before_any_result_is_pinned_again(tmp_path):
    """A run that failed before its first result (a diverging warm start) reruns with another lr."""
    raw = load_config(CONFIG_DIR / "quick.yaml", [*TINY, f"logger.run_dir={tmp_path}"])
    run_dir = prepare_run_dir(raw, validate_config(raw), overwrite=False)
    lower = copy.deepcopy(raw)
    lower["policy"]["warm_start"]["lr"] = 1e-4
    prepare_run_dir(lower, validate_config(lower), overwrite=False)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["policy"]["warm_start"]["lr"] == 1e-4
    (run_dir / "checkpoints").mkdir()  # a result: an (arm, seed) checkpoint
    with pytest.raises(RecipeError, match=r"different config \(policy\.warm_start\.lr: 0\.0001 -> 0\.001\)"):
        prepare_run_dir(raw, validate_config(raw), overwrite=False)


def test_a_diverging_warm_start_is_a_recipe_error_naming_its_lr(tmp_path):
    # the CLI reports a RecipeError in one line (exit 1): not a FloatingPointError traceback
    cfg = _cfg(
        f"policy.warm_start.cache_dir={tmp_path / 'cache'}",
        "policy.warm_start.lr=1e8",
        "policy.warm_start.steps=10",
        "policy.warm_start.warmup_steps=1",
    )
    with pytest.raises(RecipeError, match=r"non-finite SFT loss at step \d+; lower policy\.warm_start\.lr \(now 1"):
        warm_start(cfg, build_task(cfg), progress=False)
