# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Bad input on ONE data-parallel rank: every rank raises the same error, nobody hangs.

Issue 11, defect 7. A shape / dtype / key / value error found on one rank before the
statistics all-reduce used to be raised on that rank alone, leaving its peers blocked in
``all_reduce`` until the process group timed out. The contract checked here:

* every rank raises ``ValueError`` with the SAME message, which names the bad rank, the
  field (tensor or NeMo-RL key) and the expected form;
* every rank raises within ``RAISE_WITHIN_S`` seconds, measured inside the rank from a
  barrier to the exception;
* the bad rank stays alive after raising (it catches the error, as a Ray actor survives
  a failed method call) and so do its peers: a further small all-reduce completes on
  every rank, so the group is in step (no rank is left inside a collective, no
  collective pairs with the wrong one);
* every rank makes the same collectives on the failure path.

One spawn per world size runs every scenario (ranks are expensive on a 2-core box). The
harness timeout bounds the run, so a hang fails the test instead of blocking it.

* world 2, bad rank 1: core ``compute_diagnostics`` (shape, dtype, NaN, +inf, mask value),
  core ``clipped_pg_loss(group=...)`` (advantages shape, NaN advantages, NaN current
  log-probs), and the NeMo-RL seam ``prepare_global_batches`` on upstream's real
  ``BatchedDataDict`` (missing ``generation_logprobs``, missing ``sample_mask``,
  ``token_mask`` shape, integer ``prev_logprobs``, NaN ``generation_logprobs`` in global
  batch 1, NaN ``advantages`` and -inf ``reference_policy_logprobs``, which only the loss
  reads, a shard that fails to split into global batches).
* world 4, uneven shards, rank 1 with B = 0 (core) / no valid sample (seam): bad rank 2
  (missing key, NaN), and two bad ranks at once (2 and 3, different errors).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from _dist_data import make_shards
from _harness import count_collectives, run_distributed
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import clipped_pg_loss, compute_diagnostics
from nemo_ais.nemo_rl.seam import prepare_global_batches

pytestmark = pytest.mark.distributed

SEED = 4321
CONFIG = CorrectionConfig()
RAISE_WITHIN_S = 5.0
TIMEOUT_S = 180.0  # process start on a loaded 2-core box included; a hang fails here
# (B, T, kind) per rank; every bad rank has valid tokens (row 0 full) so a NaN counts.
SPECS = {
    2: [(3, 7, "ragged"), (2, 4, "ragged")],
    4: [(3, 7, "ragged"), (0, 5, "ragged"), (4, 6, "ragged"), (5, 9, "ragged")],
}
SEQ = 6  # NeMo-RL S of the seam scenarios (the loss sees S - 1 positions)
GB_ROWS = 2  # rows of one global batch on each rank
N_GB = 2


# ---- bad inputs, one function per scenario: (prev, gen, mask) -> (prev, gen, mask) ----------


def _shape(prev, gen, mask):
    return prev, gen[:, :-1], mask


def _dtype(prev, gen, mask):
    return prev, gen.to(torch.int64), mask


def _nan(prev, gen, mask):
    gen = gen.clone()
    gen[0, 2] = float("nan")  # row 0 is full: a valid position
    return prev, gen, mask


def _inf(prev, gen, mask):
    prev = prev.clone()
    prev[0, 1] = float("inf")
    return prev, gen, mask


def _mask_value(prev, gen, mask):
    mask = mask.clone()
    mask[0, 0] = 0.5
    return prev, gen, mask


CORE_CASES = {"shape": _shape, "dtype": _dtype, "nan": _nan, "inf": _inf, "mask": _mask_value}


# ---- NeMo-RL seam inputs (upstream's BatchedDataDict) ------------------------------------------


def _nemo_rl_shard(rank: int, no_valid_sample: bool = False) -> BatchedDataDict:
    """This rank's NeMo-RL training shard: N_GB global batches of GB_ROWS rows."""
    g = torch.Generator().manual_seed(SEED + rank)
    rows = N_GB * GB_ROWS
    gen = -2.0 * torch.rand(rows, SEQ, generator=g) - 0.05
    token_mask = torch.ones(rows, SEQ, dtype=torch.int64)
    token_mask[:, 0] = 0  # the prompt position
    sample_mask = torch.zeros(rows) if no_valid_sample else torch.ones(rows)
    return BatchedDataDict(
        {
            "input_ids": torch.randint(0, 50, (rows, SEQ), generator=g),
            "advantages": torch.randn(rows, SEQ, generator=g),
            "prev_logprobs": gen + 0.2 * torch.randn(rows, SEQ, generator=g),
            "generation_logprobs": gen,
            "token_mask": token_mask,
            "sample_mask": sample_mask,
        }
    )


def _drop_generation_logprobs(data):
    del data["generation_logprobs"]


def _drop_sample_mask(data):
    del data["sample_mask"]


def _short_token_mask(data):
    data["token_mask"] = data["token_mask"][:, :-1]


def _integer_prev_logprobs(data):
    data["prev_logprobs"] = data["prev_logprobs"].to(torch.int64)


