# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Bad log input: one line naming file, line and problem; exit code 1; no traceback.

Each case starts from a run logged by NeMo-RL's real logger and damages one file the way
a crash, a disk or a hand edit would; ``--skip-bad-rows`` counts bad rows and continues.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest
from test_analyze_logs import write_run

from nemo_ais.analyze import analyze_run
from nemo_ais.cli import main


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("pristine")
    write_run(log_dir, [1, 2])
    return {p.name: p.read_bytes() for p in log_dir.glob("train_data_step*.jsonl")}


@pytest.fixture
def log_dir(tmp_path, pristine):
    out = tmp_path / "logs"
    out.mkdir()
    for name, blob in pristine.items():
        (out / name).write_bytes(blob)
    return out


def _edit_row(path, line, edit):
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[line - 1])
    edit(row)
    lines[line - 1] = json.dumps(row) + "\n"
    path.write_text("".join(lines))


def _fails_with(capsys, log_dir, where, problem, *extra):
    code = main(["analyze", str(log_dir), "--no-progress", "--no-plots", *extra])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1, err  # exactly one line
    assert "Traceback" not in err
    assert where in err and problem in err, err
    return err


def test_truncated_line(capsys, log_dir):
    path = log_dir / "train_data_step2.jsonl"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) - 100])  # a writer cut off in the last row
    _fails_with(capsys, log_dir, "train_data_step2.jsonl:8:", "truncated line")


def test_non_json_line(capsys, log_dir):
    path = log_dir / "train_data_step1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "Logged data to somewhere\n"
    path.write_text("".join(lines))
    _fails_with(capsys, log_dir, "train_data_step1.jsonl:3:", "not valid JSON")


def test_mismatched_lengths(capsys, log_dir):
    _edit_row(log_dir / "train_data_step2.jsonl", 5, lambda r: r["prev_logprobs"][0].pop())
    _fails_with(
        capsys,
        log_dir,
        "train_data_step2.jsonl:5:",
        "mismatched lengths: token_ids 24, token_loss_mask 24, generation_logprobs 24, prev_logprobs 23",
    )


def test_missing_key(capsys, log_dir):
    _edit_row(log_dir / "train_data_step1.jsonl", 4, lambda r: r.pop("generation_logprobs"))
    _fails_with(capsys, log_dir, "train_data_step1.jsonl:4:", "missing key(s) generation_logprobs")


def test_empty_directory(capsys, tmp_path):
    _fails_with(capsys, tmp_path, str(tmp_path), "no train_data_step{N}.jsonl files")


def test_a_missing_path_and_a_file_are_told_apart(capsys, tmp_path):
    _fails_with(capsys, tmp_path / "nope", f"{tmp_path / 'nope'}:0: ", "does not exist")
    (tmp_path / "a_file").write_text("")
    _fails_with(capsys, tmp_path / "a_file", f"{tmp_path / 'a_file'}:0: ", "not a directory")


def test_truncated_line_names_the_skip_option(capsys, log_dir):
    path = log_dir / "train_data_step2.jsonl"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) - 100])
    _fails_with(capsys, log_dir, "truncated line", "--skip-bad-rows skips such a step")


def test_no_run_within_the_search_depth(capsys, tmp_path, pristine):
    deep = tmp_path / "a" / "b" / "c" / "d" / "e"  # 5 levels below: beyond the search
    deep.mkdir(parents=True)
    (deep / "train_data_step1.jsonl").write_bytes(pristine["train_data_step1.jsonl"])
    _fails_with(capsys, tmp_path, str(tmp_path), "no train_data_step{N}.jsonl files in it or 4 levels")


