# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais analyze`` on a NeMo-RL run resumed from a checkpoint.

Each launch of NeMo-RL's entry point logs to a new ``exp_NNN`` (``get_next_experiment_dir``); a resumed launch goes on
counting steps from its checkpoint. The oracle: the same steps logged into ONE directory (steps before the resume from
the first launch, the rest from the second), analysed as a plain run; joined, the launches must give the same rows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from test_analyze_logs import write_run

from nemo_ais.analyze import BadInputError, analyze_run
from nemo_ais.analyze.reader import find_log_dirs, join_launches, stitch_launches
from nemo_ais.cli import main
from nemo_ais.config import CorrectionConfig
from nemo_ais.rollout.readback import READBACK_FILE, RefitReadback, readback_row

ARGS = ["--no-progress", "--no-plots"]
FIRST, RESUMED = range(1, 8), range(5, 11)  # exp_001 logs 1-7, crashes; its checkpoint at 4: exp_002 logs 5-10


def _steps(steps, seed):
    # a growing mismatch; the second launch's batches differ from the rolled-back ones (another sampler seed)
    return {s: {"seed": seed, "scale": 0.03} for s in steps}


def _readbacks(log_dir, rows):
    (log_dir / READBACK_FILE).write_text("".join(readback_row(s, r) + "\n" for s, r in rows.items()))


@pytest.fixture
def logs(tmp_path):
    root = tmp_path / "logs"
    write_run(root / "exp_001", _steps(FIRST, seed=1))
    write_run(root / "exp_002", _steps(RESUMED, seed=2))
    return root


def test_join_launches_groups_a_resumed_runs_exp_dirs(tmp_path, caplog):
    root = tmp_path / "logs"  # NeMo-RL's default logger.log_dir, shared by every experiment
    for name, steps in [
        ("exp_001", range(1, 7)),  # experiment A, crashes after step 6
        ("exp_002", [1, 2, 3]),  # experiment B, launched meanwhile
        ("exp_003", range(5, 9)),  # A resumed from step 4's checkpoint: B never logged step 4
        ("exp_999", range(1, 21)),
        ("exp_1000", range(15, 26)),  # numeric order: it continues exp_999
    ]:
        write_run(root / name, list(steps))
    write_run(root / "mine", [4, 5])  # not a launch directory: a run of its own
    write_run(tmp_path / "other" / "exp_004", [5])  # resumed, but nothing beside it logged step 4
    with caplog.at_level(logging.WARNING, logger="nemo_ais.analyze.reader"):
        runs = join_launches(find_log_dirs(tmp_path))
    assert runs == [
        [root / "exp_001", root / "exp_003"],
        [root / "exp_002"],
        [root / "exp_999", root / "exp_1000"],
        [root / "mine"],
        [tmp_path / "other" / "exp_004"],
    ]
    assert "exp_004 starts at step 5, a launch resumed from a checkpoint, but no earlier launch" in caplog.text


def test_a_launch_two_runs_could_continue_is_not_joined(tmp_path, caplog):
    root = tmp_path / "logs"
    write_run(root / "exp_001", range(1, 7))
    write_run(root / "exp_002", range(1, 7))
    write_run(root / "exp_003", [5, 6, 7])  # both logged step 4: which one resumed is not in the logs
    with caplog.at_level(logging.WARNING, logger="nemo_ais.analyze.reader"):
        runs = join_launches(find_log_dirs(root))
    assert runs == [[root / "exp_001"], [root / "exp_002"], [root / "exp_003"]]
    assert f"{root / 'exp_001'} and {root / 'exp_002'} each logged step 4" in caplog.text


def test_a_launch_resumed_with_the_checkpoints_config_nests_and_is_joined(tmp_path):
    # the checkpoint's config.yaml holds the first launch's logger.log_dir (logs/exp_001): the next launch logs to
    # logs/exp_001/exp_001 (NeMo-RL's get_next_experiment_dir)
    root = tmp_path / "logs"
    write_run(root / "exp_001", range(1, 7))
    write_run(root / "exp_001" / "exp_001", range(5, 10))
    assert find_log_dirs(root) == [root / "exp_001", root / "exp_001" / "exp_001"]
    assert find_log_dirs(root / "exp_001") == [root / "exp_001", root / "exp_001" / "exp_001"]
    assert join_launches(find_log_dirs(root)) == [[root / "exp_001", root / "exp_001" / "exp_001"]]


