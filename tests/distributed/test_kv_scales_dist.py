# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""KV-scale calibration on 2 gloo ranks: one all_reduce(MAX), identical scales, raising together."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _harness import assert_same_bits, count_collectives, run_distributed

from nemo_ais.refit.kv_scales import KVScaleCalibrator, KVScaleConfig

pytestmark = pytest.mark.distributed

N_LAYERS = 3


def _observations(rank: int) -> list[tuple[int, str, torch.Tensor]]:
    """What rank ``rank`` sees: different magnitudes per rank; rank 1 never runs layer 2 q."""
    obs = []
    for layer in range(N_LAYERS):
        for j, kind in enumerate("qkv"):
            if rank == 1 and layer == 2 and kind == "q":
                continue  # observed on rank 0 only: the MAX still covers it
            # rank 0 larger on k, rank 1 larger on q/v
            factor = (2.0 if kind == "k" else 1.0) if rank == 0 else (1.0 if kind == "k" else 3.0)
            obs.append((layer, kind, torch.arange(1001.0) * factor * (layer + 1) + j))
    return obs


def _ranks(rank: int, world_size: int, reduction: str) -> dict:
    out = {}
    cal = KVScaleCalibrator(N_LAYERS, KVScaleConfig(reduction=reduction))
    for layer, kind, x in _observations(rank):
        cal.observe(layer, kind, x)
    with count_collectives() as counter:
        scales = cal.compute_scales(group=dist.group.WORLD)
    out["calls"] = [c.name for c in counter.calls]
    out["scales"] = scales.to_vllm()
    out["local"] = cal.compute_scales(group=None).to_vllm() if rank == 0 else None
    # scenario: layer 0 v never observed on any rank -> every rank raises
    missing = KVScaleCalibrator(1)
    for kind in "qk":
        missing.observe(0, kind, torch.ones(4))
    try:
        missing.compute_scales(group=dist.group.WORLD)
        out["missing"] = None
    except ValueError as err:
        out["missing"] = str(err)
    # scenario: a NaN on rank 1 only -> every rank raises
    nan = KVScaleCalibrator(1)
    for kind in "qkv":
        x = torch.ones(4)
        if rank == 1 and kind == "k":
            x[2] = float("nan")
        nan.observe(0, kind, x)
    try:
        nan.compute_scales(group=dist.group.WORLD)
        out["nan"] = None
    except ValueError as err:
        out["nan"] = str(err)
    return out


# rule -> amax of arange(1001) * f + j: max (1000 f + j) or P99.9 at position 999 (999 f + j)
TOP = {"percentile_of_amax": 1000, "element_percentile": 999}


@pytest.mark.parametrize("reduction", sorted(TOP))
def test_two_rank_max_combine(reduction):
    results = run_distributed(_ranks, world_size=2, timeout=120, args=(reduction,))
    for r in results:
        assert r["calls"] == ["all_reduce"], r["calls"]  # exactly one collective
    assert_same_bits([r["scales"] for r in results], "kv scale")
    # oracle: one process observing both ranks' batches (MAX over observations)
    ref = KVScaleCalibrator(N_LAYERS, KVScaleConfig(reduction=reduction))
    for rank in range(2):
        for layer, kind, x in _observations(rank):
            ref.observe(layer, kind, x)
    expected = ref.compute_scales().to_vllm()
    assert results[0]["scales"] == expected
    # the combine is a genuine MAX: k from rank 0 (factor 2), v from rank 1 (factor 3)
    k0 = expected["model.layers.0.self_attn.k_scale"]
    v0 = expected["model.layers.0.self_attn.v_scale"]
    top = TOP[reduction]
    assert k0 == pytest.approx((top * 2 + 1) * 1.05 / 448, rel=1e-12)
    assert v0 == pytest.approx((top * 3 + 2) * 1.05 / 448, rel=1e-12)
    # rank 0 alone (group=None) differs from the global result where rank 1 was larger
    assert results[0]["local"]["model.layers.0.self_attn.v_scale"] < v0
    for r in results:
        assert "no activations observed for 1 layer/kind pair(s) (layer 0 v)" in r["missing"]
        assert "non-finite activations in 1 layer/kind pair(s) (layer 0 k)" in r["nan"]
