# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Weight-sync ("refit") stream of blockwise-FP8 weights for vLLM's ``model.load_weights``.

At every weight sync the BF16 trainer re-quantizes its weights and streams them into the
FP8 rollout engine. This module turns an iterator of unfused HF ``(name, tensor)`` pairs
(as Megatron-Bridge exports them) into the pairs vLLM's block-FP8 loader expects:

1. Plan each tensor (:func:`plan_tensor`): quantize the linear projections
   (``q/k/v/o_proj``, ``gate/up/down_proj``, also per MoE expert and shared expert);
   keep in BF16, unchanged, the embeddings, ``lm_head``, norms, MoE routers
   (``mlp.gate.weight``, ``shared_expert_gate``), biases, anything matching
   ``keep_patterns`` and the first/last N decoder layers
   (NeMo-RL's ``num_first_layers_in_bf16`` / ``num_last_layers_in_bf16``).
2. Check tensor parallelism: every rank quantizes its own shard, so each rank's shard of
   Q, K, V, gate, up (column-parallel: out dim / tp) and o_proj, down_proj (row-parallel:
   in dim / tp) must be a multiple of the 128 block.
3. Quantize with :func:`nemo_ais.fp8.quantize_blockwise` and yield ``(name, q_fp8)`` then
   ``(name[:-len(".weight")] + ".weight_scale_inv", scale_fp32)``; kept tensors pass
   through as ``(name, tensor)``. Non-finite values raise ``ValueError`` naming the tensor.
   ``Fp8SyncConfig.backend`` picks the quantizer: ``"auto"`` (default) runs Transformer
   Engine's blockwise quantizer when it is importable, the tensor is on CUDA and the
   request is one TE implements (family ``"c"``, 128x128 tiles; bit-identical to the torch
   reference, ``tests/gpu/test_te_backend.py``), else the torch reference; ``"te"`` and
   ``"torch"`` force one (:func:`nemo_ais.fp8.te_backend.use_te`).

One tensor at a time: the stream holds at most one quantized tensor (and its scale)
and drops its own reference to each input before asking for the next, so its peak extra
memory is one tensor's FP8 codes + scales + the fp32 working copy of that tensor.
:func:`plan_fp8_sync` gives the dry-run report (what is quantized or kept and why,
bytes before/after) without quantizing anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_ais.config import require_config
from nemo_ais.fp8.checks import check_regexes
from nemo_ais.fp8.quant import check_finite, quantize_blockwise

__all__ = [
    "Fp8SyncConfig",
    "Fp8SyncPlan",
    "PlanEntry",
    "fp8_weight_stream",
    "plan_fp8_sync",
    "plan_tensor",
    "scale_name",
]

SCALE_SUFFIX = ".weight_scale_inv"
_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW_PARALLEL = ("o_proj", "down_proj")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ROUTER_RE = re.compile(r"\.mlp\.(gate|shared_expert_gate)\.weight$")
_NORM_RE = re.compile(r"norm[^.]*\.weight$|\.ln_[^.]*\.weight$")
_FP8_BYTES = 1
_SCALE_BYTES = 4


class Fp8SyncConfig(BaseModel):
    """Which weights the refit stream quantizes, and how (``policy.generation.fp8``-like)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    enabled: bool = Field(True, description="Quantize at all; False passes every tensor through.")
    block: tuple[int, int] = Field(
        (128, 128), description="Weight tile [out, in]; vLLM block-FP8 uses 128x128."
    )
    family: Literal["a", "b", "c"] = Field(
        "a",
        description="Scale formula family (docs/low_precision.md); 'a' is what vLLM itself uses.",
    )
    ue8m0: bool = Field(False, description="Power-of-two scales (DeepGEMM UE8M0 path).")
    eps: float = Field(1e-4, ge=0.0, description="Floor of the per-tile amax.")
    num_first_layers_in_bf16: int = Field(
        0, ge=0, description="Keep decoder layers [0, n) in BF16."
    )
    num_last_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the last n decoder layers in BF16 (needs num_layers)."
    )
    num_layers: int | None = Field(
        None, ge=1, description="Decoder layer count; required by num_last_layers_in_bf16."
    )
    keep_patterns: tuple[str, ...] = Field(
        (), description="Regexes (re.search on the HF name) of extra tensors kept in BF16."
    )
    tp_size: int = Field(1, ge=1, description="vLLM tensor-parallel size (shard check).")
    head_dim: int | None = Field(
        None,
        ge=1,
        description="Attention head dim; if set, K/V with fewer KV heads than tp_size are "
        "checked as replicated (one head per rank), as vLLM does.",
    )
    check_finite: bool = Field(
        True, description="Also refuse NaN/Inf in tensors kept in BF16 (one extra pass)."
    )
    backend: Literal["auto", "torch", "te"] = Field(
        "auto",
        description="Quantizer: 'auto' = Transformer Engine when importable, on CUDA and "
        "family 'c' with 128x128 tiles (same bits as the torch reference), else torch; "
        "'te' requires TE (pip install 'nemo-ais[te]'), 'torch' never uses it.",
    )

    @field_validator("keep_patterns")
    @classmethod
    def _compile_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_regexes(patterns, "keep_patterns")

    @field_validator("block")
    @classmethod
    def _positive_block(cls, block: tuple[int, int]) -> tuple[int, int]:
        if min(block) <= 0:
            raise ValueError(f"block={block} is invalid: expected two positive ints")
        return block

    @model_validator(mode="after")
    def _te_implements_family_c(self) -> Fp8SyncConfig:
        if self.backend == "te" and (self.family != "c" or tuple(self.block) != (128, 128)):
            raise ValueError(
                f"backend='te' with family={self.family!r} block={tuple(self.block)} is "
                "invalid: Transformer Engine implements family 'c' with 128x128 tiles only "
                "(use backend 'auto' or 'torch' for the others)"
            )
        return self

    @model_validator(mode="after")
    def _last_layers_need_count(self) -> Fp8SyncConfig:
        if self.num_last_layers_in_bf16 and self.num_layers is None:
            raise ValueError(
                f"num_last_layers_in_bf16={self.num_last_layers_in_bf16} needs num_layers "
                "(the stream sees one tensor at a time and cannot count the layers)"
            )
        return self


@dataclass(frozen=True)
class PlanEntry:
    """One tensor of the dry-run plan: what happens to it, why, and its bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    action: Literal["quantize", "keep"]
    reason: str
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class Fp8SyncPlan:
    """Dry-run report of a weight sync; ``str(plan)`` is a markdown table plus totals."""

    entries: tuple[PlanEntry, ...]

    @property
    def bytes_before(self) -> int:
        """Bytes of the tensors as the trainer holds them."""
        return sum(e.bytes_before for e in self.entries)

    @property
    def bytes_after(self) -> int:
        """Bytes sent to the engine (FP8 codes + fp32 scales, kept tensors unchanged)."""
        return sum(e.bytes_after for e in self.entries)

    @property
    def n_quantized(self) -> int:
        """Number of tensors quantized to FP8."""
        return sum(e.action == "quantize" for e in self.entries)

    def to_markdown(self) -> str:
        """The plan as a markdown table, one row per tensor, then a totals line."""
        rows = [
            "| tensor | shape | dtype | action | reason | bytes before | bytes after |",
            "|---|---|---|---|---|---:|---:|",
        ]
        for e in self.entries:
            dtype = str(e.dtype).removeprefix("torch.")
            rows.append(
                f"| {e.name} | {list(e.shape)} | {dtype} | {e.action} | {e.reason} "
                f"| {e.bytes_before} | {e.bytes_after} |"
            )
        ratio = self.bytes_after / self.bytes_before if self.bytes_before else 1.0
        rows.append(
            f"\n{self.n_quantized} of {len(self.entries)} tensors quantized; "
            f"{self.bytes_before} -> {self.bytes_after} bytes ({ratio:.3f}x)"
        )
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.to_markdown()


def scale_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``...q_proj.weight_scale_inv``."""
    return name.removesuffix(".weight") + SCALE_SUFFIX


def _layer_index(name: str) -> int | None:
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else None


def _projection(name: str) -> str | None:
    """The linear projection a ``*.weight`` belongs to (``q_proj`` ...), else None."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in _COLUMN_PARALLEL + _ROW_PARALLEL:
        return parts[-2]
    return None


def _keep_reason(name: str, shape: tuple[int, ...], config: Fp8SyncConfig) -> str | None:
    """Why ``name`` stays in BF16, or None if it is quantized. Rules in priority order."""
    layer = _layer_index(name)
    n_last = config.num_last_layers_in_bf16
    checks = (
        (not config.enabled, "fp8 sync disabled"),
        (not name.endswith(".weight"), "not a weight (bias or buffer)"),
        ("embed_tokens" in name or "embeddings" in name, "embedding"),
        ("lm_head" in name, "lm_head"),
        (_NORM_RE.search(name) is not None, "norm"),
        (_ROUTER_RE.search(name) is not None, "MoE router"),
        (any(re.search(p, name) for p in config.keep_patterns), "matches keep_patterns"),
        (
            layer is not None and layer < config.num_first_layers_in_bf16,
            f"first {config.num_first_layers_in_bf16} layers in BF16",
        ),
        (
            layer is not None and n_last > 0 and layer >= (config.num_layers or 0) - n_last,
            f"last {n_last} layers in BF16",
        ),
        (_projection(name) is None, "not a linear projection"),
        (len(shape) != 2, f"{len(shape)}-D, expected a 2-D [out, in] projection"),
    )
    return next((reason for hit, reason in checks if hit), None)


def _check_tp_shard(name: str, shape: tuple[int, ...], config: Fp8SyncConfig) -> None:
    """Each rank's shard (out/tp or in/tp) must be whole and a multiple of the block."""
    tp = config.tp_size
    if tp == 1:
        return
    proj = _projection(name)
    column = proj in _COLUMN_PARALLEL
    dim = 0 if column else 1
    size, block = shape[dim], config.block[dim]
    kind = "column-parallel out" if column else "row-parallel in"
    shard = size / tp
    if column and proj in ("k_proj", "v_proj") and config.head_dim:
        n_heads = size // config.head_dim
        if n_heads < tp:  # vLLM replicates KV heads: every rank holds one head
            shard = config.head_dim
    if shard != int(shard) or int(shard) % block:
        raise ValueError(
            f"{name}: shape {list(shape)} with tp_size={tp}: {kind} dim {dim} of size "
            f"{size} gives a per-rank shard of {shard:g}, expected a multiple of the "
            f"{block} block (each rank quantizes its own shard); keep this tensor in BF16 "
            "(keep_patterns) or use another tp_size"
        )


def plan_tensor(
    name: str, shape: Iterable[int], dtype: torch.dtype, config: Fp8SyncConfig
) -> PlanEntry:
    """Decide quantize/keep for one tensor; checks the TP shard of quantized tensors.

    Raises:
        ValueError: a quantized tensor whose per-rank shard is not a multiple of the block.
        TypeError: ``config`` is not an :class:`Fp8SyncConfig` (a dict: ``Fp8SyncConfig(**d)``).
    """
    require_config(config, Fp8SyncConfig, "plan_tensor(config)")
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    before = numel * torch.empty((), dtype=dtype).element_size()
    reason = _keep_reason(name, shape, config)
    if reason is not None:
        return PlanEntry(name, shape, dtype, "keep", reason, before, before)
    _check_tp_shard(name, shape, config)
    bn, bk = config.block
    n_scales = -(-shape[0] // bn) * -(-shape[1] // bk)
    after = numel * _FP8_BYTES + n_scales * _SCALE_BYTES
    return PlanEntry(name, shape, dtype, "quantize", "linear projection", before, after)


def plan_fp8_sync(
    named_tensors: Iterable[tuple[str, torch.Tensor]], config: Fp8SyncConfig
) -> Fp8SyncPlan:
    """Dry run: the plan of every tensor (tensors may be on the ``meta`` device).

    Raises:
        ValueError: every TP-shard failure at once, one line per tensor.
        TypeError: ``config`` is not an :class:`Fp8SyncConfig` (a dict: ``Fp8SyncConfig(**d)``).
    """
    require_config(config, Fp8SyncConfig, "plan_fp8_sync(config)")
    entries, errors = [], []
    for name, tensor in named_tensors:
        try:
            entries.append(plan_tensor(name, tensor.shape, tensor.dtype, config))
        except ValueError as err:
            errors.append(str(err))
    if errors:
        raise ValueError(f"{len(errors)} tensor(s) fail the TP check:\n" + "\n".join(errors))
    return Fp8SyncPlan(tuple(entries))


def fp8_weight_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], config: Fp8SyncConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` into vLLM ``load_weights`` pairs, one tensor at a time.

    Args:
        named_tensors: unfused HF names and full (unsharded) tensors, e.g.
            ``model.layers.0.self_attn.q_proj.weight`` ``[N, K]`` bf16.
        config: what to quantize and how.

    Yields:
        For a quantized weight: ``(name, q)`` with ``q`` ``torch.float8_e4m3fn`` ``[N, K]``,
        then ``(scale_name(name), s)`` with ``s`` fp32 ``[ceil(N/128), ceil(K/128)]``.
        For a kept tensor: ``(name, tensor)`` unchanged (same object).

    Raises:
        ValueError: NaN/Inf in any tensor (named, with count and first index) or a TP
            shard that is not a multiple of the block; raised before that tensor is yielded.
        TypeError: at the call, not at the first ``next``: ``config`` is not an
            :class:`Fp8SyncConfig` (a dict: ``Fp8SyncConfig(**d)``).
    """
    require_config(config, Fp8SyncConfig, "fp8_weight_stream(config)")
    return _stream(named_tensors, config)


def _stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], config: Fp8SyncConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        entry = plan_tensor(name, tensor.shape, tensor.dtype, config)
        if entry.action == "keep":
            if config.check_finite:
                check_finite(tensor, name, action="refusing to sync NaN/Inf into the engine")
            yield name, tensor
            del tensor
            continue
        q, s = quantize_blockwise(
            tensor,
            config.block,
            config.family,
            config.eps,
            config.ue8m0,
            name=name,
            backend=config.backend,
        )
        del tensor  # the input is no longer needed by the stream
        yield name, q
        del q  # at most one quantized tensor is alive in the stream at any time
        yield scale_name(name), s
        del s
