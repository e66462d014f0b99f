# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A correction mode is one record (issue 24, item 4): the readers iterate the registry.

The main test registers a throwaway mode, ``power`` (w_hat = min(rho, C)^exponent, knob
``loss_fn.ais.power.exponent``), in a fresh interpreter BEFORE ``nemo_ais.config`` is
imported, as a new module listed in ``nemo_ais/modes/__init__.py`` would be, and checks that
the config, the weights, the statistics, the diagnostics, the loss, ``analyze``'s replay and
the pre-flight checks take it with no other change.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from nemo_ais.config import CorrectionConfig, CorrectionMode
from nemo_ais.modes import MODES

TESTS = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent(
    """
    import dataclasses
    import math
    import sys

    import torch
    from pydantic import Field

    import nemo_ais.modes as modes
    from nemo_ais.modes import Mode, Replay, log_ratio, where_valid
    from nemo_ais.sections import Section


    class PowerConfig(Section):
        exponent: float = Field(0.5, gt=0.0, le=1.0, description="power: w = min(rho, C)^this.")


    def weight(logp_old, logp_rollout, valid, config, batch_value):
        rho = log_ratio(logp_old, logp_rollout, valid).exp().clamp_(max=config.weight_cap)
        return where_valid(valid, rho.pow_(config.power.exponent))


    modes.MODES["power"] = Mode(
        name="power",
        weight=weight,
        mode_stats=True,
        config=PowerConfig,
        moved_keys={"power_exponent": "exponent"},
        replay=Replay(),
    )

    from nemo_ais.analyze import replay
    from nemo_ais.analyze.reader import find_step_files
    from nemo_ais.config import CorrectionConfig, validate_section
    from nemo_ais.core import clipped_pg_loss, compute_diagnostics, correction_weights
    from nemo_ais.preflight.checks.loss import tbpo_unused_warnings

    # config: the mode, its sub-section, its moved key
    cfg = validate_section(
        CorrectionConfig, {"mode": "power", "power": {"exponent": 0.25}}, "loss_fn.ais"
    )
    try:
        validate_section(CorrectionConfig, {"power_exponent": 0.25}, "loss_fn.ais")
    except ValueError as err:
        assert str(err) == "loss_fn.ais.power_exponent moved: use loss_fn.ais.power.exponent"
    else:
        raise AssertionError("the moved key validated")

    # weights: min(rho, C)^0.25 at valid tokens, 0 elsewhere (C = 2)
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.1
    old = rollout + 0.5 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [0.0] * 5], dtype=torch.float64)
    w = correction_weights(old, rollout, mask, cfg)
    want = (old - rollout).exp().clamp(max=2.0).pow(0.25) * mask
    assert torch.equal(w, want), (w, want)

    # statistics and diagnostics: its own sums (mode_stats) give ais/mode_ess
    d = compute_diagnostics(old, rollout, mask, cfg)
    kept = want[mask == 1]
    ess = kept.sum().item() ** 2 / (kept.numel() * kept.square().sum().item())
    assert math.isclose(d.mode_ess, ess, rel_tol=1e-12), (d.mode_ess, ess)

    # loss: r = 1 (curr = old), so L = -sum_it w_it A_i m_it / N_tok
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    out = clipped_pg_loss(old.clone().requires_grad_(True), old, rollout, adv, mask, cfg)
    want_loss = -(want * adv[:, None]).sum() / mask.sum()
    assert math.isclose(out.loss.item(), want_loss.item(), rel_tol=1e-12)
    # batch_normalize: an importance weight, divided by its global mean
    bn = cfg.model_copy(update={"batch_normalize": True})
    out = clipped_pg_loss(old.clone().requires_grad_(True), old, rollout, adv, mask, bn)
    mean = kept.mean()
    assert math.isclose(out.loss.item(), (want_loss / mean).item(), rel_tol=1e-12)

    # analyze replays it (its record has a replay), the pre-flight has nothing to warn
    assert replay.MODES == ("tis", "icepop", "seq_mask_geo", "ais", "power"), replay.MODES
    step = find_step_files(sys.argv[1])[0]
    result = replay.replay_step(step, cfg)
    assert 0 < result.weights["power"]["mean"] <= 2.0 ** 0.25, result.weights["power"]
    assert tbpo_unused_warnings({"ratio_clip_c": 3.0}, "power") == []

    # a mode whose replay masks tokens gets the report's "would mask" line, like icepop
    modes.MODES["power"] = dataclasses.replace(
        modes.MODES["power"], replay=Replay(affected=modes.masked)
    )
    from nemo_ais.analyze.report import recommendations

    row = {"step": 1, "ais/alpha": 0.5, "ais/ess_seq": 1.0}
    row |= {f"weights/{m}/frac_capped_or_masked": 0.25 for m in replay.MODES}
    lines = recommendations([row], [])
    masking = [line.split()[0] for line in lines if " would mask " in line]
    assert masking == ["icepop", "seq_mask_geo", "power"], lines
    print("ok")
    """
)


def test_a_new_mode_is_one_record(tmp_path):
    sys.path.insert(0, str(TESTS / "unit"))
    try:
        from test_analyze_logs import write_run
    finally:
        sys.path.pop(0)
    write_run(tmp_path, [1])
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_config_offers_exactly_the_registered_modes():
    assert typing.get_args(CorrectionMode) == tuple(MODES)
    sections = {name for name, mode in MODES.items() if mode.config is not None}
    assert sections <= set(CorrectionConfig.model_fields)
    for name in sections:
        assert CorrectionConfig.model_fields[name].annotation is MODES[name].config


@pytest.mark.parametrize("name", list(MODES))
def test_every_record_is_complete(name):
    mode = MODES[name]
    assert mode.name == name
    assert mode.surrogate in ("token", "tbpo")
    assert mode.batch_field in (None, "alpha", "m2po_threshold")
    for old, new in mode.moved_keys.items():
        assert CorrectionConfig.moved_keys[old] == f"{name}.{new}"
        assert new in mode.config.model_fields