def test_stitch_drops_every_step_the_resume_rolled_back(logs):
    from nemo_ais.analyze.reader import find_step_files

    write_run(logs / "exp_003", [8, 9])  # resumed again, from step 7's checkpoint
    kept, rolled_back = stitch_launches([find_step_files(logs / d) for d in ("exp_001", "exp_002", "exp_003")])
    assert [(f.step, f.path.parent.name) for f in kept] == [
        *((s, "exp_001") for s in (1, 2, 3, 4)),
        *((s, "exp_002") for s in (5, 6, 7)),
        *((s, "exp_003") for s in (8, 9)),  # exp_002's 10 is rolled back although exp_003 never logs it
    ]
    assert sorted((f.step, f.path.parent.name) for f in rolled_back) == [
        *((s, "exp_001") for s in (5, 6, 7)),
        *((s, "exp_002") for s in (8, 9, 10)),
    ]


def test_joined_launches_equal_the_run_logged_in_one_directory(logs, tmp_path):
    oracle_dir = tmp_path / "one_launch"
    write_run(oracle_dir, {**_steps(range(1, 5), seed=1), **_steps(RESUMED, seed=2)})
    config = CorrectionConfig(ema=0.9)  # alpha's EMA state must carry across the resume
    oracle = analyze_run(oracle_dir, tmp_path / "oracle", config, plots=False)
    joined = analyze_run([logs / "exp_001", logs / "exp_002"], tmp_path / "joined", config, plots=False)
    assert [r["step"] for r in joined.rows] == list(range(1, 11))
    # every value: the EMA of alpha and the alarm windows carry across the resume as in one launch
    assert joined.rows == oracle.rows
    assert joined.files == [logs / "exp_001" / f"train_data_step{s}.jsonl" for s in range(1, 5)] + [
        logs / "exp_002" / f"train_data_step{s}.jsonl" for s in RESUMED
    ]
    # the rolled-back batches differ: analysed alone, exp_001's step 5 is another row
    alone = analyze_run(logs / "exp_001", tmp_path / "alone", config, plots=False)
    assert alone.rows[4]["ais/severity"] != joined.rows[4]["ais/severity"]
    # and the state is carried, not restarted: exp_002 analysed alone starts a fresh EMA
    fresh = analyze_run(logs / "exp_002", tmp_path / "fresh", config, plots=False)
    assert fresh.rows[0]["ais/severity"] == joined.rows[4]["ais/severity"]
    assert fresh.rows[0]["ais/alpha"] != joined.rows[4]["ais/alpha"]
    report = (tmp_path / "joined" / "report.md").read_text()
    assert "**A resumed run**: 2 launches joined" in report
    assert "rolled back by the resume, not analysed: exp_001: 5-7)" in report
    assert not (logs / "exp_002" / "ais_analysis").exists()  # out given


def test_the_readback_of_a_rolled_back_refit_raises_no_alarm(logs, tmp_path):
    bad = RefitReadback(
        weight_error=0.5, weight_module="model.layers.0.mlp.down_proj", kv_scale_error=0.0, weights_checked=3
    )
    good = RefitReadback(weight_error=0.0, weight_module=None, kv_scale_error=0.0, weights_checked=3)
    _readbacks(logs / "exp_001", {s: bad if s == 6 else good for s in FIRST})  # step 6 was rolled back
    _readbacks(logs / "exp_002", {s: bad if s == 9 else good for s in RESUMED})
    result = analyze_run([logs / "exp_001", logs / "exp_002"], tmp_path / "out", plots=False)
    readback_alarms = [a for a in result.alarms if "refit_readback" in a]
    assert len(readback_alarms) == 1 and readback_alarms[0].startswith("step 9: refit_readback")


