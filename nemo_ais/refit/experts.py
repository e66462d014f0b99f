# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""MoE expert stacks of the refit stream: the experts of one layer and projection, one call.

With ``RefitConfig.num_experts`` set, :class:`~nemo_ais.refit.stream.RefitStream` holds the per-expert HF weights
(``model.layers.0.mlp.experts.3.gate_proj.weight``) here per layer and projection (NVFP4: gate and up together, each
expert its own global scale), quantizes each ``[E, N, K]`` stack in one call (one Triton launch on CUDA) and sends every
expert's pairs under its own names, bit for bit what one expert at a time sends. Only one layer's experts are held: a
stack still open when another layer's experts arrive, or at :meth:`~nemo_ais.refit.stream.RefitStream.flush` (the end
of a chunk or of the refit: a partial refit), is sent with the experts it has; none is dropped or held past the refit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nemo_ais.rules.vllm_layers import fused_siblings, projection

_EXPERT_RE = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.[^.]+\.weight$")


@dataclass
class ExpertStack:
    """The held experts of one layer and projection (or fused gate/up layer)."""

    prefix: str  # "model.layers.0.mlp.experts"
    leaves: tuple[str, ...]  # ("gate_proj", "up_proj") or ("down_proj",)
    experts: tuple[int, ...]  # the indices the refit quantizes, ascending
    held: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> tensor, arrival order

    def name(self, expert: int, leaf: str) -> str:
        """The HF weight name of ``expert``'s ``leaf`` projection."""
        return f"{self.prefix}.{expert}.{leaf}.weight"

    @property
    def complete(self) -> bool:
        """Every expert of the stack arrived, every projection of it."""
        return len(self.held) == len(self.experts) * len(self.leaves)

    def whole_experts(self) -> list[int]:
        """The experts of which every projection is held, ascending."""
        return [e for e in self.experts if all(self.name(e, leaf) in self.held for leaf in self.leaves)]


class ExpertStacks:
    """The open stacks of one stream (``grouped``: a fused layer's projections share one)."""

    def __init__(self, num_experts: int, grouped: bool) -> None:
        self.num_experts = num_experts
        self.grouped = grouped
        self.open: dict[tuple[str, tuple[str, ...]], ExpertStack] = {}

    def add(
        self, name: str, tensor: torch.Tensor, quantized: Callable[[str], bool]
    ) -> tuple[list[ExpertStack], ExpertStack | None] | None:
        """Hold ``name``; None if it is no stack's (a dense weight, an index past ``num_experts``).

        ``quantized(name)``: the refit quantizes that weight (not kept in BF16). Returns the stacks to send now with
        what they hold (another layer's, or one that already held ``name``) and the stack ``name`` completed (None:
        still open).
        """
        match = _EXPERT_RE.match(name)
        if match is None or int(match["expert"]) >= self.num_experts:
            return None
        prefix, expert = match["prefix"], int(match["expert"])
        siblings = fused_siblings(name) if self.grouped else (name,)
        leaves = tuple(projection(s) for s in siblings)
        key = (prefix, leaves)
        flush = [self.open.pop(k) for k in list(self.open) if k[0] != prefix]
        stack = self.open.get(key)
        if stack is not None and name in stack.held:  # sent twice: the first copy goes now
            flush.append(self.open.pop(key))
            stack = None
        if stack is None:
            experts = tuple(
                e
                for e in range(self.num_experts)
                if e == expert or all(quantized(f"{prefix}.{e}.{leaf}.weight") for leaf in leaves)
            )
            stack = self.open[key] = ExpertStack(prefix, leaves, experts)
        stack.held[name] = tensor
        return flush, self.open.pop(key) if stack.complete else None

    def pop_all(self) -> list[ExpertStack]:
        """Every open stack, removed."""
        stacks = list(self.open.values())
        self.open.clear()
        return stacks

    def clone_held(self) -> None:
        """Copy every held tensor (the caller's buffers are about to be reused)."""
        for stack in self.open.values():
            for name, t in stack.held.items():
                stack.held[name] = t.clone()


def stack_experts(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``; a view where they are consecutive slices of one buffer."""
    first = tensors[0]
    step, base = first.numel(), first.storage_offset()
    if step and all(
        t.is_contiguous()
        and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and t.storage_offset() == base + e * step
        for e, t in enumerate(tensors)
    ):
        return first.as_strided((len(tensors), *first.shape), (step, *first.stride()), base)
    return torch.stack(tensors)


def expert_amax(x3: torch.Tensor) -> torch.Tensor:
    """fp32 ``max |x3[e]|`` per expert, ``[E]`` (0 for empty experts; NaN/Inf propagate)."""
    e = x3.shape[0]
    if x3.numel() == 0:
        return torch.zeros(e, dtype=torch.float32, device=x3.device)
    lo, hi = torch.aminmax(x3.reshape(e, -1), dim=1)
    return torch.maximum(hi, lo.neg()).to(torch.float32)
