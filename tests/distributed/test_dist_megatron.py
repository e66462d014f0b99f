# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""AIS statistics over Megatron-Core's data-parallel group (TP=2 x DP=2 on 4 gloo ranks).

megatron-core 0.16.1's ``parallel_state.initialize_model_parallel`` runs on CPU as is
when the default process group is gloo: it only calls ``torch.distributed.new_group``
(which inherits the default backend) and touches ``torch.cuda`` only for SHARP / UCC /
``update_pg_timeout``, none of which is used here. No monkeypatching is needed; we pass
``create_gloo_process_groups=False`` because the default groups are gloo already.

Layout (order ``tp-cp-ep-dp-pp``): TP groups {0,1}, {2,3}; DP groups {0,2}, {1,3}. The two
TP ranks of a DP index hold IDENTICAL log-probs (as after a TP-gathered log-softmax), so
the statistics must be summed over ``get_data_parallel_group()`` only: the result equals
one process on the concatenation of the DP shards. Summing over WORLD counts every
sequence twice. Ratio-form diagnostics (R, D, CV^2, alpha) are invariant under such a
*uniform* duplication, so the damage shows in the reduced vector (exactly x2), in
``n_seq`` / ``n_tok`` and in everything normalised by them (the summable ``ais/*``
metrics use the diagnostics' own counts) -- which is what the test asserts.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.distributed as dist
from _dist_data import concat_shards, make_shards
from _harness import MEGATRON_MARKS, assert_same_bits, count_collectives, run_distributed

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import STATS_BYTES, clipped_pg_loss, compute_diagnostics, compute_statistics

pytestmark = MEGATRON_MARKS

TP, DP = 2, 2
SEED = 77
DP_SPECS = [(3, 7, "ragged"), (4, 5, "ragged")]  # one shard per DP index
CONFIG = CorrectionConfig(severity_scale=4.0, reliability_floor=0.2, variance_tolerance=0.5)
RTOL, ATOL = 1e-12, 1e-13


def _megatron_main(rank: int, world_size: int, specs, seed: int) -> dict:
    warnings.filterwarnings("ignore")  # megatron warns about missing TE / Apex on CPU
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    try:
        dp_group = parallel_state.get_data_parallel_group()
        dp_rank = parallel_state.get_data_parallel_rank()
        x = make_shards(specs, seed)[dp_rank]  # TP peers: same DP index, same data

        with count_collectives() as counter:
            d_dp = compute_diagnostics(x.prev, x.gen, x.mask, CONFIG, group=dp_group)
        calls = [
            {"name": c.name, "nbytes": c.nbytes, "ranks": dist.get_process_group_ranks(c.group)} for c in counter.calls
        ]
        d_world = compute_diagnostics(x.prev, x.gen, x.mask, CONFIG, group=dist.group.WORLD)

        local = compute_statistics(x.prev, x.gen, x.mask, CONFIG).vector
        v_dp, v_world = local.clone(), local.clone()
        dist.all_reduce(v_dp, group=dp_group)
        dist.all_reduce(v_world)

        n_tok = torch.tensor(float(x.n_tok), dtype=torch.float64)
        dist.all_reduce(n_tok, group=dp_group)  # the trainer's global_valid_tokens
        losses = {}
        for name, diag in (("dp", d_dp), ("world", d_world)):
            out = clipped_pg_loss(
                x.curr, x.prev, x.gen, x.adv, x.mask, CONFIG,
                diagnostics=diag, global_valid_tokens=n_tok,
            )  # fmt: skip
            losses[name] = {"loss": out.loss.item(), "n_tok": out.metrics["ais/n_tok"].item()}
        return {
            "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
            "dp_rank": dp_rank,
            "dp_ranks": dist.get_process_group_ranks(dp_group),
            "tp_ranks": dist.get_process_group_ranks(parallel_state.get_tensor_model_parallel_group()),
            "calls": calls,
            "d_dp": d_dp.as_dict(),
            "d_world": d_world.as_dict(),
            "local": local.tolist(),
            "v_dp": v_dp.tolist(),
            "v_world": v_world.tolist(),
            "losses": losses,
        }
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def results():
    return run_distributed(_megatron_main, TP * DP, args=(DP_SPECS, SEED), timeout=300)


def test_layout_and_tp_peers_hold_identical_data(results):
    assert [r["dp_ranks"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["tp_ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["dp_rank"] for r in results] == [0, 0, 1, 1]
    for a, b in ((0, 1), (2, 3)):  # TP peers
        assert results[a]["local"] == results[b]["local"]
    assert results[0]["local"] != results[2]["local"]


def test_dp_group_reduction_matches_single_process_over_dp_shards(results):
    shards = make_shards(DP_SPECS, SEED)
    g = concat_shards(shards)
    oracle = compute_diagnostics(g.prev, g.gen, g.mask, CONFIG).as_dict()
    assert 0.0 < oracle["alpha"] < 1.0 and oracle["n_tok"] == sum(s.n_tok for s in shards)
    assert_same_bits([r["d_dp"] for r in results], "DP-reduced diagnostics")
    for r, res in enumerate(results):
        bad = {
            k: (res["d_dp"][k], v)
            for k, v in oracle.items()
            if not math.isclose(res["d_dp"][k], v, rel_tol=RTOL, abs_tol=ATOL)
        }
        assert not bad, f"rank {r}: DP-reduced diagnostics differ from the oracle: {bad}"
        assert res["calls"] == [{"name": "all_reduce", "nbytes": STATS_BYTES, "ranks": res["dp_ranks"]}]
        assert STATS_BYTES <= 1024  # 568 B: 23 sums and the two tail histograms


def test_loss_summed_over_dp_ranks_matches_single_process(results):
    g = concat_shards(make_shards(DP_SPECS, SEED))
    diag = compute_diagnostics(g.prev, g.gen, g.mask, CONFIG)
    want = clipped_pg_loss(g.curr, g.prev, g.gen, g.adv, g.mask, CONFIG, diagnostics=diag)
    # One TP rank per DP index contributes (TP peers compute the same partial loss).
    for tp in (0, 1):
        ranks = [r for r, res in enumerate(results) if res["tp_rank"] == tp]
        total = math.fsum(results[r]["losses"]["dp"]["loss"] for r in ranks)
        assert math.isclose(total, want.loss.item(), rel_tol=RTOL, abs_tol=ATOL)
        n_tok = math.fsum(results[r]["losses"]["dp"]["n_tok"] for r in ranks)
        assert math.isclose(n_tok, want.metrics["ais/n_tok"].item(), rel_tol=RTOL)


def test_world_reduction_double_counts_tp_replicas(results):
    shards = make_shards(DP_SPECS, SEED)
    true_n_tok = sum(s.n_tok for s in shards)
    true_n_seq = sum(s.n_seq for s in shards)
    for res in results:
        v_dp = torch.tensor(res["v_dp"], dtype=torch.float64)
        v_world = torch.tensor(res["v_world"], dtype=torch.float64)
        torch.testing.assert_close(v_world, 2 * v_dp, rtol=RTOL, atol=0)
        assert res["d_dp"]["n_tok"] == true_n_tok and res["d_dp"]["n_seq"] == true_n_seq
        # The WRONG answer: every TP replica counted again.
        assert res["d_world"]["n_tok"] == TP * true_n_tok != res["d_dp"]["n_tok"]
        assert res["d_world"]["n_seq"] == TP * true_n_seq != res["d_dp"]["n_seq"]
        assert res["d_world"] != res["d_dp"]
        # ...and the summable ais/n_tok metric of the loss is off by the TP factor.
        assert res["losses"]["world"]["n_tok"] == pytest.approx(TP * res["losses"]["dp"]["n_tok"], rel=RTOL)
        # Ratio-form diagnostics are invariant under uniform duplication (see module doc).
        assert math.isclose(res["d_world"]["alpha"], res["d_dp"]["alpha"], rel_tol=1e-12)
