# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The distributed contract of nemo_ais.core on 2 and 4 gloo ranks (CPU).

Each world size is spawned ONCE (module-scoped fixture); the ranks run every scenario
below and return plain python values; the tests compare them with each other (bit
patterns) and with a single-process oracle computed here, in the parent, on the
concatenated batch (shards concatenated along B, T padded to the max with mask 0).

Uneven shards: different B and T per rank, ragged lengths and fully masked rows, a rank
whose tokens are all masked, and (4 ranks) a rank with B = 0.

Scenarios per rank:
* ``diag``: ``compute_diagnostics(group=WORLD)``, collectives counted.
* ``split``: ``compute_statistics`` (0 collectives) -> ``reduce_statistics`` (1) ->
  ``diagnostics_from_stats`` (0).
* ``local``: ``group=None`` inside an initialized world: local values, 0 collectives.
* ``loss_tok`` / ``loss_seq``: ``clipped_pg_loss`` with the precomputed diagnostics and
  the global valid token / sequence counts (token- and sequence-level loss, dual clip,
  k3 KL penalty): 0 collectives; loss, gradient and metrics returned.
* ``loss_self``: ``clipped_pg_loss(diagnostics=None, group=WORLD)``: 1 collective.
* ``ema``: three global batches with ``ema=0.5`` and an :class:`AISState` per rank.
* ``empty``: every rank's mask all 0 (global batch empty).
* ``bad``: a NaN at a valid position on rank 0 only: every rank must raise together, with
  the same message (the failure path adds ONE ``all_gather_object`` of the error texts;
  more bad-rank cases in ``test_bad_rank_agreement.py``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from _dist_data import Shard, concat_shards, make_shards
from _harness import assert_same_bits, count_collectives, run_distributed

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import (
    STATS_BYTES,
    AISState,
    clipped_pg_loss,
    compute_diagnostics,
    compute_statistics,
    diagnostics_from_stats,
    reduce_statistics,
)

pytestmark = pytest.mark.distributed

SEED = 1234
# (B, T, kind) per rank: uneven B and T, a fully masked rank, a B = 0 rank.
SHARD_SPECS = {
    2: [(3, 7, "ragged"), (2, 4, "all_masked")],
    4: [(3, 7, "ragged"), (0, 5, "ragged"), (4, 3, "all_masked"), (5, 9, "ragged")],
}
EMPTY_SPECS = {
    2: [(2, 3, "all_masked"), (0, 4, "all_masked")],
    4: [(2, 3, "all_masked"), (0, 4, "all_masked"), (1, 1, "all_masked"), (3, 6, "all_masked")],
}
# Constants chosen so that every gate is strictly inside (0, 1) on this data (D ~ 4
# because of the l = +25 / -30 tokens): the comparisons are not vacuous.
CONFIG = CorrectionConfig(severity_scale=4.0, reliability_floor=0.2, variance_tolerance=0.5)
EMA_CONFIG = CorrectionConfig(severity_scale=4.0, seq_weight="product", ema=0.5)
EMA_STEPS = 3
PG = {
    "loss_tok": PGLossConfig(ratio_clip_c=3.0, reference_policy_kl_penalty=0.05),
    "loss_seq": PGLossConfig(ratio_clip_c=3.0, reference_policy_kl_penalty=0.05, token_level_loss=False),
}


def _batch_pg(cfg: CorrectionConfig) -> PGLossConfig:
    """The loss of a batch-statistic config: tbpo's is a mean over sequences (it refuses a token mean)."""
    return PG["loss_seq" if cfg.mode == "tbpo" else "loss_tok"]


# Float64 everywhere; sums over ranks are only re-associated, so 1e-12 relative holds
# with a wide margin (observed ~1e-16). ABS covers quantities that cancel to ~0.
RTOL = 1e-12
ATOL = 1e-13
TIMEOUT_S = 180.0
# issue 17: every batch-level quantity of the other modes (batch_normalize's w_bar, m2po's
# threshold q*, the mode_* telemetry) comes from the same single all-reduce as alpha
BATCH_CONFIGS = {
    "tis_bn": CorrectionConfig(mode="tis", batch_normalize=True),
    "ais_bn": CorrectionConfig(mode="ais", batch_normalize=True, severity_scale=4.0),
    "seq_tis_bn": CorrectionConfig(mode="seq_tis", batch_normalize=True),
    "seq_mis": CorrectionConfig(mode="seq_mis"),
    "kl_rs": CorrectionConfig(mode="kl_rs", kl_rs={"aggregation": "max", "veto_min_ratio": 0.1}),
    "m2po": CorrectionConfig(mode="m2po", m2po={"tau": 0.5}),
    "tbpo_bn": CorrectionConfig(
        mode="tbpo",
        batch_normalize=True,
        seq_weight_cap=1.1,
        tbpo={"clip_low": 0.1, "clip_high": 0.1, "neg_clip_low": 0.05, "neg_clip_high": 0.1},
    ),
}


def _calls(counter) -> list[dict]:
    return [
        {
            "name": c.name,
            "nbytes": c.nbytes,
            "dtypes": [str(d) for d in c.dtypes],
            "op": c.op,
            "group_is_world": c.group is dist.group.WORLD,
        }
        for c in counter.calls
    ]


def _loss_run(x: Shard, diagnostics, pg: PGLossConfig, n_tok, n_seq, group=None, cfg=CONFIG):
    curr = x.curr.clone().requires_grad_(True)
    with count_collectives() as counter:
        out = clipped_pg_loss(
            curr,
            x.prev,
            x.gen,
            x.adv,
            x.mask,
            cfg,
            pg=pg,
            reference_logprobs=x.ref,
            diagnostics=diagnostics,
            group=group,
            global_valid_tokens=n_tok,
            global_valid_seqs=n_seq,
        )
    out.loss.backward()
    return {
        "loss": out.loss.item(),
        "grad": curr.grad.tolist(),
        "metrics": {k: v.item() for k, v in out.metrics.items()},
        "calls": _calls(counter),
    }


def _ema_batches(specs, seed) -> list[list[Shard]]:
    """Shards of EMA_STEPS successive global batches with a growing mismatch."""
    return [make_shards(specs, seed + 1 + step, mismatch=0.1 + 0.2 * step) for step in range(EMA_STEPS)]


def _rank_main(rank: int, world_size: int, specs, empty_specs, seed: int) -> dict:
    """Everything one rank checks; returns python values only."""
    group = dist.group.WORLD
    x = make_shards(specs, seed)[rank]
    res: dict = {"sum_op": str(dist.ReduceOp.SUM)}

    with count_collectives() as counter:
        diag = compute_diagnostics(x.prev, x.gen, x.mask, CONFIG, group=group)
    res["diag"] = {"values": diag.as_dict(), "calls": _calls(counter)}
    # bf16 / fp32 log-probs as the trainer has them: statistics are still float64
    for dtype in (torch.float32, torch.bfloat16):
        d = compute_diagnostics(x.prev.to(dtype), x.gen.to(dtype), x.mask, CONFIG, group=group)
        res[f"diag_{dtype}"] = d.as_dict()

    with count_collectives() as c_local:
        local_stats = compute_statistics(x.prev, x.gen, x.mask, CONFIG)
    with count_collectives() as c_reduce:
        global_stats = reduce_statistics(local_stats, group)
    with count_collectives() as c_diag:
        split = diagnostics_from_stats(global_stats, CONFIG)
    res["split"] = {
        "values": split.as_dict(),
        "calls": [len(c_local), len(c_reduce), len(c_diag)],
        "reduce_calls": _calls(c_reduce),
        "local_vector": local_stats.vector.tolist(),
        "global_vector": global_stats.vector.tolist(),
    }

    with count_collectives() as counter:
        local = compute_diagnostics(x.prev, x.gen, x.mask, CONFIG, group=None)
    res["local"] = {"values": local.as_dict(), "calls": _calls(counter)}

    counts = torch.tensor([x.n_tok, x.n_seq], dtype=torch.float64)
    dist.all_reduce(counts, group=group)  # what the trainer does; not inside the counter
    n_tok, n_seq = counts.tolist()
    for key, pg in PG.items():
        res[key] = _loss_run(x, diag, pg, n_tok, n_seq)
    res["loss_self"] = _loss_run(x, None, PG["loss_tok"], n_tok, n_seq, group=group)
    for mode in ("none", "tis", "icepop", "seq_mask_geo"):  # no alpha: never communicates
        cfg = CorrectionConfig(mode=mode)
        res[f"loss_{mode}"] = _loss_run(x, None, PG["loss_tok"], n_tok, n_seq, group, cfg)

    for name, cfg in BATCH_CONFIGS.items():
        with count_collectives() as counter:
            d = compute_diagnostics(x.prev, x.gen, x.mask, cfg, group=group)
        loss = _loss_run(x, None, _batch_pg(cfg), n_tok, n_seq, group, cfg)
        res[f"batch_{name}"] = {"values": d.as_dict(), "calls": _calls(counter), "loss": loss}

    state = AISState()
    alphas, calls = [], []
    for shards in _ema_batches(specs, seed):
        xs = shards[rank]
        with count_collectives() as counter:
            d = compute_diagnostics(xs.prev, xs.gen, xs.mask, EMA_CONFIG, group=group, state=state)
        alphas.append(d.alpha)
        calls.append(len(counter))
    res["ema"] = {"alphas": alphas, "calls": calls, "state": state.state_dict()}

    e = make_shards(empty_specs, seed)[rank]
    with count_collectives() as counter:
        d_empty = compute_diagnostics(e.prev, e.gen, e.mask, CONFIG, group=group)
    empty_loss = _loss_run(e, d_empty, PG["loss_tok"], 0.0, 0.0)
    res["empty"] = {"values": d_empty.as_dict(), "calls": _calls(counter), "loss": empty_loss}

    bad_prev = x.prev.clone()
    if rank == 0:
        bad_prev[0, 2] = float("nan")  # row 0 is full: a valid position
    with count_collectives() as counter:
        try:
            compute_diagnostics(bad_prev, x.gen, x.mask, CONFIG, group=group)
            raised = None
        except ValueError as err:
            raised = str(err)
    res["bad"] = {"error": raised, "calls": counter.names()}
    return res


@pytest.fixture(scope="module", params=sorted(SHARD_SPECS), ids=lambda n: f"world{n}")
def world(request):
    """(world_size, per-rank results) from one spawn per world size."""
    n = request.param
    results = run_distributed(_rank_main, n, args=(SHARD_SPECS[n], EMPTY_SPECS[n], SEED), timeout=TIMEOUT_S)
    return n, results


def _close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def _assert_dict_close(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: keys {sorted(got)} != {sorted(want)}"
    bad = {k: (got[k], want[k]) for k in want if not _close(got[k], want[k])}
    assert not bad, f"{what}: differs from the single-process oracle (got, want): {bad}"


def _oracle_batch(n: int) -> Shard:
    return concat_shards(make_shards(SHARD_SPECS[n], SEED))


# ---- alpha and every diagnostic ------------------------------------------------------------


def test_shards_are_uneven_as_claimed(world):
    n, _ = world
    shards = make_shards(SHARD_SPECS[n], SEED)
    assert len({tuple(s.mask.shape) for s in shards}) == n  # different B and T per rank
    assert any(s.n_tok == 0 and s.mask.shape[0] > 0 for s in shards)  # all-masked rank
    if n == 4:
        assert any(s.mask.shape[0] == 0 for s in shards)  # B = 0 rank
    assert shards[0].n_tok > 0


def test_diagnostics_bit_identical_across_ranks(world):
    _, results = world
    assert_same_bits([r["diag"]["values"] for r in results], "compute_diagnostics")
    assert_same_bits([r["split"]["values"] for r in results], "diagnostics_from_stats")
    assert_same_bits([dict(enumerate(r["split"]["global_vector"])) for r in results], "reduced statistics")


def test_diagnostics_match_single_process_concatenated_batch(world):
    n, results = world
    g = _oracle_batch(n)
    with count_collectives() as counter:
        oracle = compute_diagnostics(g.prev, g.gen, g.mask, CONFIG, group=None).as_dict()
    assert len(counter) == 0
    # Non-vacuous: every gate strictly inside (0, 1), extreme tokens capped.
    for gate in ("alpha", "g_sev", "g_rel", "g_var"):
        assert 0.0 < oracle[gate] < 1.0, (gate, oracle[gate])
    assert oracle["frac_capped"] > 0 and oracle["empty_batch"] == 0.0
    assert oracle["n_tok"] == sum(s.n_tok for s in make_shards(SHARD_SPECS[n], SEED))
    for r, res in enumerate(results):
        _assert_dict_close(res["diag"]["values"], oracle, f"rank {r} compute_diagnostics")
        _assert_dict_close(res["split"]["values"], oracle, f"rank {r} diagnostics_from_stats")
        assert res["split"]["values"] == res["diag"]["values"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_low_precision_logprobs_same_contract(world, dtype):
    n, results = world
    g = _oracle_batch(n)
    oracle = compute_diagnostics(g.prev.to(dtype), g.gen.to(dtype), g.mask, CONFIG).as_dict()
    assert_same_bits([r[f"diag_{dtype}"] for r in results], f"{dtype} diagnostics")
    for r, res in enumerate(results):
        _assert_dict_close(res[f"diag_{dtype}"], oracle, f"rank {r} {dtype}")


def test_split_api_vector_sums_to_global(world):
    _, results = world
    local = torch.tensor([r["split"]["local_vector"] for r in results], dtype=torch.float64)
    summed = local.sum(dim=0)
    reduced = torch.tensor(results[0]["split"]["global_vector"], dtype=torch.float64)
    torch.testing.assert_close(reduced, summed, rtol=RTOL, atol=0)


# ---- collectives ---------------------------------------------------------------------------


def _assert_one_stats_all_reduce(calls: list[dict], sum_op: str, what: str) -> None:
    assert [c["name"] for c in calls] == ["all_reduce"], f"{what}: collectives {calls}"
    (call,) = calls
    assert call["dtypes"] == ["torch.float64"], f"{what}: {call}"
    assert call["op"] == sum_op, f"{what}: {call}"
    assert call["group_is_world"], f"{what}: ran on another group: {call}"
    assert call["nbytes"] <= 1024, f"{what}: payload {call['nbytes']} B > 1 KiB"  # 568 B: 23 sums + 2 tail histograms
    assert call["nbytes"] == STATS_BYTES, f"{what}: payload {call['nbytes']} != {STATS_BYTES}"


def test_exactly_one_small_all_reduce_per_statistics_computation(world):
    _, results = world
    for r, res in enumerate(results):
        _assert_one_stats_all_reduce(res["diag"]["calls"], res["sum_op"], f"rank {r} diag")
        assert res["split"]["calls"] == [0, 1, 0], f"rank {r}: {res['split']['calls']}"
        _assert_one_stats_all_reduce(res["split"]["reduce_calls"], res["sum_op"], f"rank {r}")
        _assert_one_stats_all_reduce(res["loss_self"]["calls"], res["sum_op"], f"rank {r} loss")
        _assert_one_stats_all_reduce(res["empty"]["calls"], res["sum_op"], f"rank {r} empty")
        assert res["ema"]["calls"] == [1] * EMA_STEPS
        assert res["bad"]["calls"] == ["all_reduce", "all_gather_object"]  # failure path
        # precomputed diagnostics: the loss itself never communicates
        assert res["loss_tok"]["calls"] == [] and res["loss_seq"]["calls"] == []
        assert res["empty"]["loss"]["calls"] == []
        for mode in ("none", "tis", "icepop", "seq_mask_geo"):
            assert res[f"loss_{mode}"]["calls"] == [], f"rank {r}: mode {mode} communicated"


def test_group_none_is_local_and_silent_inside_a_world(world):
    n, results = world
    shards = make_shards(SHARD_SPECS[n], SEED)
    for r, res in enumerate(results):
        assert res["local"]["calls"] == [], f"rank {r}: group=None communicated"
        x = shards[r]
        oracle = compute_diagnostics(x.prev, x.gen, x.mask, CONFIG).as_dict()
        assert res["local"]["values"] == oracle, f"rank {r}: group=None is not the local value"
        assert res["local"]["values"]["n_tok"] == x.n_tok


# ---- loss level ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(PG))
def test_loss_and_gradients_sum_to_single_process(world, key):
    n, results = world
    shards = make_shards(SHARD_SPECS[n], SEED)
    g = concat_shards(shards)
    diag = compute_diagnostics(g.prev, g.gen, g.mask, CONFIG)
    curr = g.curr.clone().requires_grad_(True)
    out = clipped_pg_loss(
        curr, g.prev, g.gen, g.adv, g.mask, CONFIG, pg=PG[key], reference_logprobs=g.ref, diagnostics=diag
    )
    out.loss.backward()
    assert out.loss.item() != 0.0 and curr.grad.abs().sum().item() > 0  # non-vacuous

    total = math.fsum(res[key]["loss"] for res in results)
    assert _close(total, out.loss.item()), f"sum of rank losses {total} != {out.loss.item()}"
    if key == "loss_tok":  # computing the diagnostics inside the loss gives the same loss
        total_self = math.fsum(res["loss_self"]["loss"] for res in results)
        assert _close(total_self, out.loss.item())

    offset = 0
    for r, (res, x) in enumerate(zip(results, shards, strict=True)):
        b, t = x.mask.shape
        want = curr.grad[offset : offset + b, :t]
        got = torch.tensor(res[key]["grad"], dtype=torch.float64).reshape(b, t)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=f"rank {r} grad")
        # Padding of the oracle batch gets no gradient.
        assert curr.grad[offset : offset + b, t:].abs().sum().item() == 0
        offset += b

    summed = {k: math.fsum(res[key]["metrics"][k] for res in results) for k in out.metrics}
    _assert_dict_close(summed, {k: v.item() for k, v in out.metrics.items()}, f"{key} metrics")


@pytest.mark.parametrize("mode", ["none", "tis", "icepop", "seq_mask_geo"])
def test_other_modes_sum_to_single_process(world, mode):
    n, results = world
    g = _oracle_batch(n)
    curr = g.curr.clone().requires_grad_(True)
    want = clipped_pg_loss(
        curr, g.prev, g.gen, g.adv, g.mask, CorrectionConfig(mode=mode), pg=PG["loss_tok"],
        reference_logprobs=g.ref,
    )  # fmt: skip
    want.loss.backward()
    total = math.fsum(res[f"loss_{mode}"]["loss"] for res in results)
    assert _close(total, want.loss.item()), (mode, total, want.loss.item())
    grads = []
    for res, x in zip(results, make_shards(SHARD_SPECS[n], SEED), strict=True):
        b, t = x.mask.shape
        grad = torch.tensor(res[f"loss_{mode}"]["grad"], dtype=torch.float64).reshape(b, t)
        grads.append(torch.nn.functional.pad(grad, (0, g.mask.shape[1] - t)))
    torch.testing.assert_close(torch.cat(grads), curr.grad, rtol=RTOL, atol=ATOL)


def test_ema_state_advances_identically(world):
    n, results = world
    assert_same_bits([dict(enumerate(r["ema"]["alphas"])) for r in results], "EMA alpha")
    state = AISState()
    oracle = []
    for shards in _ema_batches(SHARD_SPECS[n], SEED):
        g = concat_shards(shards)
        oracle.append(compute_diagnostics(g.prev, g.gen, g.mask, EMA_CONFIG, state=state).alpha)
    for r, res in enumerate(results):
        assert all(_close(a, b) for a, b in zip(res["ema"]["alphas"], oracle, strict=True)), (
            r,
            res["ema"]["alphas"],
            oracle,
        )
        assert res["ema"]["state"]["num_updates"] == EMA_STEPS
    assert len(set(oracle)) == EMA_STEPS  # the three steps really differ


# ---- degenerate and bad input --------------------------------------------------------------


def test_globally_empty_batch(world):
    _, results = world
    assert_same_bits([r["empty"]["values"] for r in results], "empty-batch diagnostics")
    values = results[0]["empty"]["values"]
    assert values["alpha"] == 0.0 and values["empty_batch"] == 1.0
    assert values["n_tok"] == 0.0 and values["n_seq"] == 0.0
    assert all(math.isfinite(v) for v in values.values()), values
    for r, res in enumerate(results):
        loss = res["empty"]["loss"]
        assert loss["loss"] == 0.0, f"rank {r}"
        assert all(v == 0.0 for row in loss["grad"] for v in row), f"rank {r}"
        assert all(math.isfinite(v) for v in loss["metrics"].values()), (r, loss["metrics"])
        assert loss["metrics"]["ais/empty_batch"] == 1.0


def test_bad_value_on_one_rank_raises_on_every_rank(world):
    n, results = world
    messages = [r["bad"]["error"] for r in results]
    assert all(m is not None for m in messages), f"ranks that did not raise: {messages}"
    assert len(set(messages)) == 1, f"messages differ across ranks: {messages}"
    # Every rank names the bad rank, the tensor, the count and the first bad index.
    assert f"bad input on 1 of {n} ranks" in messages[0], messages[0]
    assert "rank 0: prev_logprobs: 1 non-finite" in messages[0], messages[0]
    assert "first at index (0, 2)" in messages[0], messages[0]


# ---- batch-level quantities of the other modes (issue 17) -----------------------------------


@pytest.mark.parametrize("name", list(BATCH_CONFIGS))
def test_batch_level_values_identical_on_ranks_and_equal_to_concatenated(world, name):
    n, results = world
    cfg = BATCH_CONFIGS[name]
    values = [r[f"batch_{name}"]["values"] for r in results]
    assert_same_bits(values, f"{name} diagnostics")
    for r in results:
        calls = r[f"batch_{name}"]["calls"]
        assert [c["name"] for c in calls] == ["all_reduce"], (name, calls)
        loss_calls = r[f"batch_{name}"]["loss"]["calls"]  # local weights: no collective
        needs_batch = cfg.mode in ("ais", "m2po") or cfg.batch_normalize
        assert [c["name"] for c in loss_calls] == ["all_reduce"] * needs_batch, (name, loss_calls)
    g = _oracle_batch(n)
    oracle = compute_diagnostics(g.prev, g.gen, g.mask, cfg).as_dict()
    _assert_dict_close(values[0], oracle, f"{name} vs the concatenated batch")
    if cfg.batch_normalize:
        assert oracle["w_norm"] != 1.0  # non-vacuous
    if cfg.mode == "m2po":
        assert 0 < oracle["mode_frac_masked"] < 1 and oracle["m2po_threshold"] < 1e4
    curr = g.curr.clone().requires_grad_(True)
    want = clipped_pg_loss(
        curr, g.prev, g.gen, g.adv, g.mask, cfg, pg=_batch_pg(cfg), reference_logprobs=g.ref,
    )  # fmt: skip
    want.loss.backward()
    total = math.fsum(r[f"batch_{name}"]["loss"]["loss"] for r in results)
    assert _close(total, want.loss.item()), (name, total, want.loss.item())
    grads = []
    for r, x in zip(results, make_shards(SHARD_SPECS[n], SEED), strict=True):
        b, t = x.mask.shape
        grad = torch.tensor(r[f"batch_{name}"]["loss"]["grad"], dtype=torch.float64)
        grads.append(torch.nn.functional.pad(grad.reshape(b, t), (0, g.mask.shape[1] - t)))
    torch.testing.assert_close(torch.cat(grads), curr.grad, rtol=RTOL, atol=ATOL)
