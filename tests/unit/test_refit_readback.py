# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Issue 27.2: the refit readback, the refit guard that needs no threshold.

A healthy refit reads back exactly (0.0) for every format, KV-cache format and mismatch
dial k; each planted refit bug (``nemo_ais.rollout.faults``) reads back wrong from its
refit on and not before; the oracle is computed here independently (the format's
quantizer on the sent weight, and a fresh calibration of the KV scales).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from planted_refits import three_refits, tiny_qwen

from nemo_ais.alarms import AlarmConfig, AlarmMonitor
from nemo_ais.formats.fp8_block import dequantize_blockwise, quantize_blockwise
from nemo_ais.refit.stream import Fp8SyncConfig, fp8_weight_stream
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.faults import FAULT_ENV
from nemo_ais.rollout.readback import READBACK_FILE, RefitReadback, read_readback, readback_row
from nemo_ais.rollout.twin import RolloutTwin

GATE_UP = r"mlp\.(gate|up)_proj"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen()


def _refits(model):
    return three_refits(model)


IDS = torch.randint(4, 256, (4, 12), generator=torch.Generator().manual_seed(1))


def _readbacks(model, **config) -> list[RefitReadback]:
    twin = RolloutTwin(model, RolloutPrecisionConfig(**config))
    out = []
    for sd in _refits(model):
        twin.sync_weights(sd, calibration_input_ids=IDS)
        out.append(twin.readback)
    return out


@pytest.mark.parametrize(
    ("fmt", "kv", "k"),
    [
        ("fp8", "fp8", 1.0),
        ("fp8", "bf16", 4.0),
        ("mxfp8", "fp8", 1.0),
        ("nvfp4_w4a16", "nvfp4", 1.0),
        ("nvfp4_w4a4", "fp8", 2.0),
    ],
)
def test_a_healthy_refit_reads_back_exactly(qwen, fmt, kv, k):
    for rb in _readbacks(qwen, format=fmt, kv_cache=kv, error_scale=k):
        assert rb.weight_error == 0.0 and rb.weight_module is None
        assert rb.weights_checked == 14  # 2 layers x (q, k, v, o, gate, up, down)
        assert rb.kv_scale_error == (0.0 if kv != "bf16" else None)
        assert rb.exact


def test_fp8_codes_sent_as_is_read_back_exactly(qwen):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="fp8"))
    sd = _refits(qwen)[1]
    stream = list(fp8_weight_stream(sd.items(), Fp8SyncConfig()))
    assert sum(t.dtype == torch.float8_e4m3fn for _, t in stream) == 14
    twin.sync_weights(stream)
    assert twin.readback.weight_error == 0.0 and twin.readback.weights_checked == 14
    assert twin.readback.kv_scale_error is None  # no calibration batch: not checked


def test_verify_refit_false_reads_nothing_back(qwen):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="fp8", verify_refit=False))
    twin.sync_weights(_refits(qwen)[0], calibration_input_ids=IDS)
    assert twin.readback is None


@pytest.mark.parametrize("kind", ["scale_layout", "bf16_layer", "stale_kv_scale"])
def test_each_planted_bug_reads_back_wrong_from_its_refit_on(monkeypatch, qwen, kind):
    monkeypatch.setenv(FAULT_ENV, "1")
    fault = {"kind": kind, "from_refit": 3, "modules": GATE_UP if kind == "bf16_layer" else "."}
    rbs = _readbacks(qwen, format="fp8", kv_cache="fp8", refit_fault=fault)
    assert all(rb.exact for rb in rbs[:2])
    bad = rbs[2]
    sd = _refits(qwen)[2]
    name = "model.layers.0.mlp.gate_proj"  # the first module the plant hits
    w = sd[f"{name}.weight"]
    correct = dequantize_blockwise(*quantize_blockwise(w), (128, 128))  # independent oracle
    if kind == "stale_kv_scale":
        assert bad.weight_error == 0.0
        assert bad.kv_scale_error > 0.1  # K/V x 1.5: the scales moved by a third
        return
    assert bad.kv_scale_error == 0.0
    if kind == "scale_layout":
        s = quantize_blockwise(w)[1]
        held = dequantize_blockwise(quantize_blockwise(w)[0], s.t().reshape(s.shape), (128, 128))
    else:  # the engine runs the sent weight unquantized
        held = w
    held, correct = held.double(), correct.double()
    expected = float((held - correct).abs().max() / correct.abs().max())
    assert bad.weight_error >= expected > 0.0
    assert bad.weight_module is not None


