# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The refit stream: a BF16 trainer's weights as the tensors vLLM's loader takes, any format.

At every weight sync the trainer's unfused HF ``(name, tensor)`` pairs become the pairs ``model.load_weights`` of a
low-precision vLLM engine expects, one tensor at a time; the format record says what a quantized
``<m>.weight [out, in]`` becomes (:attr:`~nemo_ais.formats.base.Format.refit_pairs`):

* ``fp8``: ``weight`` float8_e4m3fn, ``weight_scale_inv`` fp32 ``[ceil(out/128), ceil(in/128)]``;
* ``nvfp4_w4a16``: ``weight`` uint8 ``[out, in/2]``, ``weight_scale`` float8_e4m3fn ``[out, in/16]``, ``weight_scale_2``
  fp32 0-dim; ``nvfp4_w4a4`` adds ``input_scale``;
* ``mxfp8``: ``weight`` float8_e4m3fn, ``weight_scale`` (or ``mxfp8_scale_name``) uint8 E8M0.

1. Plan each tensor (:func:`plan_tensor`): quantize the linear projections (MoE experts included); keep the rest, and
   what :class:`~nemo_ais.rules.keep_bf16.KeepInBf16` keeps (the rule the twin and the offline check call), in BF16.
2. Check each TP rank's shard is whole and a block multiple; all formats but FP8 also check the whole in dim of a
   column-parallel weight.
3. Fused shards sharing one global scale (NVFP4 ``qkv_proj`` / ``gate_up_proj``) are held until the group is complete,
   then quantized with the group's amax, in arrival order.
4. Non-finite values raise ``ValueError`` naming the tensor, before it is yielded.
5. MoE experts (``num_experts`` set): the experts of one layer and projection are held until all have arrived, then
   quantized as one ``[E, N, K]`` stack and sent under their own names (:mod:`nemo_ais.refit.experts`).

