# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais analyze`` where a user points it: a run's log_dir, a log root, a run directory.

NeMo-RL writes one run's ``train_data_step{N}.jsonl`` to its ``logger.log_dir`` (e.g.
``logs/exp_001``); ``nemo-ais run`` writes each arm and seed to
``<run_dir>/logs/<arm>_seed<n>`` (two levels below ``runs/default``). Given a directory
above runs, analyze finds each (up to 4 levels down) and analyses each on its own; the
result of each equals the analysis of that run's log_dir given directly. Logs are written
by NeMo-RL's real logger (``write_run``).
"""

from __future__ import annotations

import json

import pytest
from test_analyze_logs import write_run

from nemo_ais.analyze import analyze_run
from nemo_ais.analyze.reader import find_log_dirs
from nemo_ais.cli import main

ARGS = ["--no-progress", "--no-plots"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def run_dir(tmp_path):
    """A ``nemo-ais run`` directory: metrics.jsonl, checkpoints/ and logs/<arm>_seed<n>/."""
    run = tmp_path / "runs" / "default"
    (run / "checkpoints" / "bf16_seed0").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    for i, name in enumerate(("bf16_seed0", "fp8-ais_seed0", "fp8-ais_seed1")):
        write_run(run / "logs" / name, [1, 2, 3], scale=0.004 * i, seed=i)
    return run


def test_a_run_directory_analyses_each_arm_and_seed(capsys, tmp_path, run_dir):
    capsys.readouterr()  # NeMo-RL's logger prints while the fixture logs
    assert main(["analyze", str(run_dir), *ARGS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"nemo-ais analyze: 3 run(s) below {run_dir}"
    names = ("bf16_seed0", "fp8-ais_seed0", "fp8-ais_seed1")
    for line, name in zip(out[1:], names, strict=True):
        assert line.startswith(f"nemo-ais analyze: logs/{name}: 3 steps (1..3), 0 alarm(s)")
    for name in names:  # each equals its log_dir analysed directly
        direct = analyze_run(run_dir / "logs" / name, tmp_path / "direct" / name, plots=False)
        found = _rows(run_dir / "logs" / name / "ais_analysis" / "analysis.jsonl")
        assert found == direct.rows
    assert _rows(run_dir / "logs" / "fp8-ais_seed1" / "ais_analysis" / "analysis.jsonl")[0]["ais/severity"] > 0
    assert not (run_dir / "ais_analysis").exists()


def test_the_runs_parent_and_out_keep_each_runs_path(capsys, tmp_path, run_dir):
    out = tmp_path / "out"
    assert main(["analyze", str(run_dir.parent), "--out", str(out), *ARGS]) == 0
    assert f"3 run(s) below {run_dir.parent}" in capsys.readouterr().out
    for name in ("bf16_seed0", "fp8-ais_seed0", "fp8-ais_seed1"):
        assert (out / "default" / "logs" / name / "report.md").is_file()


def test_a_nemo_rl_log_root(capsys, tmp_path):
    root = tmp_path / "logs"
    write_run(root / "exp_001", [1, 2])
    write_run(root / "exp_002", [1, 2, 3, 4])
    assert find_log_dirs(root) == [root / "exp_001", root / "exp_002"]
    assert find_log_dirs(root / "exp_001") == [root / "exp_001"]  # a log_dir: no search
    assert main(["analyze", str(root), *ARGS]) == 0
    out = capsys.readouterr().out
    assert "exp_001: 2 steps (1..2)" in out and "exp_002: 4 steps (1..4)" in out


def test_list_prints_the_runs_found_and_analyses_nothing(capsys, run_dir):
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--list"]) == 0
    logs = run_dir / "logs"
    assert capsys.readouterr().out.splitlines() == [
        str(logs / n) for n in ("bf16_seed0", "fp8-ais_seed0", "fp8-ais_seed1")
    ]
    assert not any(run_dir.rglob("ais_analysis"))


def test_a_bad_run_is_reported_and_the_others_still_analysed(capsys, run_dir):
    bad = run_dir / "logs" / "fp8-ais_seed0" / "train_data_step2.jsonl"
    bad.write_bytes(bad.read_bytes()[:-50])
    assert main(["analyze", str(run_dir), *ARGS]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and f"{bad}:8: truncated line" in captured.err
    assert "--skip-bad-rows" in captured.err
    assert "logs/bf16_seed0: 3 steps" in captured.out
    assert "logs/fp8-ais_seed1: 3 steps" in captured.out
    assert (run_dir / "logs" / "fp8-ais_seed1" / "ais_analysis" / "report.md").is_file()


def test_an_unreadable_log_dir_is_the_no_step_file_error_not_a_traceback(capsys, monkeypatch, tmp_path):
    """A LOG_DIR whose listing fails (permissions) is a one-line error with exit 1."""
    from pathlib import Path

    locked = tmp_path / "locked"
    locked.mkdir()
    listing = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert main(["analyze", str(locked)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no train_data_step{N}.jsonl files in it" in err
