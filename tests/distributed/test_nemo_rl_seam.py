# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The NeMo-RL seam's collective pattern on 4 gloo ranks, without NeMo-RL installed.

Drives the code the AIS policy workers run (``nemo_ais.nemo_rl.seam``): the per-global-
batch prepare step (``prepare_global_batches``: local statistics -> ONE all-reduce over
the data-parallel group per global batch -> diagnostics attached to the loss, rows
tagged) followed by a packing-like micro-batch loop of ``loss_from_prepared`` calls
whose count differs per rank. ONE spawn of 4 ranks runs every scenario:

* ``dp4``: one DP group of 4 (a NEW group, not WORLD); 3 global batches per train call;
  NeMo-RL packing layout (``elem_counts_per_gb`` differs per rank and per global batch);
  rank 2 has zero valid tokens everywhere, rank 3 has 0 rows in global batch 1; rank r
  calls the loss once per packed sequence (rank 0: 3 calls, rank 1: 5 calls per global
  batch, ...), then pads with dummy calls on its own rows up to the largest count, as the
  DTensor worker does. EMA state (ema=0.5) advanced once per global batch.
* ``pp``: PP = 2 x DP = 2: DP groups {0, 1} (stage 0) and {2, 3} (stage 1); both stages
  hold the same shards (NeMo-RL replicates data over PP), every rank prepares, only the
  last stage calls the loss.
* ``eval``: ``state=None`` leaves the EMA state untouched.

Checks, against a single-process oracle computed in the parent on the concatenated
global batch (``compute_diagnostics`` / ``clipped_pg_loss`` with ``group=None``):
alpha bit-identical on every rank of a group and equal (<= 1e-12 rel.) to the oracle;
exactly one all_reduce per global batch per rank, on the DP group, none inside loss
calls; the sum of all loss calls over ranks equals the oracle loss of the global batch;
a deadlock fails through the harness timeout.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from _harness import assert_same_bits, count_collectives, run_distributed

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import AISState, clipped_pg_loss, compute_diagnostics
from nemo_ais.nemo_rl.seam import GLOBAL_BATCH_KEY, core_inputs, loss_from_prepared, prepare_global_batches

pytestmark = pytest.mark.distributed

WORLD = 4
SEQ = 9  # S: input length; the loss sees S - 1 = 8 response positions
N_GB = 3
CONFIG = CorrectionConfig(mode="ais", ema=0.5, severity_scale=0.05)
PG = PGLossConfig(reference_policy_kl_penalty=0.01, ratio_clip_c=3.0)
# rows of each global batch per rank (packing: NeMo-RL's elem_counts_per_gb), dp4 scenario
ROWS = {0: [3, 3, 3], 1: [5, 5, 4], 2: [2, 2, 2], 3: [4, 0, 3]}
# rows of each global batch per DP rank, pp scenario (DP = 2)
PP_ROWS = {0: [3, 2, 4], 1: [2, 4, 1]}


def _batch(seed: int, rows: int, all_masked: bool = False) -> dict[str, torch.Tensor]:
    """NeMo-RL-layout rows: [B, S] log-probs/advantages/token_mask, [B] sample_mask."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    gen = -2.5 * torch.rand(rows, SEQ, generator=g, dtype=f64) - 0.05
    prev = gen + 0.2 * torch.randn(rows, SEQ, generator=g, dtype=f64)
    lengths = torch.randint(2, SEQ + 1, (rows,), generator=g)
    token_mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).to(f64)
    token_mask[:, 0] = 0.0  # the prompt position
    sample_mask = (torch.rand(rows, generator=g) > 0.2).to(f64)
    if all_masked:
        sample_mask.zero_()
    return {
        "input_ids": torch.randint(0, 50, (rows, SEQ), generator=g),
        "advantages": torch.randn(rows, 1, generator=g, dtype=f64).expand(rows, SEQ).clone(),
        "prev_logprobs": prev,
        "generation_logprobs": gen,
        "reference_policy_logprobs": prev + 0.1 * torch.randn(rows, SEQ, generator=g, dtype=f64),
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "curr": prev + 0.05 * torch.randn(rows, SEQ, generator=g, dtype=f64),  # pi_theta
    }


def _cat(batches):
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


class PackedShard(dict):
    """A dict of tensors with NeMo-RL's packing metadata (``elem_counts_per_gb``)."""

    def __init__(self, batches):
        super().__init__(_cat(batches))
        self.elem_counts_per_gb = [int(b["sample_mask"].shape[0]) for b in batches]

    def get_batch(self, batch_idx, batch_size=None):
        start = sum(self.elem_counts_per_gb[:batch_idx])
        end = start + self.elem_counts_per_gb[batch_idx]
        return {k: v[start:end] for k, v in self.items()}


