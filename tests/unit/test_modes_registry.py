# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A correction mode is one record (issue 24, item 4): the readers iterate the registry.

The main test registers two throwaway modes in a fresh interpreter BEFORE ``nemo_ais.config``
is imported, as new modules listed in ``nemo_ais/modes/__init__.py`` would be: ``power``
(w_hat = min(rho, C)^exponent, knob ``loss_fn.ais.power.exponent``) and ``trim``, a mode with
a value of its own from the global batch (w_hat = 1[abs(l^c) < b], b = mean abs(l^c), logged
as ``ais/trim_bound``). It checks that the config, the weights, the statistics, the
diagnostics, the metrics, the loss, ``analyze``'s replay and the pre-flight checks take them
with no other change.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from nemo_ais.config import CorrectionConfig, CorrectionMode
from nemo_ais.core import AISDiagnostics
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
    from nemo_ais.modes import BatchStatistic, BatchValue, Mode, Replay, log_ratio, where_valid
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

    def trim_sums(log_rho_c, ok, n_tok):
        return log_rho_c.abs().where(ok, 0.0).sum().reshape(1)


    def trim_weight(logp_old, logp_rollout, valid, config, bound):
        c = config.log_ratio_clamp
        log_rho = log_ratio(logp_old, logp_rollout, valid).clamp_(min=-c, max=c)
        return (valid & (log_rho.abs() < bound)).to(log_rho.dtype)


    modes.MODES["trim"] = Mode(
        name="trim",
        weight=trim_weight,
        importance_weight=False,
        batch_field="trim_bound",
        batch_statistic=BatchStatistic(
            size=1,
            sums=trim_sums,
            values=lambda tail, n_tok, config: {"trim_bound": tail[0] / n_tok},
            new_values=(BatchValue("trim_bound", 1e4, "trim: mean abs(l^c)", "> 0"),),
        ),
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

    # trim: its global-batch value in the diagnostics, the metrics table and the loss's metrics
    from nemo_ais.core import METRICS

    names = [m.name for m in METRICS]
    assert names[names.index("ais/w_norm") + 1 : names.index("ais/mode_frac_masked")] == [
        "ais/m2po_threshold",
        "ais/trim_bound",
    ], names
    tcfg = validate_section(CorrectionConfig, {"mode": "trim"}, "loss_fn.ais")
    d = compute_diagnostics(old, rollout, mask, tcfg)
    ell = (old - rollout).clamp(-20.0, 20.0)[mask == 1]
    bound = ell.abs().sum().item() / ell.numel()
    assert math.isclose(d.trim_bound, bound, rel_tol=1e-12), (d.trim_bound, bound)
    assert d.as_dict()["trim_bound"] == d.trim_bound and d.m2po_threshold == 1e4
    assert compute_diagnostics(old, rollout, mask, cfg).trim_bound == 1e4  # not running: off
    want_t = ((old - rollout).abs() < bound).to(old.dtype) * mask
    assert 0 < want_t.sum() < mask.sum(), want_t  # some tokens trimmed, some kept
    w = correction_weights(old, rollout, mask, tcfg, d.trim_bound)
    assert torch.equal(w, want_t), (w, want_t)
    out = clipped_pg_loss(old.clone().requires_grad_(True), old, rollout, adv, mask, tcfg)
    want_loss = -(want_t * adv[:, None]).sum() / mask.sum()
    assert math.isclose(out.loss.item(), want_loss.item(), rel_tol=1e-12)
    assert out.metrics["ais/trim_bound"].item() == d.trim_bound, out.metrics

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
        [sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_config_offers_exactly_the_registered_modes():
    assert typing.get_args(CorrectionMode) == tuple(MODES)
    sections = {name for name, mode in MODES.items() if mode.config is not None}
    assert sections <= set(CorrectionConfig.model_fields)
    for name in sections:
        assert CorrectionConfig.model_fields[name].annotation is MODES[name].config


def test_every_mode_list_in_the_docs_names_every_mode():
    """A ``mode: ais  # none | tis | ...`` comment in the docs or configs lists all modes."""
    repo = Path(__file__).parents[2]
    files = [repo / "README.md", *repo.glob("docs/*.md"), *repo.glob("configs/**/*.yaml")]
    lists = [
        (f.name, line.split("#", 1)[1].split(";")[0].split())
        for f in files
        for line in f.read_text().splitlines()
        if "mode:" in line and "# none |" in line
    ]
    assert len(lists) >= 3
    for name, words in lists:
        assert [w for w in words if w != "|"] == list(MODES), name


@pytest.mark.parametrize("name", list(MODES))
def test_every_record_is_complete(name):
    mode = MODES[name]
    assert mode.name == name
    assert mode.surrogate in ("token", "tbpo")
    fixed = {f.name for f in dataclasses.fields(AISDiagnostics)} - {"mode_values"}
    own = [v.name for v in mode.batch_statistic.new_values] if mode.batch_statistic else []
    assert mode.batch_field in {None, "alpha", *own}
    assert not fixed & set(own) and len(set(own)) == len(own)  # no value shadows a field
    for old, new in mode.moved_keys.items():
        assert CorrectionConfig.moved_keys[old] == f"{name}.{new}"
        assert new in mode.config.model_fields


@pytest.mark.parametrize(
    ("name", "owner"), [("ess_tok", "AISDiagnostics"), ("alpha", "AISDiagnostics"), ("m2po_threshold", "mode m2po")]
)
def test_a_mode_value_may_not_hide_a_name(monkeypatch, name, owner):
    from nemo_ais.core import diagnostics
    from nemo_ais.modes import BatchStatistic, BatchValue, Mode

    stat = BatchStatistic(1, sums=None, values=None, new_values=(BatchValue(name, 0.0, "", ""),))
    monkeypatch.setitem(MODES, "clash", Mode("clash", weight=None, batch_statistic=stat))
    with pytest.raises(ValueError) as err:
        diagnostics._check_mode_value_names()
    assert str(err.value) == (
        f"mode clash: batch_statistic.new_values name {name!r} is taken by {owner}: "
        "expected a name of its own (it becomes ais/<name>)"
    )
