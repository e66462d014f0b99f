# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The AIS loss through NeMo-RL's own sequence-packing path (CPU, needs NeMo-RL v0.7.0).

What a worker does, with NeMo-RL's real classes: the driver's ``shard_by_batch_size``
with ``sequence_packing_args`` (elements per global batch, packed micro-batches), the AIS
prepare step on that shard (NeMo-RL's ``get_batch`` split, row tags), then for each global
batch NeMo-RL's ``make_microbatch_iterator_for_packable_sequences`` and
``SequencePackingLossWrapper`` (one loss call per packed SEQUENCE, tensors unpadded per
sequence). The summed loss and gradients must equal one unpacked loss call on the same
global batch: the row tags survive NeMo-RL's slicing, and the number of loss calls does
not change the result. DP = 1 here (the multi-rank collective is tested on gloo).
"""

from __future__ import annotations

import math
from typing import ClassVar

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
from nemo_rl.algorithms.loss import SequencePackingLossWrapper, prepare_loss_input
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.distributed.model_utils import get_next_token_logprobs_from_logits

from nemo_ais.core import compute_diagnostics
from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.seam import GLOBAL_BATCH_KEY, core_inputs, prepare_global_batches

pytestmark = pytest.mark.nemo_rl

N, S, V, GBS = 8, 10, 11, 4


def _driver_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, S + 1, (N,), generator=g)
    valid = torch.arange(S)[None, :] < lengths[:, None]
    token_mask = valid.to(torch.int64)
    token_mask[:, :2] = 0  # a 2-token prompt
    gen = -2.0 * torch.rand(N, S, generator=g) - 0.05
    return BatchedDataDict(
        {
            "input_ids": torch.randint(0, V, (N, S), generator=g) * valid,
            "input_lengths": lengths,
            "token_mask": token_mask,
            "sample_mask": torch.ones(N, dtype=torch.int64),
            "advantages": torch.randn(N, 1, generator=g).expand(N, S).clone(),
            "prev_logprobs": gen + 0.3 * torch.randn(N, S, generator=g),
            "generation_logprobs": gen,
            "reference_policy_logprobs": gen + 0.1 * torch.randn(N, S, generator=g),
        }
    ), torch.randn(N, S, V, generator=g, dtype=torch.float64)


def _counts(batch):
    mask = batch["token_mask"][:, 1:] * batch["sample_mask"].unsqueeze(-1)
    return batch["sample_mask"].sum().double(), mask.sum().double()


class _HostIds(torch.Tensor):
    """``input_ids`` handed to NeMo-RL's non-parallel log-prob helper, which moves the next
    tokens with ``.cuda()``: on this tensor (and its slices) that stays on the host and is
    recorded. Nothing else in the process is touched."""

    moved: ClassVar[list[tuple[int, ...]]] = []

    def cuda(self, *args, **kwargs):
        _HostIds.moved.append(tuple(self.shape))
        return self


def test_packed_loss_calls_sum_to_the_unpacked_global_batch_loss():
    _HostIds.moved.clear()
    data, logits_all = _driver_batch()
    (shard,), _ = data.shard_by_batch_size(
        1,
        batch_size=GBS,
        sequence_packing_args={
            "max_tokens_per_microbatch": 2 * S,
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "algorithm": "modified_first_fit_decreasing",
            "sequence_length_pad_multiple": 1,
        },
    )
    shard["input_ids"] = shard["input_ids"].as_subclass(_HostIds)  # what upstream moves
    rows_of = shard["input_ids"]  # the shard is re-ordered: map rows back to logits
    row_index = [next(j for j in range(N) if torch.equal(data["input_ids"][j], rows_of[i])) for i in range(N)]
    shard["logits"] = logits_all[row_index]  # rides along like any per-row tensor
    loss_fn = AISClippedPGLossFn({"reference_policy_kl_penalty": 0.01, "ais": {"mode": "ais"}})
    prepare_global_batches(shard, loss_fn, loss_fn.ais, local_batch_size=GBS, group=None)
    assert sorted(shard[GLOBAL_BATCH_KEY].tolist()) == [0] * GBS + [1] * GBS

    calls, alphas = 0, []
    for gb_idx in range(len(shard.elem_counts_per_gb)):
        batch = shard.get_batch(batch_idx=gb_idx, batch_size=GBS)
        gvs, gvt = _counts(batch)
        packed_total = alpha_sum = 0.0
        for mb in batch.make_microbatch_iterator_for_packable_sequences():
            lengths = mb["input_lengths"]
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
            packed = torch.cat([mb["logits"][i, : lengths[i]] for i in range(len(lengths))])
            packed = packed.unsqueeze(0).requires_grad_(True)
            wrapper = SequencePackingLossWrapper(loss_fn, prepare_loss_input, cu_seqlens_q=cu)
            loss, metrics = wrapper(packed, mb, gvs, gvt)
            packed_total += float(loss)
            calls += len(lengths)
            alpha_sum += metrics["ais/alpha"]  # s * local / global, summed: s
        # reference: the whole global batch in ONE unpacked call, same logits
        lp = get_next_token_logprobs_from_logits(batch["input_ids"], batch["logits"])
        lp = lp.as_subclass(torch.Tensor)
        ref, _ = loss_fn(next_token_logprobs=lp, data=batch, global_valid_seqs=gvs, global_valid_toks=gvt)
        assert math.isclose(packed_total, float(ref), rel_tol=1e-6, abs_tol=1e-7)
        # independent: alpha of this global batch from core on its rows
        x = core_inputs(batch, with_loss_terms=False)
        alpha = compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, loss_fn.ais).alpha
        assert math.isclose(alpha_sum, alpha, rel_tol=1e-6)  # float32 scale factors
        alphas.append(alpha)
    assert calls == N  # one loss call per packed sequence
    # upstream moved the next tokens once per packed sequence and per reference call
    assert len(_HostIds.moved) == N + 2
    assert abs(alphas[0] - alphas[1]) > 1e-3  # a mix-up of global batches would show
