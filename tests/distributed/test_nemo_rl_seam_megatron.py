# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The seam with Megatron-Core's real process groups (4 gloo ranks: CP = 2 x DP = 2; PP = 2 x DP = 2).

``nemo_ais.megatron.get_data_parallel_group()`` after ``initialize_model_parallel`` must be
the group NeMo-RL's Megatron worker sums ``global_valid_toks`` over: context-parallel
siblings hold the same sequences (NeMo-RL replicates the data over CP), so they are NOT
in it -- alpha over the DP group equals the single-process alpha of the DP shards,
with no CP double counting, and each rank runs one all-reduce per global batch on that
group (never WORLD). NeMo-RL's REAL ``nemo_rl.models.megatron.data.process_global_batch``
(v0.7.0 or main, ``--nemo-rl``; ``.cuda()`` is the identity on these CPU ranks) runs on
the same shards with the group NeMo-RL's Megatron worker passes it
(``parallel_state.get_data_parallel_group()``): its ``global_valid_toks`` equal the AIS
statistics' token counts.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _harness import MEGATRON_MARKS, assert_same_bits, count_collectives, run_distributed

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import compute_diagnostics
from nemo_ais.nemo_rl.seam import core_inputs, prepare_global_batches

pytestmark = [*MEGATRON_MARKS, pytest.mark.nemo_rl]  # NeMo-RL's process_global_batch

CONFIG = CorrectionConfig(mode="ais", severity_scale=0.05)
ROWS, SEQ, N_GB = 3, 7, 2


def _shard(dp_rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(77 + dp_rank)
    n = ROWS * N_GB
    gen = -2.0 * torch.rand(n, SEQ, generator=g, dtype=torch.float64) - 0.05
    token_mask = torch.ones(n, SEQ, dtype=torch.int64)
    token_mask[:, 0] = 0
    return {
        "prev_logprobs": gen + 0.25 * torch.randn(n, SEQ, generator=g, dtype=torch.float64),
        "generation_logprobs": gen,
        "token_mask": token_mask,
        "sample_mask": torch.ones(n, dtype=torch.int64),
    }


class _Sink:
    def attach_diagnostics(self, diagnostics):
        self.diagnostics = diagnostics


def _rank_fn(rank, world_size, **parallel):
    """Megatron's groups for ``parallel`` sizes; this rank's prepare step over its DP group."""
    from megatron.core import parallel_state

    from nemo_ais.megatron import get_data_parallel_group, get_data_parallel_world_size, is_pipeline_last_stage

    parallel_state.initialize_model_parallel(**parallel)
    group = get_data_parallel_group()
    dp_rank = parallel_state.get_data_parallel_rank()
    sink = _Sink()
    with count_collectives() as counter:
        prepare_global_batches(_shard(dp_rank), sink, CONFIG, local_batch_size=ROWS, group=group)
    return {
        "upstream_toks": _upstream_valid_toks(_shard(dp_rank), parallel_state),
        "dp_ranks": dist.get_process_group_ranks(group),
        "dp_size": get_data_parallel_world_size(),
        "cp_rank": parallel_state.get_context_parallel_rank(),
        "stage": parallel_state.get_pipeline_model_parallel_rank(),
        "last_stage": is_pipeline_last_stage(),
        "alpha": [d.alpha for d in sink.diagnostics],
        "n_tok": [d.n_tok for d in sink.diagnostics],
        "calls": [(c.name, c.group is group) for c in counter.calls],
    }


# Both layouts of the tests below, in one spawn of 4 ranks (starting 4 processes that import
# Megatron-Core costs far more than the checks): Megatron's groups are torn down in between.
LAYOUTS = {"cp2": {"context_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}}


def _layouts_fn(rank, world_size):
    from megatron.core import parallel_state

    out = {}
    for name, parallel in LAYOUTS.items():
        out[name] = _rank_fn(rank, world_size, **parallel)
        parallel_state.destroy_model_parallel()
    return out


@pytest.fixture(scope="module")
def layouts():
    """``{layout: [result of rank 0, ..., rank 3]}`` for every layout of :data:`LAYOUTS`."""
    per_rank = run_distributed(_layouts_fn, world_size=4, timeout=240)
    return {name: [r[name] for r in per_rank] for name in LAYOUTS}


def _upstream_valid_toks(shard: dict, parallel_state) -> list[float]:
    """``global_valid_toks`` of each global batch from NeMo-RL's own ``process_global_batch``."""
    from _megatron_worker import placeholder_imports
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    with placeholder_imports():  # main's module imports Megatron-Bridge (not on CPU)
        from nemo_rl.models.megatron.data import process_global_batch

    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # CPU rank: .cuda() is the identity
    try:
        return [
            float(
                process_global_batch(
                    BatchedDataDict(shard),
                    loss_fn=None,
                    dp_group=parallel_state.get_data_parallel_group(),  # as upstream's worker
                    batch_idx=g,
                    batch_size=ROWS,
                )["global_valid_toks"]
            )
            for g in range(N_GB)
        ]
    finally:
        torch.Tensor.cuda = cuda


def test_megatron_dp_group_excludes_cp_siblings(layouts):
    results = layouts["cp2"]
    groups = {tuple(r["dp_ranks"]) for r in results}
    assert len(groups) == 2 and all(len(g) == 2 for g in groups)
    assert all(r["dp_size"] == 2 for r in results)
    # CP siblings (same DP group position, different cp rank) are never in one DP group
    for r in results:
        assert len({results[i]["cp_rank"] for i in r["dp_ranks"]}) == 1
    assert_same_bits([{f"gb{g}": a for g, a in enumerate(r["alpha"])} for r in results])
    shards = [_shard(0), _shard(1)]
    for g in range(N_GB):
        rows = slice(g * ROWS, (g + 1) * ROWS)
        full = {k: torch.cat([s[k][rows] for s in shards]) for k in shards[0]}
        x = core_inputs(full, with_loss_terms=False)
        ref = compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, CONFIG)
        assert math.isclose(results[0]["alpha"][g], ref.alpha, rel_tol=1e-12)
        assert results[0]["n_tok"][g] == ref.n_tok  # no CP double counting
    for r in results:  # the group NeMo-RL counts the loss normaliser over
        assert r["upstream_toks"] == r["n_tok"]
        assert r["calls"] == [("all_reduce", True)] * N_GB


LLAMA_PP2 = Path(__file__).resolve().parents[2] / "configs/nemo_rl/llama3.1_8b_2n8g_fp8_pp2.yaml"


def test_pp2_every_stage_all_reduces_over_its_own_dp_group(layouts):
    # the claim of configs/nemo_rl/llama3.1_8b_2n8g_fp8_pp2.yaml's header
    assert "all-reduce over the DP group on EVERY stage" in LLAMA_PP2.read_text()
    # PP = 2 x DP = 2: every rank of both stages prepares (NeMo-RL replicates data over PP)
    results = layouts["pp2"]
    stages = [r["stage"] for r in results]
    assert sorted(stages) == [0, 0, 1, 1]
    assert [r["last_stage"] for r in results] == [s == 1 for s in stages]
    for r in results:  # a DP group never mixes stages ...
        assert {results[i]["stage"] for i in r["dp_ranks"]} == {r["stage"]}
        # ... and every rank, last stage or not, makes the same one all-reduce per global batch
        assert r["calls"] == [("all_reduce", True)] * N_GB
    # both stages see the same shards: alpha bit-identical on all four ranks
    assert_same_bits([{f"gb{g}": a for g, a in enumerate(r["alpha"])} for r in results])
