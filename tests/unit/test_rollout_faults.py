# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The planted refit bugs of the refit-guard calibration (``nemo_ais.rollout.faults``).

The field is refused without its environment variable; unset (or before ``from_refit``)
the twin computes exactly what a twin without it does; each kind changes what the twin
computes from ``from_refit`` on, to its oracle: ``scale_layout`` = the healthy codes with
the transposed scale layout, ``bf16_layer`` = a twin that keeps those linears unquantized,
``stale_kv_scale`` = the previous refit's KV scales.
"""

from __future__ import annotations

import copy

import pytest
import torch
from planted_refits import three_refits, tiny_qwen

from nemo_ais.embedded.config import CONFIG_DIR, load_config
from nemo_ais.formats.fp8_block import dequantize_blockwise
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.faults import FAULT_ENV, RefitFault
from nemo_ais.rollout.twin import RolloutTwin, score_responses

GATE_UP = r"mlp\.(gate|up)_proj"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1")


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen()


def _refits(model):
    return three_refits(model)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 256, (4, 12), generator=g)
    return ids, torch.ones_like(ids), torch.randint(4, 256, (4, 6), generator=g)


def _run(model, config):
    """The twin's teacher-forced log-probs after each of the three refits."""
    twin = RolloutTwin(model, config)
    ids, mask, resp = _batch()
    out = []
    for sd in _refits(model):
        twin.sync_weights(sd, calibration_input_ids=ids)
        out.append(twin.score(ids, mask, resp))
    return twin, out


def _cfg(fault=None, **kw):
    kw.setdefault("kv_cache", "fp8")
    return RolloutPrecisionConfig(format="fp8", refit_fault=fault, **kw)


def test_the_fault_is_refused_without_its_environment_variable(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert RolloutPrecisionConfig().refit_fault is None
    with pytest.raises(ValueError, match=f"{FAULT_ENV}=1"):
        RolloutPrecisionConfig(refit_fault={"kind": "bf16_layer", "from_refit": 3})
    monkeypatch.setenv(FAULT_ENV, "true")  # only "1" enables it
    with pytest.raises(ValueError, match="refit-guard tests and benchmarks only"):
        RolloutPrecisionConfig(refit_fault={"kind": "bf16_layer", "from_refit": 3})
    # the embedded recipe's path: rollout.quantizer.refit_fault
    monkeypatch.delenv(FAULT_ENV)
    with pytest.raises(ValueError, match=r"rollout\.quantizer\.refit_fault\.kind=.*" + FAULT_ENV):
        load_config(CONFIG_DIR / "quick.yaml", ["rollout.quantizer.refit_fault={kind: stale_kv_scale, from_refit: 3}"])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"kind": "scale_layout", "from_refit": 1}, "from_refit"),
        ({"kind": "scale_layout", "from_refit": "3"}, "from_refit"),
        ({"kind": "transpose", "from_refit": 3}, "kind"),
        ({"kind": "bf16_layer", "from_refit": 3, "modules": "(gate"}, r"modules: '\(gate' is not a valid regex"),
        ({"kind": "bf16_layer", "from_refit": 3, "layer": 1}, "layer"),
        ({"kind": "bf16_layer"}, "from_refit"),
    ],
)
def test_the_fault_fields_are_validated(allowed, data, match):
    with pytest.raises(ValueError, match=match):
        RefitFault(**data)


def test_a_fault_without_a_target_is_refused_when_the_twin_is_built(allowed, qwen):
    with pytest.raises(ValueError, match="matches no Fp8Linear"):
        RolloutTwin(qwen, _cfg({"kind": "scale_layout", "from_refit": 2, "modules": "lm_head"}))
    with pytest.raises(ValueError, match="needs a quantized KV cache"):
        RolloutTwin(qwen, _cfg({"kind": "stale_kv_scale", "from_refit": 2}, kv_cache="bf16"))