def test_missing_step_file_is_warned_and_listed(capsys, caplog, tmp_path, log_dir):
    # steps 1, 2, 4 (and 7): once "3 steps, 1..4" and nothing else
    (log_dir / "train_data_step2.jsonl").rename(log_dir / "train_data_step4.jsonl")
    (log_dir / "train_data_step1.jsonl").rename(log_dir / "train_data_step2.jsonl")
    write_run(log_dir, [1, 7])
    out = tmp_path / "out"
    assert main(["analyze", str(log_dir), "--out", str(out), "--no-progress", "--no-plots"]) == 0
    assert "4 steps (1..7, 3 missing: 3, 5-6)" in capsys.readouterr().out
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("3 step file(s) missing" in w and "3, 5-6" in w for w in warned), warned
    report = (out / "report.md").read_text()
    assert "**Missing step files**: 3 between steps 1 and 7 (steps 3, 5-6)" in report
    result = analyze_run(log_dir, tmp_path / "api", plots=False)
    assert result.missing_steps == [3, 5, 6]
    assert [r["step"] for r in result.rows] == [1, 2, 4, 7]


def test_format_steps():
    from nemo_ais.analyze.reader import format_steps

    assert format_steps([3]) == "3"
    assert format_steps([3, 5, 6, 7, 10]) == "3, 5-7, 10"
    assert format_steps([1, 3, 5, 7], limit=2) == "1, 3 and 2 more"
    assert format_steps([]) == ""


def test_a_step_whose_every_sequence_is_masked_is_an_empty_global_batch(tmp_path, log_dir):
    """NeMo-RL's seq_logprob_error_threshold masks the sequences whose mismatch exceeds it (a broken refit: all of
    them) before it logs the step; the loss then saw an empty global batch, and so does the replay (it stopped)."""
    path = log_dir / "train_data_step2.jsonl"
    for line in range(1, 9):
        _edit_row(path, line, lambda r: r.update(sample_loss_mask=[0.0]))
    result = analyze_run(log_dir, tmp_path / "out", plots=False)
    (step2,) = [r for r in result.rows if r["step"] == 2]
    assert step2["ais/empty_batch"] == 1.0 and step2["ais/alpha"] == 0.0 and step2["ais/n_tok"] == 0.0
    assert all(math.isfinite(v) for v in step2.values() if isinstance(v, float)), step2
    report = (tmp_path / "out" / "report.md").read_text()
    assert "**Steps whose every sequence was masked**" in report and "train_data_step2.jsonl (8 rows)" in report


def test_empty_global_batches_are_no_measurements_in_the_report(tmp_path):
    # D grows with the step; steps 15-20 masked whole: their stand-ins (D 0, alpha 0) once made the trend "flat"
    log_dir = tmp_path / "logs"
    write_run(log_dir, list(range(1, 21)))
    for step in range(15, 21):
        for line in range(1, 9):
            _edit_row(log_dir / f"train_data_step{step}.jsonl", line, lambda r: r.update(sample_loss_mask=[0.0]))
    result = analyze_run(log_dir, tmp_path / "out", plots=False)
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "The 6 step(s) without a usable token (every sequence masked, or every valid log-prob non-finite) are "
        "left out of every statistic below (14 of 20 steps fitted)" in report
    )
    (severity,) = [line for line in report.splitlines() if line.startswith("| `ais/severity` (severity")]
    assert severity.endswith("| grows |"), severity
    measured = [r["ais/severity"] for r in result.rows if r["step"] < 15]
    assert f"D = {statistics.fmean(measured):.4g}" in report  # the placement's mean: measured steps only


def test_placeholder_prev_logprobs_of_a_bypass_run(capsys, log_dir):
    # NeMo-RL writes prev_logprobs = zeros_like(generation_logprobs) when
    # loss_fn.force_on_policy_ratio is on (grpo.py, v0.7.0 and main); replayed as pi_old,
    # the report said D ~ 1 and advised AIS
    path = log_dir / "train_data_step2.jsonl"
    for line in range(1, 9):
        _edit_row(path, line, lambda r: r.update(prev_logprobs=[[0.0] * len(r["prev_logprobs"][0])]))
    err = _fails_with(capsys, log_dir, "train_data_step2.jsonl:0:", "prev_logprobs is 0 at all")
    assert "force_on_policy_ratio" in err and "loss_fn.ais.bypass" in err
    # with top-k / top-p sampling every such token also looks like a filtered placeholder: refused all the same
    # (once: all left out, then analysed as an empty global batch, "every sequence masked")
    with pytest.raises(ValueError, match=r"step2.jsonl:0: prev_logprobs is 0 at all \d+ valid tokens"):
        analyze_run(log_dir, log_dir.parent / "out", plots=False, filtered_sampling=True)


