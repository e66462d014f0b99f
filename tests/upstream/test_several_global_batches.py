# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Several global batches per step: what ``ais/alpha`` and ``ais/alpha_gb<g>`` read in GRPO.

Upstream's 8B FP8 recipe trains 2048 rollouts per step as 4 global batches of 512. The
loss runs inside NeMo-RL's REAL DTensor-v2 micro-batch loop
(``nemo_rl.models.automodel.train.automodel_forward_backward`` with its
``LossPostProcessor``: log-probs from the logits, the loss call, then every metric but
``*_min`` / ``*_max`` divided by ``num_global_batches``) on a one-layer CPU model. The
Megatron workers apply the same division inline in ``train()``: a source check pins it for
both. GRPO's reduction (``np.sum`` of each metric's list) is pinned the same way and applied
to the lists. Expected, for each NeMo-RL version: ``ais/alpha`` = the mean alpha over the
step's global batches, ``ais/alpha_gb<g>`` = alpha of global batch g, each equal to the
diagnostics of that global batch computed on its own (float64 oracle).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import sys
import types
from collections import defaultdict

import numpy as np
import pytest
import torch
from nemo_rl.algorithms import grpo
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.models.automodel.data import ProcessedInputs, ProcessedMicrobatch

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import compute_diagnostics
from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.loss import PER_GLOBAL_BATCH_ALPHA
from nemo_ais.nemo_rl.seam import core_inputs, prepare_global_batches

pytestmark = pytest.mark.nemo_rl

N_GB, ROWS, MB, SEQ, VOCAB = 4, 6, 2, 9, 11
AIS = {"mode": "ais", "severity_scale": 0.05}
UPSTREAM_DIVISION = "/ num_global_batches"


@pytest.fixture(scope="module")
def automodel_train():
    """Upstream's ``nemo_rl.models.automodel.train``, imported for real.

    It imports one name from NeMo-Automodel (not installed on CPU): ``to_local_if_dtensor``,
    which only its reward-model post-processor calls. That name is the stub: it records
    every call, and the test asserts there was none.
    """
    calls: list = []
    names = ("nemo_automodel", "nemo_automodel.components", "nemo_automodel.components.distributed")
    leaf = types.ModuleType("nemo_automodel.components.distributed.tensor_utils")
    leaf.to_local_if_dtensor = lambda *args, **kwargs: calls.append(args)
    stubs = {name: types.ModuleType(name) for name in names} | {leaf.__name__: leaf}
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield importlib.import_module("nemo_rl.models.automodel.train")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    assert calls == []


def _global_batch(g: int) -> dict[str, torch.Tensor]:
    """NeMo-RL-layout rows of global batch g; its mismatch grows with g (alpha differs)."""
    gen = torch.Generator().manual_seed(100 + g)
    f32 = torch.float32
    lengths = torch.randint(3, SEQ + 1, (ROWS,), generator=gen)
    token_mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).to(f32)
    token_mask[:, 0] = 0.0
    logp_mu = -2.0 * torch.rand(ROWS, SEQ, generator=gen, dtype=f32) - 0.05
    logp_old = logp_mu + (0.01 + 0.04 * g) * torch.randn(ROWS, SEQ, generator=gen, dtype=f32)
    return {
        "input_ids": torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen),
        "token_mask": token_mask,
        "sample_mask": torch.ones(ROWS, dtype=f32),
        "advantages": torch.randn(ROWS, 1, generator=gen, dtype=f32).expand(ROWS, SEQ).clone(),
        "prev_logprobs": logp_old,
        "generation_logprobs": logp_mu,
        "reference_policy_logprobs": logp_old.clone(),
    }