def test_the_alarm_fires_on_any_inexact_readback_and_only_then():
    monitor = AlarmMonitor(AlarmConfig())
    diag = {"empty_batch": 1.0, "token_mult_prob_error": 1.0, "severity": 0.0}
    exact = RefitReadback(0.0, None, 0.0, 14)
    assert monitor.observe(1, diag, readback=exact) == []
    assert monitor.observe(2, diag, readback=RefitReadback(None, None, None, 0)) == []
    (alarm,) = monitor.observe(3, diag, readback=RefitReadback(2e-7, "a.q_proj", 0.0, 14))
    assert alarm.kind == "refit_readback" and "a.q_proj" in alarm.evidence
    (alarm,) = monitor.observe(4, diag, readback=RefitReadback(0.0, None, math.inf, 14))
    assert "KV-cache scales" in alarm.evidence
    loose = AlarmMonitor(AlarmConfig(readback_tol=1e-6))
    assert loose.observe(5, diag, readback=RefitReadback(2e-7, "a.q_proj", 0.0, 14)) == []
    nan = RefitReadback(math.nan, "a.q_proj", None, 14)  # never read as healthy
    assert [a.kind for a in loose.observe(6, diag, readback=nan)] == ["refit_readback"]


def test_a_resumed_run_drops_a_cut_last_readback_row_before_it_appends(tmp_path):
    """A crash mid-write leaves a row without its newline; the resumed run's row must not join it."""
    from nemo_ais.embedded.dist import DistContext
    from nemo_ais.embedded.logs import log_readback

    rows = {3: RefitReadback(0.0, None, 0.0, 14), 4: RefitReadback(0.5, "m", 0.0, 14)}
    path = tmp_path / READBACK_FILE
    path.write_text(readback_row(3, rows[3]) + "\n" + readback_row(4, rows[4])[:17])  # step 4 cut short
    log_readback(DistContext(0, 1, None), tmp_path, 4, rows[4])  # the resumed run's step 4
    assert read_readback(path) == (rows, [])
    log_readback(DistContext(0, 1, None), tmp_path, 5, rows[3])  # a whole last row is kept
    assert read_readback(path) == ({**rows, 5: rows[3]}, [])


def test_the_readback_file_round_trips_and_names_a_bad_line(tmp_path):
    path = tmp_path / READBACK_FILE
    rows = {3: RefitReadback(0.0, None, 0.0, 14), 4: RefitReadback(0.5, "m", math.inf, 14)}
    path.write_text("".join(readback_row(s, r) + "\n" for s, r in rows.items()))
    assert read_readback(path) == (rows, [])
    assert read_readback(tmp_path / "absent.jsonl") == ({}, [])
    path.write_text(readback_row(3, rows[3]) + '\n{"step": "4"}\n')
    got, problems = read_readback(path)
    assert got == {3: rows[3]} and [line for line, _ in problems] == [2]
    assert "int step" in problems[0][1]
    # every field of its type, and a line that is not UTF-8: a bad row each, not a crash later
    good = json.loads(readback_row(4, rows[4]))
    bad = [{**good, "weight_error": "0.5"}, {**good, "weight_error": [0.5]}, {**good, "kv_scale_error": True}]
    bad += [{**good, "weight_module": 3}, {**good, "weights_checked": 1.0}, {**good, "step": True}]
    path.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in bad)
        + b'{"step": 5\xff}\n'
        + readback_row(6, rows[4]).replace('"m"', '"m\\u0000"').encode().replace(b"\\u0000", b"\xff")
        + b"\n"
    )
    got, problems = read_readback(path)
    assert got == {} and [line for line, _ in problems] == list(range(1, len(bad) + 3))  # + a bad byte in a string