def test_a_step_whose_every_valid_log_prob_is_non_finite_is_no_masked_step(tmp_path, log_dir):
    path = log_dir / "train_data_step2.jsonl"
    for line in range(1, 9):
        _edit_row(path, line, lambda r: r.update(generation_logprobs=[[float("nan")] * len(r["prev_logprobs"][0])]))
    result = analyze_run(log_dir, tmp_path / "out", plots=False)
    (step2,) = [r for r in result.rows if r["step"] == 2]
    assert any(": nonfinite: 64 valid positions" in a for a in step2["alarms"]), step2["alarms"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Steps whose every sequence was masked" not in report
    # every step so: nothing measured, no stand-in numbers, and the alarms still lead the advice
    for line in range(1, 9):
        _edit_row(
            log_dir / "train_data_step1.jsonl",
            line,
            lambda r: r.update(generation_logprobs=[[float("nan")] * len(r["prev_logprobs"][0])]),
        )
    analyze_run(log_dir, tmp_path / "all", plots=False)
    report = (tmp_path / "all" / "report.md").read_text()
    assert report.count("No step had a usable token: nothing was measured.") == 3
    assert "This run's mismatch" not in report and "| `ais/alpha` |" not in report
    assert "- 2 alarm(s), the first: step 1: nonfinite:" in report


def test_empty_file(capsys, log_dir):
    (log_dir / "train_data_step3.jsonl").write_text("")
    _fails_with(capsys, log_dir, "train_data_step3.jsonl:0:", "empty file")


def test_skip_bad_rows_skips_a_step_without_a_row(tmp_path, log_dir):
    # the empty file of a writer killed at its start: analysed without that step, which report.md names
    (log_dir / "train_data_step2.jsonl").write_text("")
    (log_dir / "train_data_step3.jsonl").write_text("")
    result = analyze_run(log_dir, tmp_path / "out", skip_bad_rows=True, plots=False)
    assert [r["step"] for r in result.rows] == [1]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Steps skipped** (`--skip-bad-rows`: no row to analyse, or the file cut off mid-row): 2, first " in report
    assert "train_data_step2.jsonl: empty file (no rows)" in report
    (log_dir / "train_data_step1.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"no step file with a row to analyse \(3 skipped\)"):
        analyze_run(log_dir, tmp_path / "out2", skip_bad_rows=True, plots=False)


def test_skip_bad_rows_skips_a_step_cut_off_mid_row_not_just_the_row(tmp_path, log_dir):
    # a run killed while NeMo-RL's logger wrote step 2: the rows before the cut are not the step's global batch
    path = log_dir / "train_data_step2.jsonl"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) - 100])
    result = analyze_run(log_dir, tmp_path / "out", skip_bad_rows=True, plots=False)
    assert [r["step"] for r in result.rows] == [1] and result.bad_rows == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "train_data_step2.jsonl: truncated line (no newline at the end of the file): " in report
    assert "; the writer stopped there, the rows it had yet to write are missing" in report
    # a bad row that ends in its newline is one bad row: the step is analysed without it
    lines = blob.decode().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:-100] + "\n")
    result = analyze_run(log_dir, tmp_path / "out2", skip_bad_rows=True, plots=False)
    assert [r["step"] for r in result.rows] == [1, 2] and result.bad_rows == 1
    # a whole last row whose newline the writer had yet to write: cut off all the same
    path.write_bytes(blob[:-1])
    result = analyze_run(log_dir, tmp_path / "out3", skip_bad_rows=True, plots=False)
    assert [r["step"] for r in result.rows] == [1]
    report = (tmp_path / "out3" / "report.md").read_text()
    assert "train_data_step2.jsonl: the last row has no newline (NeMo-RL's logger ends each with one); the" in report
    with pytest.raises(ValueError, match=r"step2.jsonl:8: the last row has no newline.*--skip-bad-rows skips such"):
        analyze_run(log_dir, tmp_path / "out4", plots=False)


