# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The NeMo-RL seam's own logic: key mapping, global-batch split, row tags, worker mixin.

NeMo-RL (v0.7.0, or main with ``--nemo-rl main``) is importable in every run
(``tests/conftest.py``); the tests that use its classes are marked ``nemo_rl``: the packed
split runs on its real ``BatchedDataDict.shard_by_batch_size(..., sequence_packing_args=...)``; one test
imports ``nemo_ais.nemo_rl`` in a subprocess where NeMo-RL is absent. The multi-process
collective pattern is in
``tests/distributed/test_nemo_rl_seam.py``; NeMo-RL-backed checks in ``test_nemo_rl_loss.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import nemo_ais.nemo_rl as ais_nemo_rl
from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import AISState, compute_diagnostics
from nemo_ais.nemo_rl.seam import (
    GLOBAL_BATCH_KEY,
    LOSS_KEYS,
    core_inputs,
    global_batch_index,
    loss_from_prepared,
    num_global_batches,
    prepare_global_batches,
    split_global_batches,
)
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin, ais_state_path

CONFIG = CorrectionConfig(mode="ais", severity_scale=0.05, ema=0.5)


def _data(b=4, s=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    gen = -torch.rand(b, s, generator=g, dtype=torch.float64) - 0.1
    return {
        "input_ids": torch.zeros(b, s, dtype=torch.int64),
        "advantages": torch.randn(b, s, generator=g, dtype=torch.float64),
        "prev_logprobs": gen + 0.3 * torch.randn(b, s, generator=g, dtype=torch.float64),
        "generation_logprobs": gen,
        "token_mask": torch.tensor([[0, 1, 1, 1, 0]] * b, dtype=torch.int64),
        "sample_mask": torch.tensor([1, 0, 1, 1][:b], dtype=torch.int64),
    }


_WITHOUT_NEMO_RL = """
import sys
sys.modules["nemo_rl"] = None  # what an environment without NeMo-RL looks like to import
import nemo_ais.nemo_rl as m
assert m.GLOBAL_BATCH_KEY == "ais_global_batch"
assert not hasattr(m, "AISLossConfig") and not hasattr(m, "AISClippedPGLossFn")
assert getattr(m, "AISLossConfig", "absent") == "absent"
try:
    m.AISClippedPGLossFn
except m.NeMoRLNotInstalledError as err:
    assert isinstance(err, AttributeError)
    print(err)
try:
    m.not_a_name
except AttributeError as err:
    assert not isinstance(err, m.NeMoRLNotInstalledError)
    print(err)
"""


@pytest.mark.nemo_rl  # NeMo-RL's loss classes resolve here; a subprocess hides NeMo-RL
def test_import_without_nemo_rl_and_lazy_error():
    assert ais_nemo_rl.GLOBAL_BATCH_KEY == "ais_global_batch"
    assert hasattr(ais_nemo_rl, "AISLossConfig")  # NeMo-RL is importable here
    res = subprocess.run([sys.executable, "-c", _WITHOUT_NEMO_RL], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    hint, unknown = res.stdout.strip().splitlines()
    assert hint.startswith(
        "AISClippedPGLossFn: NeMo-RL v0.7.0 (tag v0.7.0, commit 81aa43d) or NeMo-RL main "
        "(checked at commit 7ea279a, 2026-08-22) is required"
    )
    assert "has no attribute 'not_a_name'" in unknown


def test_core_inputs_maps_keys_and_masks():
    d = _data()
    x = core_inputs(d)
    assert torch.equal(x.logp_old, d["prev_logprobs"][:, 1:])
    assert torch.equal(x.logp_rollout, d["generation_logprobs"][:, 1:])
    assert torch.equal(x.adv, d["advantages"][:, 1:])
    assert x.logp_ref is None
    # token_mask[:, 1:] = [1, 1, 1, 0] per row, times sample_mask [1, 0, 1, 1]
    expected = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    assert torch.equal(x.mask, expected.to(torch.float64))
    assert x.mask.dtype == torch.float64  # int64 NeMo-RL masks become the log-prob dtype


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda d: d.pop("generation_logprobs"), KeyError, "generation_logprobs: missing"),
        (
            lambda d: d.update(generation_logprobs=d["generation_logprobs"][:, :4]),
            ValueError,
            r"generation_logprobs: got \[4, 4\], expected \[4, 5\] like prev_logprobs",
        ),
        (lambda d: d.update(sample_mask=d["sample_mask"][:3]), ValueError, r"sample_mask: got \[3\], expected \[4\]"),
        (lambda d: d.update(token_mask=d["token_mask"][0]), ValueError, "token_mask: got .* expected a 2-D tensor"),
    ],
)
def test_core_inputs_errors_name_the_tensor(mutate, error, match):
    d = _data()
    mutate(d)
    with pytest.raises(error, match=match):
        core_inputs(d)


