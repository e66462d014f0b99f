# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The per-global-batch AIS "prepare" step, independent of NeMo-RL (plain torch).

A collective inside the loss would deadlock (uneven call counts per rank, last pipeline
stage only, dummy micro-batches), so each worker runs this step at the top of ``train()``::

    for every global batch g (same count on every rank of the DP group):
        s_g = compute_statistics(this rank's rows of g)   # local
        S_g = reduce_statistics(s_g, dp_group)            # exactly ONE all_reduce
        d_g = diagnostics_from_stats(S_g, config, state)  # identical everywhere
    tag every row with g (GLOBAL_BATCH_KEY) and its valid tokens (VALID_TOKENS_KEY)
    loss_fn.attach_diagnostics([d_0, d_1, ...])

A rank with bad input joins the all-reduce flagged and every rank raises the same ``ValueError``; the loss looks ``d_g``
up through the row tags and never communicates. Design: docs/nemo_rl.md, "The seam".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig, require_config
from nemo_ais.core import AISDiagnostics, AISState, LossOutput, clipped_pg_loss, compute_diagnostics, validation

# core's mismatch metrics -> ClippedPGLossFn's keys (grpo_train reads them unconditionally)
NEMO_RL_MISMATCH_NAMES = {
    "mismatch/mult_prob_error": "token_mult_prob_error",
    "mismatch/kl_rollout_old": "gen_kl_error",
    "mismatch/kl_old_rollout": "policy_kl_error",
    "mismatch/js_divergence": "js_divergence_error",
    "mismatch/entropy": "approx_entropy",
    "mismatch/ratio_min": "probs_ratio_min",
    "mismatch/ratio_max": "probs_ratio_max",
    "mismatch/ratio_clamped_min": "probs_ratio_clamped_min",
    "mismatch/ratio_clamped_max": "probs_ratio_clamped_max",
}
ROLLOUT_METRIC_KEYS = tuple(NEMO_RL_MISMATCH_NAMES.values())

# [B] int64 row tag: the row's global batch (slicing, packing and micro-batching keep it).
GLOBAL_BATCH_KEY = "ais_global_batch"
UNUSED_ROW = -1  # tag of rows past the last full global batch (NeMo-RL never trains on them)
# [B] float64 row column: the row's valid tokens (a loss call sums it for its local count).
VALID_TOKENS_KEY = "ais_valid_tokens"
# [B, S] loss-only keys the prepare step checks (AISClippedPGLossFn.loss_keys adds reference_policy_logprobs for KL)
LOSS_KEYS = ("advantages",)


class CoreInputs(NamedTuple):
    """NeMo-RL loss data mapped to core names; ``[B, S - 1]`` (response-aligned) but ``rewards``."""

    logp_old: torch.Tensor
    logp_rollout: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor | None
    logp_ref: torch.Tensor | None
    logp_kl: torch.Tensor | None = None  # curr_logprobs_unfiltered (top-k/top-p training)
    rewards: torch.Tensor | None = None  # [B], for positive_example_nll_weight


class DiagnosticsSink(Protocol):
    """What the prepare step attaches the per-global-batch diagnostics to (the loss)."""

    def attach_diagnostics(self, diagnostics: Sequence[AISDiagnostics]) -> None:
        """Store one :class:`AISDiagnostics` per global batch, in order."""


def _tensor(data: Mapping[str, Any], key: str, ndim: int) -> torch.Tensor:
    value = data.get(key)
    form = "[B, S]" if ndim == 2 else "[B]"
    if not isinstance(value, torch.Tensor):
        raise KeyError(
            f"{key}: missing from the loss data (got keys {sorted(data)}); expected a "
            f"{form} tensor, which NeMo-RL's GRPO puts in every training batch"
        )
    if value.dim() != ndim:
        raise ValueError(f"{key}: got {list(value.shape)} {value.dtype}, expected a {ndim}-D tensor ({form})")
    return value


def core_inputs(data: Mapping[str, Any], *, with_loss_terms: bool = True) -> CoreInputs:
    """Map NeMo-RL's ``ClippedPGLossDataDict`` keys to the core tensor names (loss-only keys if ``with_loss_terms``).

    ``[:, 1:]`` drops the first position, as ``ClippedPGLossFn`` (``curr_logprobs_unfiltered`` is already aligned);
    ``mask = token_mask[:, 1:] * sample_mask[:, None]`` in the dtype of ``prev_logprobs``.

    Raises:
        KeyError: a required key is missing. ValueError: a wrong rank or mismatched shape.
    """
    prev = _tensor(data, "prev_logprobs", 2)
    gen = _tensor(data, "generation_logprobs", 2)
    token_mask = _tensor(data, "token_mask", 2)
    sample_mask = _tensor(data, "sample_mask", 1)
    for name, t in (("generation_logprobs", gen), ("token_mask", token_mask)):
        if t.shape != prev.shape:
            raise ValueError(f"{name}: got {list(t.shape)}, expected {list(prev.shape)} like prev_logprobs")
    if sample_mask.shape[0] != prev.shape[0]:
        raise ValueError(
            f"sample_mask: got {list(sample_mask.shape)}, expected [{prev.shape[0]}] "
            "(one entry per row of prev_logprobs)"
        )
    mask = (token_mask[:, 1:] * sample_mask.unsqueeze(-1)).to(prev.dtype)
    if not with_loss_terms:
        return CoreInputs(prev[:, 1:], gen[:, 1:], mask, None, None)
    adv = _tensor(data, "advantages", 2)[:, 1:]
    ref_full = data.get("reference_policy_logprobs")
    ref = ref_full[:, 1:] if isinstance(ref_full, torch.Tensor) else None
    logp_kl, rewards = data.get("curr_logprobs_unfiltered"), data.get("rewards")
    return CoreInputs(prev[:, 1:], gen[:, 1:], mask, adv, ref, logp_kl, rewards)


def num_global_batches(data: Any, local_batch_size: int) -> int:
    """Global batches in a worker's shard (``elem_counts_per_gb`` with packing), no collective."""
    counts = getattr(data, "elem_counts_per_gb", None)
    if counts is not None:
        return len(counts)
    if local_batch_size <= 0:
        raise ValueError(f"local_batch_size={local_batch_size} must be > 0 (gbs // dp_size)")
    if isinstance(data.get("sample_mask"), torch.Tensor):
        return _rows(data) // local_batch_size
    # rows from any batched tensor (the missing sample_mask is reported per global batch)
    sizes = (v.shape[0] for v in data.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return int(next(sizes, 0)) // local_batch_size


def _rows(data: Mapping[str, Any]) -> int:
    return int(_tensor(data, "sample_mask", 1).shape[0])


def split_global_batches(data: Any, local_batch_size: int) -> list[Mapping[str, Any]]:
    """This rank's rows of each global batch (``BatchedDataDict.get_batch``, else row blocks)."""
    n = num_global_batches(data, local_batch_size)
    if hasattr(data, "get_batch"):
        return [data.get_batch(batch_idx=i, batch_size=local_batch_size) for i in range(n)]
    blocks = [slice(i * local_batch_size, (i + 1) * local_batch_size) for i in range(n)]
    return [{k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in data.items()} for rows in blocks]


def global_batch_diagnostics(
    batches: Sequence[Mapping[str, Any]],
    config: CorrectionConfig,
    *,
    group: torch.distributed.ProcessGroup | None,
    state: AISState | None = None,
    device: torch.device | str | None = None,
    loss_keys: Sequence[str] = LOSS_KEYS,
) -> list[AISDiagnostics]:
    """Diagnostics of each global batch: local statistics -> ONE all-reduce -> alpha.

    Args:
        batches: this rank's rows of each global batch (same count on every rank).
        group: the data-parallel group (None: one process).
        state: EMA state of alpha, advanced once per global batch (None: eval).
        device: where the statistics are reduced (``cuda`` for NCCL; None: the inputs').
        loss_keys: ``[B, S]`` loss-only keys, checked finite at valid tokens here so that every rank fails together.

    Raises:
        ValueError: bad input on any rank (the same message on every rank of a group).
        TypeError: ``config`` of the wrong type.
    """
    require_config(config, CorrectionConfig, "global_batch_diagnostics(config)")
    return [
        _agreed_diagnostics(g, *_statistics_inputs(batch, device, loss_keys), config, group, state)
        for g, batch in enumerate(batches)
    ]


def _agreed_diagnostics(g, inputs, input_error, config, group, state) -> AISDiagnostics:
    """``compute_diagnostics``; with a group, its agreed error names the global batch g."""
    try:
        return compute_diagnostics(*inputs, config, group, state, input_error=input_error)
    except ValueError as err:
        if group is None:
            raise
        raise ValueError(f"global batch {g}: {err}") from err  # g is the same on every rank


def _statistics_inputs(batch: Mapping[str, Any], device, loss_keys) -> tuple[tuple, Exception | None]:
    """``((logp_old, logp_rollout, mask), None)``, or empty tensors and the input error."""
    try:
        x = core_inputs(batch, with_loss_terms=False)
        _check_loss_values(batch, x.mask, loss_keys)
    except (KeyError, TypeError, ValueError) as err:
        return _no_inputs(batch, device), err
    return tuple(t.to(device) if device else t for t in x[:3]), None


def _check_loss_values(batch: Mapping[str, Any], mask: torch.Tensor, keys: Sequence[str]) -> None:
    """Raise ``BadValuesError`` for a non-finite ``batch[key]`` at a valid token (NeMo-RL's index).

    A key that is absent or not ``[B, S]`` is left to the loss call, which names it.
    """
    valid = torch.nn.functional.pad(validation.valid_positions(mask), (1, 0))  # [B, S]
    for key in keys:
        t = batch.get(key)
        if isinstance(t, torch.Tensor) and t.shape == valid.shape and t.is_floating_point():
            count = (~torch.isfinite(t) & valid).sum().item()
            if count:
                validation.raise_for_bad_values({key: t}, valid, [count])


def _no_inputs(data: Any, device) -> tuple[torch.Tensor, ...]:
    """Empty stand-ins on the reduction device, for a rank that joins the collective flagged."""
    if device is None:
        values = data.values() if isinstance(data, Mapping) else ()
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    empty = torch.zeros(0, 0, device=device)
    return empty, empty, empty


def _row_tags(batches: Sequence[Mapping[str, Any]], total_rows: int) -> torch.Tensor:
    sizes = [_rows(b) for b in batches]
    tags = [torch.full((n,), g, dtype=torch.int64) for g, n in enumerate(sizes)]
    tail = torch.full((total_rows - sum(sizes),), UNUSED_ROW, dtype=torch.int64)
    return torch.cat([*tags, tail])


def row_valid_tokens(data: Mapping[str, Any]) -> torch.Tensor:
    """``[B]`` float64 valid tokens of each row, ``token_mask[:, 1:].sum(-1) * sample_mask``."""
    token_mask = _tensor(data, "token_mask", 2)
    return token_mask[:, 1:].sum(dim=-1, dtype=torch.float64) * _tensor(data, "sample_mask", 1)


def prepare_global_batches(
    data: MutableMapping[str, Any],
    sink: DiagnosticsSink,
    config: CorrectionConfig,
    *,
    local_batch_size: int,
    group: torch.distributed.ProcessGroup | None,
    state: AISState | None = None,
    device: torch.device | str | None = None,
    split: Callable[[Any, int], Sequence[Mapping[str, Any]]] = split_global_batches,
    loss_keys: Sequence[str] = LOSS_KEYS,
) -> list[AISDiagnostics]:
    """The worker's prepare step: diagnostics per global batch, row tags, attach to ``sink``.

    ``data`` gains :data:`GLOBAL_BATCH_KEY` (-1 past the last full global batch) and :data:`VALID_TOKENS_KEY`;
    ``local_batch_size`` is ``gbs // dp_size``. Other arguments and errors as :func:`global_batch_diagnostics`.
    """
    require_config(config, CorrectionConfig, "prepare_global_batches(config)")
    try:
        batches = split(data, local_batch_size)
    except (KeyError, TypeError, ValueError) as err:
        # join the first global batch's all-reduce, flagged: raises on every rank
        _agreed_diagnostics(0, _no_inputs(data, device), err, config, group, state)
        raise  # not reached: compute_diagnostics raises whenever input_error is given
    diagnostics = global_batch_diagnostics(
        batches, config, group=group, state=state, device=device, loss_keys=loss_keys
    )
    tags = _row_tags(batches, _rows(data))
    data[GLOBAL_BATCH_KEY] = tags.to(_tensor(data, "sample_mask", 1).device)
    data[VALID_TOKENS_KEY] = row_valid_tokens(data)
    sink.attach_diagnostics(diagnostics)
    return diagnostics


def global_batch_index(data: Mapping[str, Any]) -> int | None:
    """The global batch of a (micro-)batch from its row tags (None: untagged; ValueError: mixed)."""
    tags = data.get(GLOBAL_BATCH_KEY)
    if tags is None:
        return None
    if tags.numel() == 0:
        return UNUSED_ROW
    lo, hi = torch.stack(torch.aminmax(tags)).tolist()  # one host sync
    return checked_index(lo, hi)


def checked_index(lo: int, hi: int) -> int:
    """The global-batch index of rows whose tags span ``lo..hi`` (ValueError if mixed or -1)."""
    if lo != hi or lo == UNUSED_ROW:
        raise ValueError(
            f"{GLOBAL_BATCH_KEY}: a loss call received rows of global batches {lo}..{hi}; "
            "expected all rows from one global batch (the worker's micro-batches never "
            "straddle global batches; -1 marks rows outside every global batch)"
        )
    return lo


def loss_from_prepared(
    logp_theta: torch.Tensor,
    data: Mapping[str, Any],
    diagnostics: Sequence[AISDiagnostics],
    config: CorrectionConfig,
    pg: PGLossConfig,
    *,
    global_valid_seqs: torch.Tensor | float | None,
    global_valid_toks: torch.Tensor | float | None,
    rollout_metrics: bool = False,
    index: int | None = None,
) -> LossOutput:
    """One loss call with the prepared diagnostics of its global batch (no collective).

    Args:
        logp_theta: ``[B, S - 1]`` current log-probs (with grad).
        data: the call's NeMo-RL data (keys as :func:`core_inputs`, plus the row tags).
        diagnostics: what the prepare step produced for this ``train()`` call.
        rollout_metrics: also compute :data:`ROLLOUT_METRIC_KEYS`.
        index: the call's global-batch index if already read (None: read here).

    Raises:
        RuntimeError: nothing was prepared for this global batch.
        TypeError: ``config`` or ``pg`` of the wrong type.
    """
    require_config(config, CorrectionConfig, "loss_from_prepared(config)")
    require_config(pg, PGLossConfig, "loss_from_prepared(pg)")
    if index is None:
        index = global_batch_index(data)
    if index is None or not 0 <= index < len(diagnostics):
        raise RuntimeError(
            f"loss_fn.ais.mode={config.mode!r}: no AIS diagnostics were prepared for this micro-batch (global batch "
            f"{index}, {len(diagnostics)} prepared). Train through the AIS policy workers (launchers/run_grpo_ais.py "
            "passes policy_factory), or call nemo_ais.nemo_rl.prepare_global_batches(data, loss_fn, ...) on the "
            "worker's data before its micro-batch loop."
        )
    x = core_inputs(data)
    if pg.positive_example_nll_weight > 0 and x.rewards is None:
        # NeMo-RL adds the VAPO term only when the batch carries rewards (GRPO's does not)
        pg = pg.model_copy(update={"positive_example_nll_weight": 0.0})
    kl_on = pg.reference_policy_kl_penalty > 0
    out = clipped_pg_loss(
        logp_theta,
        x.logp_old,
        x.logp_rollout,
        x.adv,
        x.mask,
        config,
        pg=pg,
        reference_logprobs=x.logp_ref if kl_on else None,
        kl_logprobs=x.logp_kl if kl_on else None,
        rewards=x.rewards,
        diagnostics=diagnostics[index],
        global_valid_tokens=global_valid_toks,
        global_valid_seqs=global_valid_seqs,
        rollout_metrics=rollout_metrics,
    )
    metrics = {NEMO_RL_MISMATCH_NAMES.get(k, k): v for k, v in out.metrics.items()}
    return LossOutput(out.loss, metrics)