def test_a_last_step_cut_at_a_row_boundary_is_skipped_as_a_step(tmp_path):
    # the logger killed between two rows: every line ends in its newline, 5 of the 8 rows are there
    log_dir = tmp_path / "logs"
    write_run(log_dir, [1, 2, 3])
    path = log_dir / "train_data_step3.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    result = analyze_run(log_dir, tmp_path / "out", skip_bad_rows=True, plots=False)
    assert [r["step"] for r in result.rows] == [1, 2]
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "train_data_step3.jsonl: 5 rows where each of the 2 earlier steps has 8 (cut at a row boundary); the "
        "writer stopped there" in report
    )
    with pytest.raises(ValueError, match=r"step3.jsonl:0: 5 rows where .*--skip-bad-rows skips such a step"):
        analyze_run(log_dir, tmp_path / "out2", plots=False)
    # a shorter step that is not the last is no cut: analysed (a missing row elsewhere is bad input of its own)
    write_run(log_dir, [4])
    assert [r["step"] for r in analyze_run(log_dir, tmp_path / "out3", plots=False).rows] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda r: r["prev_logprobs"][0].__setitem__(5, None), "prev_logprobs: expected numbers"),
        (lambda r: r.update(sample_loss_mask=[0.5]), "sample_loss_mask: expected 0 or 1"),
        (lambda r: r["token_loss_mask"][0].__setitem__(6, 2), "token_loss_mask: value 2.0"),
        (lambda r: r.update(prev_logprobs=[[0.0], [0.0]]), "prev_logprobs: expected a batch of one"),
        (  # nested three deep: once a traceback (RuntimeError: expand(...) in _chunk)
            lambda r: r.update(prev_logprobs=[[[v] for v in r["prev_logprobs"][0]]]),
            "prev_logprobs: expected numbers in one flat list ([[v_0, ..., v_S-1]]), found a nested list at position 0",
        ),
        (  # ragged nesting
            lambda r: r.update(generation_logprobs=[[[0.0], [1.0, 2.0]]]),
            "generation_logprobs: expected numbers in one flat list",
        ),
        (  # booleans are not numbers (torch would read them as 1.0 silently)
            lambda r: r["token_loss_mask"][0].__setitem__(6, True),
            "token_loss_mask: expected numbers in one flat list ([[v_0, ..., v_S-1]]), found bool True at position 6",
        ),
        (lambda r: r.update(sample_loss_mask=[True]), "sample_loss_mask: expected [0 or 1]"),
        (  # JSON allows any integer; float64 does not (once an OverflowError traceback)
            lambda r: r["prev_logprobs"][0].__setitem__(4, -(10**400)),
            "prev_logprobs: expected numbers in one flat list ([[v_0, ..., v_S-1]]), found "
            "an integer beyond float64 range at position 4",
        ),
        (lambda r: r.update(sample_loss_mask=[10**400]), "got 1" + "0" * 59 + " (--skip"),
        (
            lambda r: r["token_loss_mask"][0].__setitem__(6, 10**400),
            "token_loss_mask: expected numbers in one flat list ([[v_0, ..., v_S-1]]), found "
            "an integer beyond float64 range at position 6",
        ),
    ],
)
def test_malformed_values(capsys, log_dir, edit, problem):
    _edit_row(log_dir / "train_data_step1.jsonl", 2, edit)
    _fails_with(capsys, log_dir, "train_data_step1.jsonl:2:", problem)


