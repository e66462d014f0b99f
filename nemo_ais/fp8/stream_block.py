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
"""Weight-sync ("refit") stream of NVFP4 and MXFP8 weights for vLLM's ModelOpt loaders.

The block-scaled sibling of :mod:`nemo_ais.fp8.stream`: a BF16 trainer's unfused HF
``(name, tensor)`` pairs become the pairs vLLM's ModelOpt NVFP4 / MXFP8 linear (and
per-expert MoE) loaders take, one tensor at a time. For a quantized ``<m>.weight``
``[out, in]``:

* ``nvfp4_w4a16``: ``<m>.weight`` uint8 ``[out, in/2]`` (two E2M1 codes a byte, the even
  element in the low nibble), ``<m>.weight_scale`` float8_e4m3fn ``[out, in/16]``,
  ``<m>.weight_scale_2`` fp32 0-dim (``amax / (6 * 448)``);
* ``nvfp4_w4a4``: the same, then ``<m>.input_scale`` fp32 0-dim (``input_amax / (6 * 448)``,
  from a calibrated static input amax);
* ``mxfp8``: ``<m>.weight`` float8_e4m3fn ``[out, in]``, then ``<m>.weight_scale`` (or
  ``weight_scale_from_checkpoint``, ``mxfp8_scale_name``) uint8 E8M0 ``[out, in/32]``.

1. Plan each tensor (:func:`plan_block_tensor`): the FP8 stream's keep rules (embeddings,
   ``lm_head``, norms, MoE routers, biases, ``keep_patterns`` regexes, the first/last N
   decoder layers), plus NeMo-RL's two exclusion forms: ``ignore``, ModelOpt real-quant
   fnmatch patterns (``policy.generation.real_quant_ignore``; matched, as NeMo-RL matches
   them, against the name, the name without its ``.weight`` suffix, and both with the
   ``model.`` prefix added or removed) and ``ignored_layer_kws``, substrings
   (``vllm_cfg.quantization_ignored_layer_kws``).
2. Check tensor parallelism: each rank's in-dim shard (``in`` for column-parallel
   q/k/v/gate/up, ``in / tp`` for row-parallel o/down) must be a multiple of the block
   (16 NVFP4, 32 MXFP8).
3. NVFP4, fused layers: vLLM loads q/k/v_proj into one ``qkv_proj`` and gate/up_proj (also
   each expert's) into one ``gate_up_proj``, takes the max of ``weight_scale_2`` (and
   ``input_scale``) over the shards and does not rescale the block scales. So every shard
   of a fused layer is quantized with the group's amax (:func:`~nemo_ais.fp8.formats.
   shared_weight_amax`): the stream holds a group's shards until the last one arrives,
   then quantizes and yields them in arrival order. Siblings must agree on quantize/keep.
   ``input_scale`` (W4A4) is ``max`` over the group of the calibrated input amax.
4. Quantize with :func:`nemo_ais.fp8.quantize_nvfp4` / :func:`nemo_ais.fp8.quantize_mxfp8`.
   MXFP8 scale byte 0 (an all-zero block) becomes ``mxfp8_zero_scale_byte`` (1 = NeMo-RL
   main's rewrite for TRT-LLM's kernel; the codes are 0, so the values do not change).

Bounded memory: the stream holds references to at most ``max_open_groups`` fused groups'
input shards (Megatron-Bridge and HF state dicts emit a layer's q/k/v and gate/up
together: one open group) plus one tensor's quantized outputs. :class:`BlockWeightStream`
is the stateful form for a refit that arrives in chunks (one vLLM ``load_weights`` call per
chunk, a fused group may straddle two): :meth:`BlockWeightStream.end_chunk` copies the
shards it still holds, :meth:`BlockWeightStream.close` refuses an unfinished group.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_ais.config import require_config
from nemo_ais.fp8.checks import check_amax, check_finite, check_regexes
from nemo_ais.fp8.formats import fused_shard_group
from nemo_ais.fp8.mxfp8 import MX_BLOCK, quantize_mxfp8
from nemo_ais.fp8.nvfp4 import NVFP4_BLOCK, nvfp4_global_scale, quantize_nvfp4
from nemo_ais.fp8.stream import (
    _COLUMN_PARALLEL,
    Fp8SyncPlan,
    PlanEntry,
    _keep_reason,
    _projection,
)

__all__ = [
    "BLOCK_SYNC_FORMATS",
    "BlockSyncConfig",
    "BlockWeightStream",
    "block_weight_stream",
    "plan_block_sync",
    "plan_block_tensor",
]

BLOCK_SYNC_FORMATS = ("nvfp4_w4a16", "nvfp4_w4a4", "mxfp8")
_FUSED_SIBLINGS = {"q_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj")}
_FUSED_SIBLINGS.update({p: _FUSED_SIBLINGS["q_proj"] for p in ("k_proj", "v_proj")})
_FUSED_SIBLINGS["up_proj"] = _FUSED_SIBLINGS["gate_proj"]
_IGNORE_SUFFIXES = (".weight", ".weight_scale", ".weight_scale_2", ".input_scale")
_FP32_BYTES = 4
_REFUSE_NAN = "refusing to sync NaN/Inf into the engine"


class BlockSyncConfig(BaseModel):
    """Which weights the NVFP4 / MXFP8 refit stream quantizes, and how (module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    enabled: bool = Field(True, description="Quantize at all; False passes every tensor through.")
    format: Literal["nvfp4_w4a16", "nvfp4_w4a4", "mxfp8"] = Field(
        "nvfp4_w4a16",
        description="The engine's weight format: NVFP4 weights with BF16 (w4a16) or NVFP4 "
        "(w4a4, + input_scale) activations, or MXFP8 (W8A8).",
    )
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
    ignore: tuple[str, ...] = Field(
        (),
        description="ModelOpt real-quant fnmatch patterns kept in BF16, as NeMo-RL's "
        "policy.generation.real_quant_ignore (its default keeps attention, lm_head and "
        "routers); matched on the name, without .weight, and with 'model.' toggled.",
    )
    ignored_layer_kws: tuple[str, ...] = Field(
        (),
        description="Substrings of names kept in BF16, as NeMo-RL's "
        "vllm_cfg.quantization_ignored_layer_kws.",
    )
    tp_size: int = Field(1, ge=1, description="vLLM tensor-parallel size (shard check).")
    nvfp4_rows_per_block: Literal[1, 16] = Field(
        1,
        description="NVFP4 weight blocks: 1 = 1x16 (ModelOpt export), 16 = Transformer "
        "Engine's 16x16 tiles (still valid 1x16 NVFP4).",
    )
    mxfp8_zero_scale_byte: Literal[0, 1] = Field(
        1,
        description="E8M0 byte of an all-zero MXFP8 block: 1 = NeMo-RL main's rewrite "
        "(TRT-LLM rejects 0), 0 = what FlashInfer emits; the codes are 0 either way.",
    )
    mxfp8_scale_name: Literal["weight_scale", "weight_scale_from_checkpoint"] | None = Field(
        None,
        description="Name of the MXFP8 scale: weight_scale (vLLM's checkpoint loader) or "
        "weight_scale_from_checkpoint (NeMo-RL main's MXFP8 refit); None = weight_scale in "
        "the stream, weight_scale_from_checkpoint in the NeMo-RL refit hook.",
    )
    max_open_groups: int = Field(
        2,
        ge=1,
        description="Fused groups (q/k/v, gate/up) whose shards the stream may hold at once "
        "(memory bound); more means the tensors arrive interleaved across layers.",
    )
    input_amax_file: str | None = Field(
        None,
        description="JSON {module or fused group name: calibrated input amax} for "
        "nvfp4_w4a4 in the NeMo-RL refit hook (the stream takes input_amax directly).",
    )
    check_finite: bool = Field(
        True, description="Also refuse NaN/Inf in tensors kept in BF16 (one extra pass)."
    )

    @field_validator("keep_patterns")
    @classmethod
    def _compile_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_regexes(patterns, "keep_patterns")

    @model_validator(mode="after")
    def _last_layers_need_count(self) -> BlockSyncConfig:
        if self.num_last_layers_in_bf16 and self.num_layers is None:
            raise ValueError(
                f"num_last_layers_in_bf16={self.num_last_layers_in_bf16} needs num_layers "
                "(the stream sees one tensor at a time and cannot count the layers)"
            )
        return self

    @property
    def block(self) -> int:
        """Block length along the in-dim: 16 (NVFP4) or 32 (MXFP8)."""
        return MX_BLOCK if self.format == "mxfp8" else NVFP4_BLOCK


def _ignored(name: str, config: BlockSyncConfig) -> str | None:
    """The ``ignore`` pattern or ``ignored_layer_kws`` entry ``name`` matches, else None."""
    kw = next((k for k in config.ignored_layer_kws if k in name), None)
    if kw is not None:
        return f"ignored_layer_kws {kw!r}"
    alternate = name.removeprefix("model.") if name.startswith("model.") else f"model.{name}"
    candidates = []
    for n in (name, alternate):
        candidates.append(n)
        suffix = next((s for s in _IGNORE_SUFFIXES if n.endswith(s)), None)
        if suffix is not None:
            candidates.append(n.removesuffix(suffix))
    hit = next((p for p in config.ignore if any(fnmatchcase(c, p) for c in candidates)), None)
    return None if hit is None else f"ignore {hit!r}"


def _keep(name: str, shape: tuple[int, ...], config: BlockSyncConfig) -> str | None:
    """Why ``name`` stays in BF16, or None if it is quantized (FP8 rules, then NeMo-RL's)."""
    if not config.enabled:
        return "block sync disabled"
    return _keep_reason(name, shape, config) or _ignored(name, config)


def _check_tp_shard(name: str, shape: tuple[int, ...], config: BlockSyncConfig) -> None:
    """Each rank's in-dim shard must be a whole multiple of the block."""
    column = _projection(name) in _COLUMN_PARALLEL
    k = shape[1]
    shard = k if column else k / config.tp_size
    if shard != int(shard) or int(shard) % config.block:
        kind = (
            "column-parallel (whole in dim)" if column else f"row-parallel (in / {config.tp_size})"
        )
        raise ValueError(
            f"{name}: shape {list(shape)} with tp_size={config.tp_size}: the {kind} shard of "
            f"the in dim is {shard:g}, expected a multiple of {config.block} ({config.format} "
            "scales blocks along the in dim of each rank's shard); keep this tensor in BF16 "
            "(ignore / keep_patterns) or use another tp_size"
        )


def _bytes_after(numel: int, config: BlockSyncConfig) -> int:
    if config.format == "mxfp8":
        return numel + numel // MX_BLOCK
    n_scalars = 2 if config.format == "nvfp4_w4a4" else 1
    return numel // 2 + numel // NVFP4_BLOCK + n_scalars * _FP32_BYTES


def plan_block_tensor(
    name: str, shape: Iterable[int], dtype: torch.dtype, config: BlockSyncConfig
) -> PlanEntry:
    """Decide quantize/keep for one tensor; checks the TP shard of quantized tensors.

    Raises:
        ValueError: a quantized tensor whose per-rank in-dim shard is not a multiple of
            the block.
        TypeError: ``config`` is not a :class:`BlockSyncConfig`.
    """
    require_config(config, BlockSyncConfig, "plan_block_tensor(config)")
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    before = numel * torch.empty((), dtype=dtype).element_size()
    reason = _keep(name, shape, config)
    if reason is not None:
        return PlanEntry(name, shape, dtype, "keep", reason, before, before)
    _check_tp_shard(name, shape, config)
    after = _bytes_after(numel, config)
    return PlanEntry(
        name, shape, dtype, "quantize", f"linear projection ({config.format})", before, after
    )


def plan_block_sync(
    named_tensors: Iterable[tuple[str, torch.Tensor]], config: BlockSyncConfig
) -> Fp8SyncPlan:
    """Dry run: the plan of every tensor (tensors may be on the ``meta`` device).

    Raises:
        ValueError: every TP-shard failure at once, one line per tensor.
        TypeError: ``config`` is not a :class:`BlockSyncConfig`.
    """
    require_config(config, BlockSyncConfig, "plan_block_sync(config)")
    entries, errors = [], []
    for name, tensor in named_tensors:
        try:
            entries.append(plan_block_tensor(name, tensor.shape, tensor.dtype, config))
        except ValueError as err:
            errors.append(str(err))
    if errors:
        raise ValueError(f"{len(errors)} tensor(s) fail the TP check:\n" + "\n".join(errors))
    return Fp8SyncPlan(tuple(entries))


def _siblings(name: str) -> tuple[str, ...]:
    """The weight names of ``name``'s fused vLLM layer, ``name`` included (itself if none)."""
    proj = _projection(name)
    if proj not in _FUSED_SIBLINGS:
        return (name,)
    prefix = name.removesuffix(f"{proj}.weight")
    return tuple(f"{prefix}{p}.weight" for p in _FUSED_SIBLINGS[proj])


class BlockWeightStream:
    """The stream's state across chunks of one refit: fused groups still waiting for shards.

    :meth:`push` one ``(name, tensor)`` at a time (it yields the pairs that are ready),
    :meth:`end_chunk` when the caller's tensors are about to become invalid (copies the held
    shards), :meth:`close` at the end of a refit (raises on an unfinished group).
    :func:`block_weight_stream` is ``push`` for each pair, then ``close``.

    Args:
        config: what to quantize and how.
        input_amax: ``{module or fused group name: calibrated input amax}`` (``nvfp4_w4a4``);
            a module's input amax is the max of its group members' entries and the group's
            own entry (``model.layers.0.self_attn.q_proj`` or ``...self_attn.qkv_proj``).

    Raises:
        TypeError: ``config`` is not a :class:`BlockSyncConfig`.
        ValueError: an ``input_amax`` value that is not one finite value >= 0.
    """

    def __init__(
        self,
        config: BlockSyncConfig,
        input_amax: Mapping[str, float | torch.Tensor] | None = None,
    ) -> None:
        require_config(config, BlockSyncConfig, "BlockWeightStream(config)")
        self.config = config
        self.input_amax = {
            k: check_amax(v, f"input_amax[{k!r}]") for k, v in (input_amax or {}).items()
        }
        self._open: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def open_groups(self) -> dict[str, tuple[str, ...]]:
        """``{fused group: names of the shards held}`` still waiting for siblings."""
        return {group: tuple(shards) for group, shards in self._open.items()}

    def plan(self, name: str, tensor: torch.Tensor) -> PlanEntry:
        """:func:`plan_block_tensor` for ``tensor`` under this stream's config."""
        return plan_block_tensor(name, tensor.shape, tensor.dtype, self.config)

    def push(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The pairs ``(name, tensor)`` completes: itself kept, its quantized pairs, or a group.

        Raises:
            ValueError: NaN/Inf (named, count and first index), a TP shard that is not a
                multiple of the block, fused siblings that disagree on quantize/keep, too
                many open groups, or (W4A4) no calibrated input amax for the module.
        """
        entry = self.plan(name, tensor)
        if entry.action == "keep":
            if self.config.check_finite:
                check_finite(tensor, name, action=_REFUSE_NAN)
            yield name, tensor
            return
        if self.config.format == "mxfp8":
            yield from self._mxfp8_pairs(name, tensor)
            return
        siblings = self._check_siblings(name, tensor)
        group = fused_shard_group(name)
        held = self._open.setdefault(group, {})
        held[name] = tensor
        del tensor
        if set(held) != set(siblings):
            self._check_open_groups(group)
            return
        shards = self._open.pop(group)
        amaxes = {shard_name: _amax(t) for shard_name, t in shards.items()}
        for shard_name, amax in amaxes.items():  # NaN/Inf reach the amax: name the shard
            check_finite(shards[shard_name], shard_name, amax=amax, action=_REFUSE_NAN)
        weight_amax = torch.stack(list(amaxes.values())).amax()
        input_scale = self._input_scale(group, tuple(shards))
        for shard_name in list(shards):
            yield from self._nvfp4_pairs(
                shard_name, shards.pop(shard_name), weight_amax, input_scale
            )

    def end_chunk(self) -> None:
        """Copy the shards held for open groups (the caller's buffers are about to be reused)."""
        for shards in self._open.values():
            for shard_name, t in shards.items():
                shards[shard_name] = t.clone()

    def close(self) -> None:
        """End of a refit: raise if a fused group never received all its shards.

        Raises:
            ValueError: naming each unfinished group, the shards seen and the missing ones.
        """
        if not self._open:
            return
        lines = [
            f"{group}: got {sorted(shards)}, missing "
            f"{sorted(set(_siblings(next(iter(shards)))) - set(shards))}"
            for group, shards in self._open.items()
        ]
        self._open.clear()
        raise ValueError(
            f"{len(lines)} fused layer(s) incomplete at the end of the refit (NVFP4 shards "
            "of one vLLM layer share one global scale, so none was sent):\n" + "\n".join(lines)
        )

    def _check_siblings(self, name: str, tensor: torch.Tensor) -> tuple[str, ...]:
        siblings = _siblings(name)
        kept = {s: _keep(s, tuple(tensor.shape), self.config) for s in siblings}
        kept = {s: reason for s, reason in kept.items() if reason is not None}
        if kept:
            raise ValueError(
                f"{name} is quantized but its fused siblings {kept} are kept in BF16: vLLM "
                f"loads {list(siblings)} as one layer ({fused_shard_group(name)}), quantized "
                "or not; make the exclusions (ignore, ignored_layer_kws, keep_patterns) "
                "cover all of them or none"
            )
        return siblings

    def _check_open_groups(self, group: str) -> None:
        if len(self._open) > self.config.max_open_groups:
            open_now = {g: sorted(s) for g, s in self._open.items()}
            self._open.pop(group)
            raise ValueError(
                f"{len(open_now)} fused layers are open at once ({open_now}), expected at "
                f"most max_open_groups={self.config.max_open_groups}: the refit interleaves "
                "the shards of several layers (each is held until its last shard arrives); "
                "emit each layer's q/k/v and gate/up together or raise max_open_groups"
            )

    def _input_scale(self, group: str, shards: tuple[str, ...]) -> torch.Tensor | None:
        if self.config.format != "nvfp4_w4a4":
            return None
        keys = [group, *(s.removesuffix(".weight") for s in shards)]
        found = [self.input_amax[k] for k in keys if k in self.input_amax]
        if not found:
            raise ValueError(
                f"{shards[0]}: nvfp4_w4a4 needs the calibrated input amax of one of "
                f"{keys} (input_amax, or BlockSyncConfig.input_amax_file in the refit hook); "
                "input_scale = amax / (6 * 448)"
            )
        return nvfp4_global_scale(torch.stack(found).amax())

    def _nvfp4_pairs(self, name, tensor, weight_amax, input_scale):
        rows = self.config.nvfp4_rows_per_block
        q = quantize_nvfp4(tensor, weight_amax, rows_per_block=rows, name=name)
        del tensor
        module = name.removesuffix(".weight")
        pairs = [
            (name, q.data),
            (f"{module}.weight_scale", q.block_scale),
            (f"{module}.weight_scale_2", q.global_scale),
        ]
        if input_scale is not None:
            pairs.append((f"{module}.input_scale", input_scale.clone()))
        del q
        while pairs:  # hand each tensor over and drop the stream's reference to it
            yield pairs.pop(0)

    def _mxfp8_pairs(self, name, tensor):
        q = quantize_mxfp8(tensor, name=name)
        del tensor
        scale = q.scale
        if self.config.mxfp8_zero_scale_byte:
            scale.masked_fill_(scale == 0, self.config.mxfp8_zero_scale_byte)
        scale_name = self.config.mxfp8_scale_name or "weight_scale"
        pairs = [(name, q.data), (f"{name.removesuffix('.weight')}.{scale_name}", scale)]
        del q, scale
        while pairs:
            yield pairs.pop(0)


def _amax(t: torch.Tensor) -> torch.Tensor:
    """``max |t|`` as 0-dim fp32 (0 for an empty tensor; NaN/Inf propagate to the quantizer)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=t.device)
    lo, hi = torch.aminmax(t)
    return torch.maximum(hi, lo.neg()).to(torch.float32)


def block_weight_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    config: BlockSyncConfig,
    *,
    input_amax: Mapping[str, float | torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` into vLLM ModelOpt ``load_weights`` pairs (module doc table).

    Args:
        named_tensors: unfused HF names and full (unsharded) tensors, e.g.
            ``model.layers.0.self_attn.q_proj.weight`` ``[N, K]`` bf16; MoE experts by
            per-expert names (``...mlp.experts.3.gate_proj.weight``).
        config: what to quantize and how.
        input_amax: calibrated input amax per module or fused group (``nvfp4_w4a4``;
            :class:`BlockWeightStream`).

    Yields:
        Kept tensors as ``(name, tensor)`` (the same object); for each quantized weight
        the pairs of the module doc table, the shards of a fused layer (NVFP4) together
        when its last shard has arrived, sharing one ``weight_scale_2`` / ``input_scale``.

    Raises:
        ValueError: what :meth:`BlockWeightStream.push` raises (before that tensor is
            yielded), and at the end a fused layer that never received all its shards.
        TypeError: at the call, not at the first ``next``: ``config`` is not a
            :class:`BlockSyncConfig` (a dict: ``BlockSyncConfig(**d)``).
    """
    stream = BlockWeightStream(config, input_amax)
    return _stream(named_tensors, stream)


def _stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], stream: BlockWeightStream
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        yield from stream.push(name, tensor)
        del tensor
    stream.close()