def _packed_rank1():
    """DP rank 1's shard of two global batches (gbs 4, DP 2), packed by NeMo-RL's real packer.

    Sequence lengths [5, 1, 1, 1 | 5, 5, 1, 1] in 5-token bins: rank 1 holds 3 rows of
    global batch 0 and 2 of global batch 1 (``elem_counts_per_gb == [3, 2]``), not
    ``gbs / DP = 2`` each.
    """
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    data = BatchedDataDict({k: torch.cat([v, v]) for k, v in _data(b=4).items()})
    data["input_lengths"] = torch.tensor([5, 1, 1, 1, 5, 5, 1, 1])
    shards, _ = data.shard_by_batch_size(
        2,
        batch_size=4,
        sequence_packing_args={
            "max_tokens_per_microbatch": 5,
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "algorithm": "modified_first_fit_decreasing",
            "sequence_length_pad_multiple": 1,
        },
    )
    assert shards[1].elem_counts_per_gb == [3, 2]
    return shards[1]


class _Sink:
    diagnostics = None

    def attach_diagnostics(self, diagnostics):
        self.diagnostics = tuple(diagnostics)


@pytest.mark.nemo_rl  # NeMo-RL's BatchedDataDict packs the shard
def test_split_and_tags_plain_and_packed():
    plain = _data(b=4)
    plain = {k: torch.cat([v, v[:1]]) for k, v in plain.items()}  # 5 rows, gbs 2: 1 unused
    assert num_global_batches(plain, 2) == 2
    assert [b["sample_mask"].shape[0] for b in split_global_batches(plain, 2)] == [2, 2]
    prepare_global_batches(plain, _Sink(), CONFIG, local_batch_size=2, group=None)
    assert plain[GLOBAL_BATCH_KEY].tolist() == [0, 0, 1, 1, -1]
    packed = _packed_rank1()
    assert num_global_batches(packed, 99) == 2  # elem_counts_per_gb wins
    assert [b["sample_mask"].shape[0] for b in split_global_batches(packed, 2)] == [3, 2]
    sink = _Sink()
    prepare_global_batches(packed, sink, CONFIG, local_batch_size=2, group=None)
    assert packed[GLOBAL_BATCH_KEY].tolist() == [0, 0, 0, 1, 1]
    assert len(sink.diagnostics) == 2


def test_global_batch_index_rejects_mixed_rows():
    assert global_batch_index({}) is None
    assert global_batch_index({GLOBAL_BATCH_KEY: torch.tensor([2, 2])}) == 2
    with pytest.raises(ValueError, match=r"global batches 0\.\.1"):
        global_batch_index({GLOBAL_BATCH_KEY: torch.tensor([0, 1])})
    with pytest.raises(ValueError, match="-1 marks rows outside"):
        global_batch_index({GLOBAL_BATCH_KEY: torch.tensor([-1])})


def test_prepared_diagnostics_equal_core_on_each_global_batch():
    d = _data(b=4, seed=3)
    sink, state, ref_state = _Sink(), AISState(), AISState()
    prepare_global_batches(d, sink, CONFIG, local_batch_size=2, group=None, state=state)
    for g in range(2):
        x = core_inputs({k: v[2 * g : 2 * g + 2] for k, v in d.items()})
        ref = compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, CONFIG, state=ref_state)
        assert sink.diagnostics[g] == ref
    assert state.state_dict() == ref_state.state_dict()