def test_an_integer_beyond_the_int_string_limit_is_not_valid_json(capsys, log_dir):
    # json.loads raises a plain ValueError here, not JSONDecodeError (once a traceback)
    path = log_dir / "train_data_step1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"generation_logprobs": [[', '"generation_logprobs": [[' + "9" * 5000 + ", ", 1)
    path.write_text("".join(lines))
    _fails_with(capsys, log_dir, "train_data_step1.jsonl:2:", "not valid JSON: Exceeds the limit")


def test_skip_bad_rows_counts_and_equals_the_clean_analysis(tmp_path, log_dir, capsys):
    path = log_dir / "train_data_step1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    (clean_dir / "train_data_step1.jsonl").write_text("".join(lines[:2] + lines[4:]))
    (clean_dir / "train_data_step2.jsonl").write_bytes((log_dir / "train_data_step2.jsonl").read_bytes())
    lines[2] = "{not json\n"
    lines[3] = json.dumps({k: v for k, v in json.loads(lines[3]).items() if k != "prev_logprobs"})
    path.write_text("".join(lines[:3]) + lines[3] + "\n" + "".join(lines[4:]))
    code = main(["analyze", str(log_dir), "--no-progress", "--no-plots", "--skip-bad-rows"])
    assert code == 0
    assert "2 bad rows skipped" in capsys.readouterr().out
    skipped = analyze_run(log_dir, tmp_path / "a", skip_bad_rows=True, plots=False)
    clean = analyze_run(clean_dir, tmp_path / "b", plots=False)
    assert skipped.bad_rows == 2
    assert [r["analysis/bad_rows"] for r in skipped.rows] == [2, 0]
    report = (tmp_path / "a" / "report.md").read_text()
    assert "Bad rows skipped: 2 (e.g. `train_data_step1.jsonl:3: not valid JSON" in report
    for got, want in zip(skipped.rows, clean.rows, strict=True):
        for key in want:
            if key.startswith(("ais/", "weights/")):
                assert math.isclose(got[key], want[key], rel_tol=1e-12, abs_tol=1e-15), key


def test_console_script_prints_no_traceback(log_dir):
    (log_dir / "train_data_step1.jsonl").write_text('{"idx": 0}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_ais", "analyze", str(log_dir), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "train_data_step1.jsonl:1: missing key(s)" in proc.stderr


def test_trailing_blank_lines_are_skipped(tmp_path, log_dir):
    clean = analyze_run(log_dir, tmp_path / "clean", plots=False)
    path = log_dir / "train_data_step2.jsonl"
    path.write_bytes(path.read_bytes() + b"\n  \n")
    padded = analyze_run(log_dir, tmp_path / "padded", plots=False)
    assert [r["ais/alpha"] for r in padded.rows] == [r["ais/alpha"] for r in clean.rows]
    assert padded.bad_rows == 0


def test_blank_line_before_a_row_is_named(capsys, log_dir):
    path = log_dir / "train_data_step1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:3], "\n", *lines[3:]]))
    _fails_with(capsys, log_dir, "train_data_step1.jsonl:4:", "empty line")


def test_unexpected_error_in_a_step_is_one_line_naming_the_file(capsys, log_dir, monkeypatch):
    from nemo_ais.analyze import analysis

    def boom(step_file, *args, **kwargs):
        raise RuntimeError("expand(torch.DoubleTensor{[3, 1]}, size=[3]): bad\nsecond line")

    monkeypatch.setattr(analysis, "replay_step", boom)
    err = _fails_with(capsys, log_dir, "train_data_step1.jsonl:0:", "unexpected RuntimeError while analysing")
    assert "second line" not in err


def test_cli_backstop_turns_any_error_into_one_line(capsys, log_dir, monkeypatch):
    import nemo_ais.analyze

    def boom(*args, **kwargs):
        raise AssertionError("internal invariant\ndetails")

    monkeypatch.setattr(nemo_ais.analyze, "analyze_run", boom)
    _fails_with(capsys, log_dir, str(log_dir), "unexpected AssertionError: internal invariant")


def test_ctrl_c_is_one_line_and_exit_130(capsys, log_dir, monkeypatch):
    from nemo_ais.analyze import analysis

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(analysis, "replay_step", interrupted)
    code = main(["analyze", str(log_dir), "--no-plots"])
    err = capsys.readouterr().err
    assert code == 130
    partial = log_dir / "ais_analysis" / "analysis.jsonl.partial"
    assert err == f"nemo-ais analyze: interrupted; the steps analysed so far, if any: {partial}\n"
    assert partial.is_file() and not (partial.parent / "analysis.jsonl").exists()


def test_progress_bar_never_leaks_into_the_error_line(log_dir, tmp_path):
    """Progress on (no --no-progress), stderr a file: exactly the one error line."""
    _edit_row(log_dir / "train_data_step2.jsonl", 5, lambda r: r["prev_logprobs"][0].pop())
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "nemo_ais", "analyze", str(log_dir), "--no-plots"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            timeout=120,
        )
    text = stderr.read_text()
    assert proc.returncode == 1
    assert text.count("\n") == 1 and "\r" not in text, repr(text)
    assert text.startswith("nemo-ais analyze: ") and "train_data_step2.jsonl:5:" in text