class _Logits(torch.nn.Module):
    """One embedding of width VOCAB: logits[b, t] = table[input_ids[b, t]] (HF-style kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(VOCAB, VOCAB)
        torch.nn.init.normal_(self.table.weight, std=0.5, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.table(input_ids)


@contextlib.contextmanager
def _cuda_is_identity(moved: list):
    """``Tensor.cuda`` -> the tensor itself (recorded in ``moved``), only while upstream's
    loop runs: its log-prob helper moves the token ids with ``.cuda()``; no device here."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda t, *args, **kwargs: moved.append(t.dtype) or t
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def _step_metrics(automodel_train, loss_fn: AISClippedPGLossFn, moved: list) -> tuple[dict[str, float], list[float]]:
    """One step of N_GB global batches through upstream's loop; GRPO's reduction after."""
    batches = [_global_batch(g) for g in range(N_GB)]
    data = BatchedDataDict({k: torch.cat([b[k] for b in batches]) for k in batches[0]})
    diagnostics = prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=ROWS, group=None)
    post = automodel_train.LossPostProcessor(
        loss_fn, cfg={}, device_mesh=None, cp_mesh=None, tp_mesh=None, cp_size=1, dp_size=1
    )
    model = _Logits()
    all_mb_metrics: list[dict] = []
    for g in range(N_GB):  # the worker's global-batch loop
        gb = data.slice(g * ROWS, (g + 1) * ROWS)
        mask = gb["token_mask"][:, 1:] * gb["sample_mask"].unsqueeze(-1)
        microbatches = [
            ProcessedMicrobatch(
                data_dict=gb.slice(a, a + MB),
                processed_inputs=ProcessedInputs(input_ids=gb["input_ids"][a : a + MB], seq_len=SEQ),
                original_batch_size=MB,
                original_seq_len=SEQ,
            )
            for a in range(0, ROWS, MB)
        ]
        with _cuda_is_identity(moved):
            results = automodel_train.automodel_forward_backward(
                model,
                iter(microbatches),
                post,
                global_valid_seqs=gb["sample_mask"].sum(),
                global_valid_toks=mask.sum(),
                num_global_batches=N_GB,
            )
        all_mb_metrics.extend(metrics for _, metrics in results)
    lists: dict[str, list] = defaultdict(list)  # aggregate_training_statistics / Policy.train
    for metrics in all_mb_metrics:
        for key, value in metrics.items():
            lists[key].append(value)
    step = {k: np.sum(v).item() for k, v in lists.items()}  # grpo_train's reduction
    return step, [d.alpha for d in diagnostics]


def _oracle_alpha(g: int) -> float:
    """alpha of global batch g computed on its own rows, in float64."""
    x = core_inputs({k: v.double() for k, v in _global_batch(g).items()})
    return compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, CorrectionConfig(**AIS)).alpha


def test_upstream_divides_metrics_by_the_number_of_global_batches_and_grpo_sums_them(automodel_train):
    from _megatron_worker import megatron_worker_modules

    with megatron_worker_modules() as loaded:
        megatron = inspect.getsource(loaded.upstream)
    loop = inspect.getsource(automodel_train.automodel_forward_backward)
    assert 'if "_min" in k or "_max" in k:' in loop and "metrics[k] /= num_global_batches" in loop
    assert "loss_metrics[k] = x[k] / num_global_batches" in megatron
    for trainer in (grpo.grpo_train, grpo.async_grpo_train):
        assert "metrics[k] = np.sum(v).item()" in inspect.getsource(trainer)


@pytest.mark.parametrize("mode", ["ais", "none"])
def test_step_alpha_is_the_mean_and_each_global_batch_is_reported(automodel_train, mode):
    moved = []  # what upstream moved with .cuda() (the identity here)
    loss_fn = AISClippedPGLossFn({"ais": {**AIS, "mode": mode}})
    step, alphas = _step_metrics(automodel_train, loss_fn, moved)
    assert moved == [torch.int64] * (N_GB * ROWS // MB)  # input_ids, once per micro-batch
    oracle = [_oracle_alpha(g) for g in range(N_GB)]
    assert len(set(oracle)) == N_GB and 0 < min(oracle) < max(oracle) < 1  # non-vacuous
    for g in range(N_GB):
        assert math.isclose(alphas[g], oracle[g], rel_tol=1e-5)
        assert math.isclose(step[PER_GLOBAL_BATCH_ALPHA.format(g)], oracle[g], rel_tol=1e-5)
    assert math.isclose(step["ais/alpha"], sum(oracle) / N_GB, rel_tol=1e-5)
    assert PER_GLOBAL_BATCH_ALPHA.format(N_GB) not in step


def test_one_global_batch_emits_no_per_global_batch_keys():
    loss_fn = AISClippedPGLossFn({"ais": AIS})
    data = BatchedDataDict(_global_batch(2))
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=ROWS, group=None)
    curr = data["prev_logprobs"][:, 1:].clone().requires_grad_(True)
    mask = data["token_mask"][:, 1:]
    _, metrics = loss_fn(curr, data, torch.tensor(float(ROWS)), mask.sum())
    assert not [k for k in metrics if k.startswith("ais/alpha_gb")]
    assert math.isclose(metrics["ais/alpha"], _oracle_alpha(2), rel_tol=1e-5)