def _dp4_shard_batches(rank):
    return [_batch(100 * rank + g, n, all_masked=rank == 2) for g, n in enumerate(ROWS[rank])]


def _pp_shard_batches(dp_rank):
    return [_batch(1000 + 100 * dp_rank + g, n) for g, n in enumerate(PP_ROWS[dp_rank])]


class _Sink:
    def attach_diagnostics(self, diagnostics):
        self.diagnostics = tuple(diagnostics)


def _global_counts(batches_of_gb):
    mask = core_inputs(_cat(batches_of_gb), with_loss_terms=False).mask
    return float(mask.any(dim=-1).sum()), float(mask.sum())  # (valid seqs, valid toks)


def _train_call(data, group, state, all_rank_batches, calls_loss, eval_mode=False):
    """What an AIS worker does in one train(): prepare, then one loss call per row."""
    sink = _Sink()
    with count_collectives() as prep:
        diags = prepare_global_batches(
            data, sink, CONFIG, local_batch_size=1, group=group, state=None if eval_mode else state
        )
    out = {"alpha": [d.alpha for d in diags], "prep": prep.count(), "prep_all_reduce": 0}
    out["prep_all_reduce"] = sum(1 for c in prep.calls if c.name == "all_reduce" and c.group is group)
    losses, calls = [], 0
    with count_collectives() as in_loss:
        for g in range(N_GB):
            if not calls_loss:
                continue
            gvs, gvt = _global_counts([b[g] for b in all_rank_batches])
            rows = data.get_batch(g)
            total = 0.0
            n_rows = rows["sample_mask"].shape[0]
            # DTensor-style padding: every rank makes max-rows calls per global batch,
            # re-using its own rows as dummies (their loss and metrics are discarded)
            n_calls = max(len(b[g]["sample_mask"]) for b in all_rank_batches) if n_rows else 0
            for j in range(n_calls):  # packing: one call per sequence
                i = j % n_rows
                row = {k: v[i : i + 1] for k, v in rows.items()}
                row[GLOBAL_BATCH_KEY] = data[GLOBAL_BATCH_KEY][
                    sum(data.elem_counts_per_gb[:g]) + i : sum(data.elem_counts_per_gb[:g]) + i + 1
                ]
                logp_theta = row["curr"][:, 1:].clone().requires_grad_(True)
                res = loss_from_prepared(
                    logp_theta, row, sink.diagnostics, CONFIG, PG, global_valid_seqs=gvs, global_valid_toks=gvt
                )
                if j < n_rows:
                    total += float(res.loss)
                    calls += 1
            losses.append(total)
    out.update(loss=losses, loss_calls=calls, in_loss=in_loss.count())
    return out