def _placeholders(row, where):
    """NeMo-RL's mask_out_neg_inf_logprobs: prev_logprobs 0.0 at valid positions the trainer's top-k/top-p excludes."""
    prev, mask = row["prev_logprobs"][0], row["token_loss_mask"][0]
    valid = [j for j in range(1, len(prev)) if mask[j] == 1 and row["generation_logprobs"][0][j] < 0]
    for j in valid[:2]:
        where.append(j)
        prev[j] = 0.0


def test_top_k_top_p_placeholders_are_left_out_as_nemo_rl_s_loss_leaves_them_out(tmp_path, log_dir):
    """With filtered sampling NeMo-RL writes prev_logprobs = 0.0 where the trainer's filtered distribution excludes
    the sampled token, and its loss gives those tokens ratio 1 and no gradient. Oracle: the same log with those
    positions masked (token_loss_mask 0) gives the same ais/* rows; read as log-probs they inflate the mismatch."""
    path = log_dir / "train_data_step2.jsonl"
    masked = tmp_path / "masked"
    masked.mkdir()
    for name in ("train_data_step1.jsonl", "train_data_step2.jsonl"):
        (masked / name).write_bytes((log_dir / name).read_bytes())
    for line in range(1, 9):
        where: list[int] = []
        _edit_row(path, line, lambda r, w=where: _placeholders(r, w))
        _edit_row(masked / path.name, line, lambda r, w=where: [r["token_loss_mask"][0].__setitem__(j, 0) for j in w])
    naive = analyze_run(log_dir, tmp_path / "naive", plots=False).rows[1]
    got = analyze_run(log_dir, tmp_path / "got", plots=False, filtered_sampling=True).rows[1]
    want = analyze_run(masked, tmp_path / "want", plots=False).rows[1]
    n = got["analysis/filtered_placeholders"]  # 2 a row; rows NeMo-RL masked (sample_loss_mask 0) do not count
    assert 0 < n == naive["ais/n_tok"] - got["ais/n_tok"] and want["analysis/filtered_placeholders"] == 0
    assert {k: v for k, v in got.items() if k.startswith("ais/")} == {
        k: v for k, v in want.items() if k.startswith("ais/")
    }
    assert naive["ais/severity"] > got["ais/severity"]
    report = (tmp_path / "got" / "report.md").read_text()
    assert "**Top-k / top-p sampling**" in report and f"{n} such token(s)" in report


@pytest.mark.parametrize(
    ("generation", "filtered"),
    [
        ({}, False),
        ({"top_k": None, "top_p": 1.0}, False),
        ({"top_k": -1}, False),
        ({"top_k": 50}, True),
        ({"top_p": 0.95}, True),
    ],
)
def test_trains_with_filtered_sampling_reads_the_run_config(tmp_path, generation, filtered):
    from nemo_ais.analyze.analysis import trains_with_filtered_sampling

    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"policy": {"generation": generation}}))
    assert trains_with_filtered_sampling(path) is filtered