@pytest.mark.parametrize(
    ("key", "where", "loss_keys", "index"),
    [
        ("advantages", (2, 3), LOSS_KEYS, (0, 3)),  # global batch 1's row 0: a valid token
        ("advantages", (1, 2), LOSS_KEYS, False),  # sample_mask 0
        ("advantages", (0, 0), LOSS_KEYS, False),  # the first position, never a loss token
        ("advantages", (0, 4), LOSS_KEYS, False),  # token_mask 0
        ("reference_policy_logprobs", (0, 2), LOSS_KEYS, False),  # not read without a KL term
        ("reference_policy_logprobs", (0, 2), (*LOSS_KEYS, "reference_policy_logprobs"), (0, 2)),
    ],
)
def test_prepare_checks_loss_only_keys_at_valid_tokens(key, where, loss_keys, index):
    # a value only the loss reads fails the prepare step (before the all-reduce, so every
    # rank raises together), named by NeMo-RL's key and [B, S] index in its global batch
    d = _data(b=4)
    d["reference_policy_logprobs"] = d["prev_logprobs"].clone()
    d[key][where] = float("nan")
    prepare = lambda: prepare_global_batches(  # noqa: E731
        d, _Sink(), CONFIG, local_batch_size=2, group=None, loss_keys=loss_keys
    )
    if index is False:
        prepare()
        return
    with pytest.raises(ValueError, match=rf"{key}: 1 non-finite .* first at index {re.escape(str(index))}"):
        prepare()


def test_loss_from_prepared_requires_preparation():
    d = _data()
    lp = d["prev_logprobs"][:, 1:].clone()
    with pytest.raises(RuntimeError, match="no AIS diagnostics were prepared"):
        loss_from_prepared(lp, d, (), CONFIG, PGLossConfig(), global_valid_seqs=3.0, global_valid_toks=9.0)


class _FakeWorker:
    """Stands in for a NeMo-RL worker implementation: records what train() saw."""

    def __init__(self, config, weights_path=None):
        self.cfg = config
        self.seen = []

    def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None, check_dim_skip_keys=None):
        self.seen.append((data[GLOBAL_BATCH_KEY].tolist(), loss_fn.diagnostics, eval_mode))
        return {"ok": True}

    def save_checkpoint(self, weights_path, optimizer_path=None):
        os.makedirs(weights_path, exist_ok=True)


class _Worker(AISTrainMixin, _FakeWorker):
    def _ais_dp_group(self):
        return dist.group.WORLD


class _Loss(_Sink):
    enabled = True
    ais = CONFIG


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_worker_mixin_prepares_saves_and_restores_state(one_rank_world, tmp_path):
    worker = _Worker({"train_global_batch_size": 2}, weights_path=None)
    loss = _Loss()
    assert worker.train(data=_data(b=4), loss_fn=loss, gbs=2) == {"ok": True}
    tags, diags, _ = worker.seen[0]
    assert tags == [0, 0, 1, 1] and len(diags) == 2
    assert worker.ais_state.num_updates == 2
    worker.train(data=_data(b=4), loss_fn=loss, eval_mode=True)  # gbs from cfg; no EMA step
    assert worker.ais_state.num_updates == 2
    weights = str(tmp_path / "step_3" / "policy" / "weights")
    worker.save_checkpoint(weights)
    with open(ais_state_path(weights)) as f:
        saved = json.load(f)
    assert saved == worker.ais_state.state_dict()
    assert math.isfinite(saved["alpha"])
    restored = _Worker({"train_global_batch_size": 2}, weights_path=weights)
    assert restored.ais_state.state_dict() == saved


def test_worker_mixin_prepares_mode_none_too(one_rank_world):
    worker = _Worker({"train_global_batch_size": 2})

    class NoneLoss(_Sink):  # AISClippedPGLossFn with mode none: enabled is False
        enabled = False
        ais = CorrectionConfig(mode="none")

    worker.train(data=_data(b=4), loss_fn=NoneLoss(), gbs=2)
    tags, diags, _ = worker.seen[0]
    assert tags == [0, 0, 1, 1] and len(diags) == 2  # statistics for the telemetry
    assert worker.ais_state.num_updates == 2


def test_worker_mixin_leaves_plain_losses_alone(one_rank_world):
    worker = _Worker({"train_global_batch_size": 2})

    class Plain:
        diagnostics = None

    data = _data(b=4)
    data[GLOBAL_BATCH_KEY] = torch.full((4,), 7)  # untouched marker
    worker.train(data=data, loss_fn=Plain(), gbs=2)
    assert worker.seen[0][0] == [7, 7, 7, 7] and worker.ais_state.num_updates == 0