def _rank_fn(rank, world_size):
    torch.set_num_threads(1)
    # --- dp4: one DP group of all 4 ranks, created explicitly (never WORLD) ---------------
    dp4 = dist.new_group(list(range(world_size)))
    all_batches = [_dp4_shard_batches(r) for r in range(world_size)]
    state = AISState()
    dp4_res = _train_call(PackedShard(all_batches[rank]), dp4, state, all_batches, True)
    dp4_res["state"] = state.state_dict()
    eval_res = _train_call(PackedShard(all_batches[rank]), dp4, state, all_batches, False, True)
    eval_res["state"] = state.state_dict()
    # --- pp: stage = rank // 2, dp_rank = rank % 2; DP groups {0,1} and {2,3} --------------
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    stage, dp_rank = divmod(rank, 2)
    pp_batches = [_pp_shard_batches(r) for r in range(2)]
    pp_res = _train_call(PackedShard(pp_batches[dp_rank]), groups[stage], AISState(), pp_batches, stage == 1)
    return {"dp4": dp4_res, "eval": eval_res, "pp": pp_res}


@pytest.fixture(scope="module")
def results():
    return run_distributed(_rank_fn, world_size=WORLD, timeout=120)


def _oracle(all_rank_batches, ema_state=None):
    """Single process: alpha and loss of each concatenated global batch."""
    out = []
    for g in range(N_GB):
        full = _cat([b[g] for b in all_rank_batches])
        x = core_inputs(full)
        diag = compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, CONFIG, state=ema_state)
        loss = clipped_pg_loss(
            full["curr"][:, 1:],
            x.logp_old,
            x.logp_rollout,
            x.adv,
            x.mask,
            CONFIG,
            pg=PG,
            reference_logprobs=x.logp_ref,
            diagnostics=diag,
        ).loss
        out.append((diag.alpha, float(loss)))
    return out


def _close(a, b, rel=1e-12):
    assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-15), (a, b)


def test_dp4_alpha_identical_and_equals_single_process(results):
    per_rank = [{f"gb{g}": a for g, a in enumerate(r["dp4"]["alpha"])} for r in results]
    assert_same_bits(per_rank, "alpha")
    oracle = _oracle([_dp4_shard_batches(r) for r in range(WORLD)], AISState())
    for g, (alpha, _) in enumerate(oracle):
        _close(results[0]["dp4"]["alpha"][g], alpha)
    assert 0.0 < oracle[0][0] < 1.0  # a real mixture, not a clamp bound


def test_dp4_one_all_reduce_per_global_batch_none_in_the_loss(results):
    for r in results:
        assert r["dp4"]["prep"] == N_GB  # nothing else communicates
        assert r["dp4"]["prep_all_reduce"] == N_GB  # ... and it is the DP group's all_reduce
        assert r["dp4"]["in_loss"] == 0
    # uneven loss-call counts (one per packed sequence) did not matter
    assert [r["dp4"]["loss_calls"] for r in results] == [sum(ROWS[r]) for r in range(WORLD)]


def test_dp4_loss_sums_to_single_process_loss(results):
    oracle = _oracle([_dp4_shard_batches(r) for r in range(WORLD)], AISState())
    for g, (_, loss) in enumerate(oracle):
        _close(sum(r["dp4"]["loss"][g] for r in results), loss, rel=1e-10)


def test_ema_state_advanced_once_per_global_batch_and_not_in_eval(results):
    for r in results:
        assert r["dp4"]["state"]["num_updates"] == N_GB
        assert r["eval"]["state"] == r["dp4"]["state"]  # eval_mode: state=None
        assert r["eval"]["prep"] == N_GB
    assert_same_bits([{"a": r["dp4"]["state"]["alpha"]} for r in results], "EMA alpha")


def test_pp_every_stage_prepares_only_last_stage_computes_loss(results):
    oracle = _oracle([_pp_shard_batches(r) for r in range(2)], AISState())
    assert_same_bits([{f"gb{g}": a for g, a in enumerate(r["pp"]["alpha"])} for r in results])
    for r in results:
        assert r["pp"]["prep_all_reduce"] == N_GB
        for g, (alpha, _) in enumerate(oracle):
            _close(r["pp"]["alpha"][g], alpha)
    assert [r["pp"]["loss_calls"] > 0 for r in results] == [False, False, True, True]
    for g, (_, loss) in enumerate(oracle):
        _close(results[2]["pp"]["loss"][g] + results[3]["pp"]["loss"][g], loss, rel=1e-10)
