# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Input checks at the core boundary (the NeMo-RL adapter and the recipe call through here).

Structural errors (type, shape, device) raise at once; a distributed caller flags them in its all-reduce. A value is
*bad* when NaN or +-inf at a valid position; bad values are counted in one fused reduction, the message (count and first
index) built on the error path only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch


class BadValuesError(ValueError):
    """Bad values in one input: ``count`` of them; ``in_mask``: mask values not in {0, 1}."""

    def __init__(self, message: str, count: int = 1, in_mask: bool = False) -> None:
        super().__init__(message)
        self.count = count
        self.in_mask = in_mask


def describe(t: object) -> str:
    """``[4, 128] float32`` style description of a tensor; the type name of anything else."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def check_2d(name: str, t: object) -> None:
    """Raise ``ValueError`` unless ``t`` is a ``[B, T]`` tensor."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name}: got {describe(t)}, expected a [B, T] floating tensor")


def check_like(name: str, t: object, ref: torch.Tensor, ref_name: str) -> None:
    """``TypeError`` / ``ValueError`` unless ``t`` is floating, shaped and placed like ``ref``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: got {type(t).__name__}, expected a torch.Tensor like {ref_name}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: got {describe(t)}, expected a floating tensor {list(ref.shape)} like {ref_name}")
    if t.shape != ref.shape:
        raise ValueError(f"{name}: got {describe(t)}, expected {describe(ref)} like {ref_name}")
    if t.device != ref.device:
        raise ValueError(f"{name}: got device {t.device}, expected {ref.device} like {ref_name}")


def check_scalar_count(name: str, value: object) -> None:
    """Raise unless ``value`` is None, a real number (not bool) or a one-element tensor."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{name}: got a tensor of shape {list(value.shape)}, expected a scalar count "
                "(a 0-dim tensor or a number)"
            )
    elif value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(
            f"{name}: got {type(value).__name__} {value!r}, expected a scalar count (a 0-dim tensor or a number)"
        )


# NeMo-RL main's split train-step API passes global_valid_* = 1 and rescales by 1 / N later.
SPLIT_API_PLACEHOLDER = 1


def check_global_count(
    name: str, value: float, n_local: float, what: str, split_api_refusal: str | None = None
) -> None:
    """Raise ``ValueError`` unless a global normaliser is a finite count >= this call's own.

    0 with ``n_local = 0`` is the empty global batch. :data:`SPLIT_API_PLACEHOLDER` (1) is
    accepted when ``split_api_refusal`` is None, else refused with that reason.
    """
    if math.isfinite(value) and value >= n_local:
        return
    if value == SPLIT_API_PLACEHOLDER:
        if split_api_refusal is None:
            return
        raise ValueError(
            f"{name}={value!r} is below this call's own {n_local:g} valid {what}: this is NeMo-RL main's split "
            "train-step API (train_microbatch calls the loss with placeholder global_valid_*=1 and rescales at "
            f"finish_train_step), and {split_api_refusal}, which it cannot give. Set data_plane.enabled=false, or use "
            "a mode without a global-batch statistic"
        )
    if not math.isfinite(value):
        why = "it is not finite"
    elif value <= 0:
        why = f"it is <= 0 while this call has {n_local:g} valid {what}"
    else:
        why = f"it is smaller than this call's own {n_local:g} valid {what}"
    raise ValueError(
        f"{name}={value!r} is invalid: expected a finite count >= {n_local:g} (the valid "
        f"{what} of the whole global batch, summed over data-parallel ranks; NeMo-RL's "
        f"global_valid_{'toks' if what == 'tokens' else 'seqs'}); {why}"
    )


def check_mask(mask: object, ref: torch.Tensor, ref_name: str) -> None:
    """Raise if ``mask`` is not a bool/integer/floating tensor shaped like ``ref``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: got {type(mask).__name__}, expected a torch.Tensor like {ref_name}")
    if mask.is_complex():
        raise TypeError(f"mask: got {describe(mask)}, expected bool or floating values in {{0, 1}}")
    if mask.shape != ref.shape:
        raise ValueError(f"mask: got {describe(mask)}, expected {list(ref.shape)} (bool or float) like {ref_name}")
    if mask.device != ref.device:
        raise ValueError(f"mask: got device {mask.device}, expected {ref.device} like {ref_name}")


def check_ratio_inputs(logp_old: object, logp_rollout: object, mask: object) -> None:
    """``prev_logprobs`` ``[B, T]`` floating, ``generation_logprobs`` and ``mask`` like it (TypeError / ValueError)."""
    check_2d("prev_logprobs", logp_old)
    check_like("prev_logprobs", logp_old, logp_old, "prev_logprobs")
    check_like("generation_logprobs", logp_rollout, logp_old, "prev_logprobs")
    check_mask(mask, logp_old, "prev_logprobs")


def valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: positions where ``mask == 1``."""
    return mask.bool() if mask.dtype == torch.bool else mask == 1


def _bad_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask)
    return (mask != 0) & (mask != 1)


def bad_value_counts(logprobs: Mapping[str, torch.Tensor], mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Bad values per tensor: float64 ``[len(logprobs) + 1]`` (mask last), no host sync."""
    counts = [(~torch.isfinite(t) & valid).sum() for t in logprobs.values()]
    return torch.stack([*counts, _bad_mask(mask).sum()]).to(torch.float64)


def check_values(logprobs: Mapping[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Raise :class:`BadValuesError` for NaN / inf at a valid position of ``logprobs`` or a mask value not in {0, 1}."""
    valid = valid_positions(mask)
    counts = bad_value_counts(logprobs, mask, valid).tolist()
    if any(counts):
        raise_for_bad_values({**logprobs, "mask": mask}, valid, counts)


def raise_for_bad_values(tensors: Mapping[str, torch.Tensor], valid: torch.Tensor, counts: list[float]) -> None:
    """Raise :class:`BadValuesError` for the first tensor whose count is non-zero (count, first index)."""
    for (name, t), count in zip(tensors.items(), counts, strict=True):
        if count == 0:
            continue
        if name == "mask":
            bad = _bad_mask(t)
        else:  # NaN or +-inf at a valid position
            bad = ~torch.isfinite(t) & (valid if t.dim() == valid.dim() else valid.any(-1))
        idx = torch.nonzero(bad)
        first = tuple(idx[0].tolist()) if idx.numel() else "none on this rank"
        value = t[first].item() if idx.numel() else "-"
        if name == "mask":
            raise BadValuesError(
                f"mask: {int(count)} values not in {{0, 1}}; first at index {first} "
                f"(value {value}); expected token_mask * sample_mask with values 0 or 1",
                int(count),
                in_mask=True,
            )
        raise BadValuesError(
            f"{name}: {int(count)} non-finite values (NaN or +-inf) at valid positions; "
            f"first at index {first} (value {value}); expected finite values where mask == 1 "
            f"(mask out tokens excluded by top-k/top-p sampling, whose log-prob is -inf; NeMo-RL writes 0 there)",
            int(count),
        )