Memory: one tensor's outputs plus at most ``max_open_groups`` held groups; with ``num_experts``, also one layer's held
experts (HF order interleaves a layer's gate, up and down experts) and one stack's outputs (each expert's tensors are
views of them). :class:`RefitStream` is the stateful form for a chunked refit; :func:`plan_refit` the dry run.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from nemo_ais.config import require_config
from nemo_ais.formats.checks import check_amax, check_finite, check_last_dim
from nemo_ais.formats.nvfp4 import nvfp4_global_scale
from nemo_ais.formats.registry import get_format
from nemo_ais.refit.config import BlockSyncConfig as BlockSyncConfig, Fp8SyncConfig as Fp8SyncConfig, RefitConfig
from nemo_ais.refit.experts import ExpertStack, ExpertStacks, expert_amax, stack_experts
from nemo_ais.rules.vllm_layers import COLUMN_PARALLEL, fused_shard_group, fused_siblings, projection

_REFUSE_NAN = "refusing to sync NaN/Inf into the engine"
_NORM_RE = re.compile(r"norm[^.]*\.weight$|\.ln_[^.]*\.weight$")


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
class RefitPlan:
    """Dry-run report of a weight sync; ``str(plan)`` is a markdown table plus totals."""

    entries: tuple[PlanEntry, ...]

    @property
    def bytes_before(self) -> int:
        """Bytes as the trainer holds them."""
        return sum(e.bytes_before for e in self.entries)

    @property
    def bytes_after(self) -> int:
        """Bytes sent to the engine (codes + scales, kept tensors unchanged)."""
        return sum(e.bytes_after for e in self.entries)

    @property
    def n_quantized(self) -> int:
        """Number of tensors quantized."""
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

    __str__ = to_markdown


def scale_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``...q_proj.weight_scale_inv`` (FP8)."""
    return name.removesuffix(".weight") + ".weight_scale_inv"


def _keep(name: str, shape: tuple[int, ...], config: RefitConfig) -> str | None:
    """Why ``name`` stays in BF16, or None if it is quantized. Rules in priority order."""
    checks = (
        (not config.enabled, f"{config.format} refit disabled"),
        (not name.endswith(".weight"), "not a weight (bias or buffer)"),
        ("embed_tokens" in name or "embeddings" in name, "embedding"),
        ("lm_head" in name, "lm_head"),
        (_NORM_RE.search(name) is not None, "norm"),
    )
    reason = next((why for hit, why in checks if hit), None) or config.keep_rule().reason(name)
    if reason is not None:
        return reason
    if projection(name) is None:
        return "not a linear projection"
    if len(shape) != 2:
        return f"{len(shape)}-D, expected a 2-D [out, in] projection"
    return None


def _check_tp_shard(name: str, shape: tuple[int, ...], config: RefitConfig) -> None:
    """Each rank's shard: the split dim whole and a multiple of the block (module doc, 2)."""
    expert = ".experts." in name and config.expert_tp_size is not None
    tp, fmt = (config.expert_tp_size if expert else config.tp_size), get_format(config.format)
    proj = projection(name)
    column = proj in COLUMN_PARALLEL
    for dim in (0, 1):
        split = tp > 1 and (dim == 0) == column
        if not split and (fmt.pads or dim == 0):
            continue
        size, block = shape[dim], config.weight_block[dim]
        shard = size / tp if split else size
        if column and dim == 0 and proj in ("k_proj", "v_proj") and config.head_dim:
            if size // config.head_dim < tp:  # vLLM replicates KV heads: one head per rank
                shard = config.head_dim
        if shard != int(shard) or int(shard) % block:
            kind, field = ("column" if column else "row"), ("expert_tp_size" if expert else "tp_size")
            kv_hint = proj in ("k_proj", "v_proj") and not config.head_dim
            raise ValueError(
                f"{name}: shape {list(shape)} with {field}={tp}: {kind}-parallel {'out' if dim == 0 else 'in'} dim "
                f"{dim} of size {size} gives a per-rank shard of {shard:g}, expected a multiple of the {block} block "
                f"({config.format} scales blocks of each rank's shard); keep this tensor in BF16 (keep_patterns / "
                f"ignore) or use another {field}"
                + (" (or set head_dim: vLLM replicates KV heads when tp_size exceeds them)" if kv_hint else "")
            )


def check_siblings(name: str, kept: Callable[[str], str | None]) -> None:
    """Refuse a quantized ``name`` whose fused siblings ``kept`` keeps in BF16 (every format: vLLM has one layer)."""
    siblings = fused_siblings(name)
    reasons = {s: reason for s in siblings if (reason := kept(s)) is not None}
    if reasons:
        raise ValueError(
            f"{name} is quantized but its fused siblings {reasons} are kept in BF16: vLLM loads {list(siblings)} as "
            f"one layer ({fused_shard_group(name)}), quantized or not; make the exclusions (ignore, ignored_layer_kws, "
            "keep_patterns) cover all of them or none"
        )


def plan_tensor(name: str, shape: Iterable[int], dtype: torch.dtype, config: RefitConfig) -> PlanEntry:
    """Quantize or keep one tensor; checks its TP shard (ValueError; TypeError: bad config)."""
    require_config(config, RefitConfig, "plan_tensor(config)")
    shape = tuple(int(s) for s in shape)
    return _plan_entry(name, shape, dtype, config, _keep(name, shape, config))


def _plan_entry(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, config: RefitConfig, reason: str | None
) -> PlanEntry:
    """:func:`plan_tensor` once :func:`_keep` has given ``reason``."""
    numel = math.prod(shape)
    before = numel * dtype.itemsize
    if reason is not None:
        return PlanEntry(name, shape, dtype, "keep", reason, before, before)
    _check_tp_shard(name, shape, config)
    after = get_format(config.format).refit_bytes(numel, shape, config)
    why = f"linear projection ({config.format})"
    return PlanEntry(name, shape, dtype, "quantize", why, before, after)


def plan_refit(named_tensors: Iterable[tuple[str, torch.Tensor]], config: RefitConfig) -> RefitPlan:
    """Dry run: the plan of every tensor (``meta`` will do); ValueError lists every TP failure."""
    require_config(config, RefitConfig, "plan_refit(config)")
    entries, errors = [], []
    for name, tensor in named_tensors:
        try:
            entries.append(entry := plan_tensor(name, tensor.shape, tensor.dtype, config))
            if entry.action == "quantize":
                check_siblings(name, lambda s, shape=entry.shape: _keep(s, shape, config))
        except ValueError as err:
            errors.append(str(err))
    if errors:
        raise ValueError(f"{len(errors)} tensor(s) fail the TP or fused-sibling check:\n" + "\n".join(errors))
    return RefitPlan(tuple(entries))


plan_fp8_sync = plan_block_sync = plan_refit

# Every step refits the same names: one stream's plans serve the next of an equal config
# (planning is ~100 us of Python per tensor; a Qwen3-30B-A3B rank pushes ~18k a refit).
_PLAN_CACHES: OrderedDict[RefitConfig, dict[tuple, PlanEntry | str | None]] = OrderedDict()
_PLAN_CACHE_CONFIGS = 4


def _plans_for(config: RefitConfig) -> dict[tuple, PlanEntry | str | None]:
    """The plan cache of ``config`` (a frozen, hashable model: equal configs share it)."""
    plans = _PLAN_CACHES.pop(config, None)
    _PLAN_CACHES[config] = plans = {} if plans is None else plans
    while len(_PLAN_CACHES) > _PLAN_CACHE_CONFIGS:
        _PLAN_CACHES.popitem(last=False)
    return plans


class RefitStream:
    """The stream's state across chunks of one refit: fused groups still waiting for shards.

    :meth:`push` one pair at a time (yields the pairs that are ready), :meth:`flush` and :meth:`end_chunk` before the
    caller's tensors become invalid, :meth:`close` at the end.

    Args:
        input_amax: ``{module or fused group: calibrated input amax}`` (W4A4); a module takes
            the max of its group's entries.

    Raises:
        TypeError: ``config`` is not a :class:`RefitConfig`. ValueError: a bad ``input_amax``.
    """

    def __init__(self, config: RefitConfig, input_amax: Mapping[str, float | torch.Tensor] | None = None) -> None:
        require_config(config, RefitConfig, f"{type(self).__name__}(config)")
        self.config = config
        self.format = get_format(config.format)
        self.input_amax = {k: _amax_entry(k, v) for k, v in (input_amax or {}).items()}
        self._open: dict[str, dict[str, torch.Tensor]] = {}
        self._plans = _plans_for(config)
        self._stacks = (
            None if config.num_experts is None else ExpertStacks(config.num_experts, self.format.shared_global_scale)
        )

    def plan(self, name: str, tensor: torch.Tensor) -> PlanEntry:
        """:func:`plan_tensor` for ``tensor`` under this stream's config (cached; errors are not)."""
        shape = tuple(tensor.shape)
        key = ("plan", name, shape, tensor.dtype)
        if key not in self._plans:
            reason = self._kept(name, shape)  # an expert stack may have asked it already
            self._plans[key] = _plan_entry(name, shape, tensor.dtype, self.config, reason)
        return self._plans[key]

    def _kept(self, name: str, shape: tuple[int, ...]) -> str | None:
        """:func:`_keep` under this stream's config (cached)."""
        key = ("keep", name, shape)
        if key not in self._plans:
            self._plans[key] = _keep(name, shape, self.config)
        return self._plans[key]

    def check_kept(self, name: str, tensor: torch.Tensor) -> None:
        """What a tensor sent in BF16 is checked for: NaN/Inf with ``check_finite``, else nothing."""
        if self.config.check_finite:
            check_finite(tensor, name, action=_REFUSE_NAN)

    def push(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The pairs ``(name, tensor)`` completes: itself kept, its pairs, a group or a stack.

        Raises:
            ValueError: NaN/Inf, a bad TP shard, fused siblings that disagree, too many open
                groups, or (W4A4) no calibrated input amax for the module.
        """
        entry = self.plan(name, tensor)
        if entry.action == "keep":
            self.check_kept(name, tensor)
            yield name, tensor
            return
        check_last_dim(tensor, name, self.format.k_multiple, self.format.name)  # before an amax is read from it
        check_siblings(name, lambda s: self._kept(s, tuple(tensor.shape)))
        if self._stacks is not None and fused_shard_group(name) not in self._open:
            shape = tuple(tensor.shape)
            taken = self._stacks.add(name, tensor, lambda n: self._kept(n, shape) is None)
            if taken is not None:
                del tensor
                flush, done = taken
                for stack in [*flush, *([] if done is None else [done])]:
                    yield from self._send_stack(stack)
                return
        yield from self._one(name, tensor)

    def _one(self, name: str, tensor: torch.Tensor, *, check_open: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """One quantized weight: its pairs, or held until its fused group is complete."""
        if not self.format.shared_global_scale:
            pairs = self.format.refit_pairs(name, tensor, self.config)
            del tensor  # the input is no longer needed by the stream
            yield from _hand_over(pairs)
            return
        siblings = fused_siblings(name)
        group = fused_shard_group(name)
        held = self._open.setdefault(group, {})
        held[name] = tensor
        del tensor
        if set(held) != set(siblings):
            if check_open:
                self._check_open_groups(group)
            return
        shards = self._open.pop(group)
        amaxes = {shard_name: expert_amax(t[None])[0] for shard_name, t in shards.items()}
        for shard_name, amax in amaxes.items():  # NaN/Inf reach the amax: name the shard
            check_finite(shards[shard_name], shard_name, amax=amax, action=_REFUSE_NAN)
        weight_amax = torch.stack(list(amaxes.values())).amax()
        input_scale = self._input_scale(group, tuple(shards))
        for shard_name in list(shards):
            pairs = self.format.refit_pairs(
                shard_name, shards.pop(shard_name), self.config, weight_amax=weight_amax, input_scale=input_scale
            )
            yield from _hand_over(pairs)

    def flush(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Send what the expert stacks hold (fused groups missing a shard stay held)."""
        if self._stacks is not None:
            for stack in self._stacks.pop_all():
                yield from self._send_stack(stack)

    def end_chunk(self) -> None:
        """Copy the tensors held for open groups and stacks (the caller's buffers are reused)."""
        for shards in self._open.values():
            for shard_name, t in shards.items():
                shards[shard_name] = t.clone()
        if self._stacks is not None:
            self._stacks.clone_held()

    def reset(self) -> None:
        """Drop every held shard and expert (a failed chunk: nothing stale reaches the next)."""
        self._open.clear()
        if self._stacks is not None:
            self._stacks.pop_all()

    def close(self) -> None:
        """End of a refit: ValueError naming each incomplete fused group or unflushed stack."""
        if self._stacks is not None and self._stacks.open:
            held = sorted(n for stack in self._stacks.pop_all() for n in stack.held)
            raise ValueError(
                f"{len(held)} MoE expert weight(s) still held in expert stacks at close() "
                f"({held[:4]}...): yield from stream.flush() before stream.close()"
            )
        if not self._open:
            return
        lines = [
            f"{group}: got {sorted(shards)}, missing {sorted(set(fused_siblings(next(iter(shards)))) - set(shards))}"
            for group, shards in self._open.items()
        ]
        self._open.clear()
        raise ValueError(
            f"{len(lines)} fused layer(s) incomplete at the end of the refit (NVFP4 shards "
            "of one vLLM layer share one global scale, so none was sent):\n" + "\n".join(lines)
        )

    def _send_stack(self, stack: ExpertStack) -> Iterator[tuple[str, torch.Tensor]]:
        """A stack's pairs in expert order: one quantizer call per projection, else :meth:`_one`."""
        experts = stack.whole_experts()
        names = {leaf: [stack.name(e, leaf) for e in experts] for leaf in stack.leaves}
        tensors = {leaf: [stack.held[n] for n in ns] for leaf, ns in names.items()}
        if experts and all(len({(t.shape, t.dtype, t.device) for t in ts}) == 1 for ts in tensors.values()):
            yield from self._quantize_stack(stack, names, tensors)
        for name in list(stack.held):  # partial groups, unlike shapes, or a stack that raised
            yield from self._one(name, stack.held.pop(name), check_open=False)

    def _quantize_stack(self, stack, names, tensors) -> Iterator[tuple[str, torch.Tensor]]:
        x = {leaf: stack_experts(ts) for leaf, ts in tensors.items()}
        tensors.clear()
        weight_amax = input_scale = None
        if self.format.shared_global_scale:
            amax = [expert_amax(x3) for x3 in x.values()]
            weight_amax = torch.stack(amax).amax(dim=0)
            if not bool(torch.isfinite(weight_amax).all()):
                return  # one expert at a time: the group names the shard with NaN/Inf
            if self.format.static_input_amax:
                groups = [[ns[i] for ns in names.values()] for i in range(len(weight_amax))]
                input_scale = torch.stack([self._input_scale(fused_shard_group(g[0]), tuple(g)) for g in groups])
        for leaf in stack.leaves:
            try:
                pairs = self.format.refit_pairs(
                    names[leaf], x.pop(leaf), self.config, weight_amax=weight_amax, input_scale=input_scale
                )
            except ValueError:  # NaN/Inf: one expert at a time names the tensor
                return
            for n in names[leaf]:
                del stack.held[n]
            yield from _hand_over(pairs)

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
        if not self.format.static_input_amax:
            return None
        keys = [group, *(s.removesuffix(".weight") for s in shards)]
        found = [self.input_amax[k] for k in keys if k in self.input_amax]
        if not found:
            raise ValueError(
                f"{shards[0]}: {self.config.format} needs the calibrated input amax of one of {keys} (input_amax, or "
                "input_amax_file in the refit hook); input_scale = amax / (6 * 448)"
            )
        return nvfp4_global_scale(torch.stack(found).amax())


BlockWeightStream = RefitStream


def _amax_entry(key: str, value: float | torch.Tensor) -> torch.Tensor:
    """One ``input_amax`` entry as 0-dim fp32 (ValueError: None, not a number, non-finite or < 0)."""
    amax = check_amax(value, f"input_amax[{key!r}]")
    if amax is None:
        raise ValueError(f"input_amax[{key!r}]: got None, expected one finite value >= 0 (the calibrated max |x|)")
    return amax


def _hand_over(pairs: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield each pair and drop the stream's reference to it (one quantized tensor alive)."""
    while pairs:
        yield pairs.pop(0)


def refit_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    config: RefitConfig,
    *,
    input_amax: Mapping[str, float | torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream unfused HF ``(name, tensor)`` pairs into vLLM ``load_weights`` pairs.

    ``config`` is checked at the call (TypeError), the rest as :meth:`RefitStream.push`.
    """
    require_config(config, RefitConfig, "refit_stream(config)")
    return _stream(named_tensors, RefitStream(config, input_amax))


def _stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], stream: RefitStream
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        yield from stream.push(name, tensor)
        del tensor
    yield from stream.flush()
    stream.close()


fp8_weight_stream = block_weight_stream = refit_stream