def _nan_generation_logprobs(data):
    data["generation_logprobs"][GB_ROWS, 3] = float("nan")  # global batch 1, valid position


def _nan_advantages(data):
    data["advantages"][GB_ROWS + 1, 4] = float("nan")  # global batch 1, row 1: a valid token


def _inf_reference_logprobs(data):
    data["reference_policy_logprobs"] = data["prev_logprobs"].clone()
    data["reference_policy_logprobs"][0, 5] = float("-inf")


def _failing_split(data, local_batch_size):
    raise ValueError("get_batch: expected 2 global batches in this shard, found 3 (a split error)")


SEAM_CASES = {
    "seam_missing_key": _drop_generation_logprobs,
    "seam_missing_sample_mask": _drop_sample_mask,
    "seam_shape": _short_token_mask,
    "seam_dtype": _integer_prev_logprobs,
    "seam_nan": _nan_generation_logprobs,
    # keys only the loss reads: checked before the all-reduce, not in one rank's loss call
    "seam_nan_advantages": _nan_advantages,
    "seam_inf_reference": _inf_reference_logprobs,
}

# scenario -> fragments every rank's message must contain (besides "rank <bad>")
EXPECT = {
    "shape": ["generation_logprobs: got [2, 3] float64", "expected [2, 4] float64"],
    "dtype": ["generation_logprobs: got [2, 4] int64", "expected a floating tensor [2, 4]"],
    "nan": ["generation_logprobs: 1 non-finite", "first at index (0, 2)", "expected finite"],
    "inf": ["prev_logprobs: 1 non-finite", "first at index (0, 1)", "expected finite"],
    "mask": ["mask: 1 values not in {0, 1}", "first at index (0, 0)", "expected token_mask"],
    "loss_shape": ["advantages: got [1]", "expected [2, 4] or [2]"],
    # the seam names the global batch where the ranks stopped (all of them, together)
    "seam_missing_key": ["global batch 0: ", "generation_logprobs: missing", "a [B, S] tensor"],
    "seam_missing_sample_mask": ["global batch 0: ", "sample_mask: missing", "a [B] tensor"],
    "seam_shape": ["global batch 0: ", "token_mask: got [2, 5]", "expected [2, 6] like prev"],
    "seam_dtype": ["global batch 0: ", "prev_logprobs: got [2, 5] int64", "a floating tensor"],
    "seam_nan": ["global batch 1: ", "generation_logprobs: 1 non-finite", "index (0, 2)"],
    # NeMo-RL's key and index ([B, S]), the summary's count of values
    "seam_nan_advantages": [
        "global batch 1: ",
        "1 non-finite input value(s)",
        "advantages: 1 non-finite",
        "first at index (1, 4)",
    ],
    "seam_inf_reference": ["global batch 0: ", "reference_policy_logprobs: 1 non-finite", "(0, 5)"],
    "loss_nan_advantages": ["1 non-finite input value(s)", "advantages: 1 non-finite", "(0,)"],
    "loss_nan_curr": ["curr_logprobs: 1 non-finite", "first at index (0, 3)"],
    # the bad rank cannot split its shard: it joins global batch 0's all-reduce, flagged
    "seam_split": ["global batch 0: ", "get_batch: expected 2 global batches", "found 3"],
}


class _Sink:
    def attach_diagnostics(self, diagnostics):
        self.diagnostics = tuple(diagnostics)


def _attempt(call) -> dict:
    """Run ``call`` between a barrier and the exception; then prove the group is in step."""
    dist.barrier()
    with count_collectives() as counter:
        start = time.perf_counter()
        try:
            call()
            error = None
        except Exception as err:  # the rank stays alive, as a Ray actor does
            error = (type(err).__name__, str(err))
        elapsed = time.perf_counter() - start
    alive = torch.ones(1, dtype=torch.float64)
    dist.all_reduce(alive)  # every rank must get here, in step, after the error
    return {"error": error, "elapsed_s": elapsed, "alive": alive.item(), "calls": counter.names()}


def _core_call(rank, bad_ranks, x, case):
    prev, gen, mask = x.prev, x.gen, x.mask
    if rank in bad_ranks:
        prev, gen, mask = case(prev, gen, mask)
    return lambda: compute_diagnostics(prev, gen, mask, CONFIG, group=dist.group.WORLD)


def _loss_call(rank, bad_ranks, x, bad="shape"):
    adv, curr = x.adv.clone(), x.curr.clone()
    if rank in bad_ranks and bad == "shape":
        adv = adv[:1]
    elif rank in bad_ranks and bad == "advantages":  # [B]: row 0 has valid tokens
        adv[0] = float("nan")
    elif rank in bad_ranks:  # a valid position (row 0 is full)
        curr[0, 3] = float("nan")
    curr.requires_grad_(True)
    return lambda: clipped_pg_loss(curr, x.prev, x.gen, adv, x.mask, CONFIG, group=dist.group.WORLD)