def test_a_resumed_launch_alone_names_the_launches_it_continues(logs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_ais.analyze.analysis"):
        result = analyze_run(logs / "exp_002", tmp_path / "out", plots=False)
    assert [r["step"] for r in result.rows] == list(RESUMED)
    assert f"{logs / 'exp_002'} is a launch resumed from a checkpoint that continues {logs / 'exp_001'}" in caplog.text
    assert f"analyse {logs} to join the launches" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nemo_ais.analyze.analysis"):
        analyze_run([logs / "exp_002"], tmp_path / "list", plots=False)  # a list: the caller chose the launches
        analyze_run(logs / "exp_001", tmp_path / "first", plots=False)  # not resumed
    assert "resumed" not in caplog.text


def test_analyze_run_refuses_an_empty_list_of_launches(tmp_path):
    with pytest.raises(ValueError, match=r"analyze_run\(log_dir\): expected a log directory"):
        analyze_run([], tmp_path / "out")


def test_cli_analyses_a_log_root_with_a_resumed_run_as_one_run(logs, capsys):
    write_run(logs / "exp_003", [1, 2, 3])  # a new run in the same log root
    capsys.readouterr()  # the logger's own lines
    assert main(["analyze", str(logs), "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{logs / 'exp_001'} + {logs / 'exp_002'}", str(logs / "exp_003")]
    assert main(["analyze", str(logs), *ARGS]) == 0
    out = capsys.readouterr().out
    assert "2 run(s) below" in out
    assert "exp_001 + exp_002: 10 steps (1..10)" in out and "exp_003: 3 steps (1..3)" in out
    rows = [json.loads(x) for x in (logs / "exp_002" / "ais_analysis" / "analysis.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert not (logs / "exp_001" / "ais_analysis").exists()  # a resumed run writes beside its last launch


def test_cli_on_one_resumed_launch_warns_only_that_it_continues_the_others(logs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert main(["analyze", str(logs / "exp_002"), "--out", str(tmp_path / "out"), *ARGS]) == 0
    assert f"{logs / 'exp_002'} is a launch resumed from a checkpoint that continues {logs / 'exp_001'}" in caplog.text
    assert "no earlier launch beside it" not in caplog.text  # exp_001 is beside it


def test_cli_separate_launches_analyses_each_on_its_own(logs, capsys, tmp_path):
    capsys.readouterr()
    assert main(["analyze", str(logs), "--separate-launches", "--out", str(tmp_path / "out"), *ARGS]) == 0
    out = capsys.readouterr().out
    assert "2 run(s) below" in out
    assert "exp_001: 7 steps (1..7)" in out and "exp_002: 6 steps (5..10)" in out


def test_skip_bad_rows_skips_a_bad_readback_row_and_the_report_names_it(logs, tmp_path):
    good = RefitReadback(weight_error=0.0, weight_module=None, kv_scale_error=0.0, weights_checked=3)
    bad = RefitReadback(
        weight_error=0.5, weight_module="model.layers.0.mlp.down_proj", kv_scale_error=0.0, weights_checked=3
    )
    path = logs / "exp_002" / READBACK_FILE
    path.write_text(readback_row(5, good) + '\n{"step": "6"}\n' + readback_row(7, bad) + "\n")
    with pytest.raises(
        BadInputError, match=r"exp_002/refit_readback\.jsonl:2: expected a JSON object with an int step"
    ):
        analyze_run([logs / "exp_001", logs / "exp_002"], tmp_path / "strict", plots=False)
    result = analyze_run([logs / "exp_001", logs / "exp_002"], tmp_path / "out", plots=False, skip_bad_rows=True)
    readback_alarms = [a.split(":")[0] for a in result.alarms if "refit_readback" in a]
    assert readback_alarms == ["step 7"]  # the rows around the bad one still read
    assert result.bad_readback_rows == 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "**Bad refit readback rows, skipped** (`--skip-bad-rows`): 1, first" in report
    assert "refit_readback.jsonl:2: expected a JSON object" in report


def test_analyze_run_refuses_launches_out_of_order_or_twice(logs, tmp_path):
    with pytest.raises(ValueError, match=r"launch 2 \(.*exp_001\) starts at step 1, so it resumed nothing"):
        analyze_run([logs / "exp_002", logs / "exp_001"], tmp_path / "out", plots=False)
    with pytest.raises(ValueError, match=r"a launch is given twice"):
        analyze_run([logs / "exp_001", logs / "exp_001"], tmp_path / "out", plots=False)


@pytest.mark.nemo_rl
def test_launch_dirs_made_by_nemo_rls_own_get_next_experiment_dir(tmp_path):
    from nemo_rl.utils.logger import get_next_experiment_dir

    base = tmp_path / "logs"
    a1 = Path(get_next_experiment_dir(str(base)))  # experiment A
    write_run(a1, range(1, 7))
    b1 = Path(get_next_experiment_dir(str(base)))  # experiment B, in the same logs/
    write_run(b1, [1, 2, 3])
    a2 = Path(get_next_experiment_dir(str(base)))  # A resubmitted with its YAML, from step 4's checkpoint
    write_run(a2, range(5, 9))
    a3 = Path(get_next_experiment_dir(str(a2)))  # A resumed with the checkpoint's config.yaml (log_dir: a2)
    write_run(a3, range(8, 11))
    assert [str(d.relative_to(base)) for d in (a1, b1, a2, a3)] == ["exp_001", "exp_002", "exp_003", "exp_003/exp_001"]
    assert join_launches(find_log_dirs(base)) == [[a1, a2, a3], [b1]]