@pytest.mark.parametrize("kind", ["scale_layout", "bf16_layer", "stale_kv_scale"])
def test_each_fault_changes_the_twin_from_its_refit_on_and_nothing_before(allowed, qwen, kind):
    _, healthy = _run(qwen, _cfg())
    fault = {"kind": kind, "from_refit": 3, "modules": GATE_UP if kind == "bf16_layer" else "."}
    _, planted = _run(qwen, _cfg(fault))
    # refits 1 and 2 are healthy: bit-identical to the twin without the field
    assert torch.equal(planted[0], healthy[0]) and torch.equal(planted[1], healthy[1])
    gap = (planted[2] - healthy[2]).abs().max()
    assert gap > 1e-4, gap


def test_scale_layout_dequantizes_the_codes_with_the_transposed_scale_grid(allowed, qwen):
    healthy, _ = _run(qwen, _cfg())
    planted, _ = _run(qwen, _cfg({"kind": "scale_layout", "from_refit": 3}))
    for name in healthy.quantized_module_names:
        good, bad = healthy.model.get_submodule(name), planted.model.get_submodule(name)
        s = good.weight_scale_inv
        assert torch.equal(bad.weight, good.weight)  # the codes are right
        assert torch.equal(bad.weight_scale_inv, s.t().reshape(s.shape))
        expected = dequantize_blockwise(good.weight, s.t().reshape(s.shape), (128, 128))
        torch.testing.assert_close(bad.weight_dequant, expected, rtol=0, atol=0)
        if s.shape[0] == s.shape[1]:  # a square grid: a transpose, off-diagonal tiles swapped
            assert not torch.equal(bad.weight_scale_inv, s)


def test_bf16_layer_computes_what_a_twin_keeping_those_linears_computes(allowed, qwen):
    _, planted = _run(qwen, _cfg({"kind": "bf16_layer", "from_refit": 3, "modules": GATE_UP}))
    _, kept = _run(qwen, _cfg(keep_patterns=(GATE_UP,)))
    # the oracle: the same linears excluded by the keep rule (nn.Linear in fp32)
    torch.testing.assert_close(planted[2], kept[2], rtol=0, atol=2e-6)
    assert not torch.allclose(planted[1], kept[1], rtol=0, atol=1e-4)  # quantized before
    # with an unquantized trainer the planted rollout is CLOSER to it: the mismatch falls
    _, healthy = _run(qwen, _cfg())
    ids, mask, resp = _batch()
    model = copy.deepcopy(qwen)
    model.load_state_dict(_refits(qwen)[2])  # the weights of refit 3
    with torch.no_grad():
        trainer = score_responses(model, ids, mask, resp)
    gap = lambda logp: float((trainer - logp).abs().mean())  # noqa: E731
    assert gap(planted[2]) < gap(healthy[2])


def test_stale_kv_scale_keeps_the_previous_refits_scales(allowed, qwen):
    healthy = RolloutTwin(qwen, _cfg())
    planted = RolloutTwin(qwen, _cfg({"kind": "stale_kv_scale", "from_refit": 3}))
    ids, _, _ = _batch()
    scales = []
    for sd in _refits(qwen):
        healthy.sync_weights(sd, calibration_input_ids=ids)
        planted.sync_weights(sd, calibration_input_ids=ids)
        scales.append(healthy.kv_scales.scale.clone())
    assert torch.equal(planted.kv_scales.scale, scales[1])  # not recalibrated at refit 3
    assert not torch.allclose(scales[2][:, 1:], scales[1][:, 1:])  # K/V x 1.5 moved them


def test_the_twin_is_what_the_injector_types_it_as(qwen):
    # the injector names the twin by a Protocol (an import would close a circle): keep them equal
    from nemo_ais.rollout.faults import _Twin

    assert isinstance(RolloutTwin(qwen, RolloutPrecisionConfig(format="fp8")), _Twin)