def _seam_call(rank, bad_ranks, case, no_valid_sample=False):
    data = _nemo_rl_shard(rank, no_valid_sample)
    split = {}
    if rank in bad_ranks and case is _failing_split:
        split = {"split": _failing_split}
    elif rank in bad_ranks:
        case(data)
    return lambda: prepare_global_batches(
        data,
        _Sink(),
        CONFIG,
        local_batch_size=GB_ROWS,
        group=dist.group.WORLD,
        loss_keys=("advantages", "reference_policy_logprobs"),
        **split,
    )


def _rank_main_2(rank: int, world_size: int) -> dict:
    bad = {1}
    x = make_shards(SPECS[world_size], SEED)[rank]
    out = {name: _attempt(_core_call(rank, bad, x, case)) for name, case in CORE_CASES.items()}
    out["loss_shape"] = _attempt(_loss_call(rank, bad, x))
    out["loss_nan_advantages"] = _attempt(_loss_call(rank, bad, x, "advantages"))
    out["loss_nan_curr"] = _attempt(_loss_call(rank, bad, x, "curr"))
    for name, case in SEAM_CASES.items():
        out[name] = _attempt(_seam_call(rank, bad, case))
    out["seam_split"] = _attempt(_seam_call(rank, bad, _failing_split))
    out["clean"] = _attempt(_core_call(rank, set(), x, None))  # the group still works
    return out


def _rank_main_4(rank: int, world_size: int) -> dict:
    x = make_shards(SPECS[world_size], SEED)[rank]
    empty = rank == 1  # B = 0 (core) / no valid sample (seam)
    return {
        "nan": _attempt(_core_call(rank, {2}, x, _nan)),
        "seam_missing_key": _attempt(_seam_call(rank, {2}, _drop_generation_logprobs, empty)),
        "two_bad": _attempt(_core_call(rank, {2}, x, _shape) if rank != 3 else _core_call(3, {3}, x, _nan)),
        "clean": _attempt(_core_call(rank, set(), x, None)),
    }


@pytest.fixture(scope="module")
def two_ranks():
    """Per-rank results of every 2-rank scenario (one spawn)."""
    return run_distributed(_rank_main_2, 2, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def four_ranks():
    """Per-rank results of every 4-rank scenario (one spawn)."""
    return run_distributed(_rank_main_4, 4, timeout=TIMEOUT_S)


def _check_agreement(results: list[dict], name: str, bad_ranks: list[int], expect: list[str]):
    per_rank = [r[name] for r in results]
    errors = [p["error"] for p in per_rank]
    assert all(e is not None for e in errors), f"{name}: ranks that did not raise: {errors}"
    assert {e[0] for e in errors} == {"ValueError"}, f"{name}: {errors}"
    messages = [e[1] for e in errors]
    assert len(set(messages)) == 1, f"{name}: messages differ across ranks:\n" + "\n".join(messages)
    message = messages[0]
    for rank in bad_ranks:
        assert f"rank {rank}:" in message, f"{name}: bad rank {rank} not named: {message}"
    for fragment in expect:
        assert fragment in message, f"{name}: {fragment!r} missing from: {message}"
    slow = {r: p["elapsed_s"] for r, p in enumerate(per_rank) if p["elapsed_s"] > RAISE_WITHIN_S}
    assert not slow, f"{name}: ranks raised after more than {RAISE_WITHIN_S} s: {slow}"
    assert all(p["alive"] == len(results) for p in per_rank), f"{name}: {per_rank}"
    assert len({tuple(p["calls"]) for p in per_rank}) == 1, f"{name}: collectives differ"
    # one flagged statistics all-reduce, then the error texts (failure path only)
    assert per_rank[0]["calls"][0] == "all_reduce", per_rank[0]["calls"]
    return message


LOSS_CASES = ["loss_shape", "loss_nan_advantages", "loss_nan_curr"]


@pytest.mark.parametrize("name", [*CORE_CASES, *LOSS_CASES, *SEAM_CASES, "seam_split"])
def test_one_bad_rank_of_two_every_rank_raises_the_same_error(two_ranks, name):
    message = _check_agreement(two_ranks, name, [1], EXPECT[name])
    assert "rank 0:" not in message  # the clean rank is not blamed
    assert "1 of 2 ranks" in message, message


@pytest.mark.parametrize("world", ["two_ranks", "four_ranks"])
def test_clean_batch_after_failures_still_one_all_reduce(world, request):
    results = request.getfixturevalue(world)
    for r, res in enumerate(results):
        clean = res["clean"]
        assert clean["error"] is None and clean["alive"] == len(results), (r, clean)
        assert clean["calls"] == ["all_reduce"], (r, clean["calls"])


def test_one_bad_rank_of_four_with_an_empty_rank(four_ranks):
    _check_agreement(four_ranks, "nan", [2], ["generation_logprobs: 1 non-finite", "1 of 4 ranks"])
    _check_agreement(four_ranks, "seam_missing_key", [2], ["generation_logprobs: missing", "1 of 4 ranks"])


def test_two_bad_ranks_of_four_are_both_listed(four_ranks):
    message = _check_agreement(
        four_ranks, "two_bad", [2, 3], ["2 of 4 ranks", "generation_logprobs: got [4, 5] float64", "1 non-finite"]
    )
    assert message.index("rank 2:") < message.index("rank 3:"), message
