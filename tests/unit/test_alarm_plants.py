# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The refit guard's default thresholds on a short embedded run, healthy and with a planted bug.

A 9-step run of the tiny recipe (quick.yaml, one process), its logs analysed by
``nemo-ais analyze`` with the default :class:`~nemo_ais.alarms.AlarmConfig`: silent on the
healthy run; each refit bug planted at refit 6 (:mod:`nemo_ais.rollout.faults`) is caught
at step 6 by the refit readback (``refit_readback``); a BF16-kept gate/up projection also
moves the mismatch when the trainer's forward runs the rollout's quantization (QaRL), and
lowers it with a plain trainer (no jump to see there: only the readback catches it).
"""

from __future__ import annotations

import pytest
import torch
from embedded_recipes import tiny_recipe

from nemo_ais.alarms import ALARM_KINDS, AlarmConfig
from nemo_ais.analyze import analyze_run
from nemo_ais.rollout.faults import FAULT_ENV

FROM_REFIT = 6
BF16_GATE_UP = (
    f"rollout.quantizer.refit_fault={{kind: bf16_layer, from_refit: {FROM_REFIT}, modules: 'mlp\\.(gate|up)_proj'}}"
)


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(tmp_path, aligned: bool, *extra: str) -> list[dict]:
    """Per-step analysis rows of a 9-step fp8 + FP8-KV run (default alarm thresholds)."""
    tmp_path.mkdir()
    r = tiny_recipe(
        tmp_path,
        "grpo.max_num_steps=9",
        "grpo.val_period=0",
        f"policy.rollout_aligned_quantization={str(aligned).lower()}",
        *extra,
        arm="fp8-none",
    )
    r.train()
    (logs,) = (tmp_path / "logs").iterdir()
    return analyze_run(logs, tmp_path / "an", alarm_config=AlarmConfig(), plots=False).rows


def _alarmed(rows: list[dict]) -> list[int]:
    return [row["step"] for row in rows if row["alarms"]]


def test_default_alarms_catch_a_bf16_kept_layer_at_its_refit_with_a_qarl_trainer(tmp_path):
    healthy = _run(tmp_path / "healthy", True)
    planted = _run(tmp_path / "planted", True, BF16_GATE_UP)
    assert _alarmed(healthy) == []
    assert _alarmed(planted)[0] == FROM_REFIT, planted[FROM_REFIT - 1]["alarms"]
    # steps before the plant are the healthy run's, bit for bit
    for a, b in zip(healthy[: FROM_REFIT - 1], planted[: FROM_REFIT - 1], strict=True):
        assert a["ais/token_mult_prob_error"] == b["ais/token_mult_prob_error"]
    # the aligned trainer matches the rollout but for float32 rounding, which can flip a later FP8 rounding of a few
    # tokens (healthy steps: 1e-7 to 3e-4 here); the BF16-kept layer moves every step after the plant far beyond that
    bad = planted[FROM_REFIT - 1]["ais/token_mult_prob_error"] - 1
    good = max(row["ais/token_mult_prob_error"] - 1 for row in healthy)
    assert bad > 10 * good and bad > 1e-3


def test_a_bf16_kept_layer_is_not_seen_with_a_plain_trainer(tmp_path):
    # the rollout is then closer to the fp32 trainer (test_rollout_faults): no jump to see
    planted = _run(tmp_path / "planted", False, BF16_GATE_UP)
    assert not any(_kinds(row) - {"refit_readback"} for row in planted)


def _kinds(row: dict) -> set[str]:
    return {kind for kind in ALARM_KINDS if row[f"ais_alarm/{kind}"]}


@pytest.mark.parametrize(
    "fault",
    [
        BF16_GATE_UP,
        f"rollout.quantizer.refit_fault={{kind: scale_layout, from_refit: {FROM_REFIT}}}",
        f"rollout.quantizer.refit_fault={{kind: stale_kv_scale, from_refit: {FROM_REFIT}}}",
    ],
    ids=["bf16_layer", "scale_layout", "stale_kv_scale"],
)
def test_the_readback_catches_every_planted_bug_at_its_refit(tmp_path, fault):
    planted = _run(tmp_path / "planted", False, fault)
    readback = [row["step"] for row in planted if "refit_readback" in _kinds(row)]
    assert readback == list(range(FROM_REFIT, 10)), [row["alarms"] for row in planted]
    assert all(not row["alarms"] for row in planted[: FROM_REFIT - 1])
