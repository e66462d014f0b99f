# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Per-step FP8 KV-cache scale calibration (Q/K/V), combined across ranks with MAX.

Weights move at every RL step, so the KV scales are recalibrated at every weight sync (vLLM's ``calculate_kv_scales``
uses its first batch only). Steps:

1. Observe Q/K/V per attention layer (HF attention: K and V as the KV cache receives them, Q at ``q_proj``; or
   Megatron's ``core_attention`` inputs in :mod:`nemo_ais.megatron.kv_calibration`), optionally at valid tokens only.
   One call = one observation.
2. Per layer and kind, this rank's amax by ``KVScaleConfig.reduction``: ``percentile_of_amax`` (NeMo-RL's
   ``calibrate_qkv_fp8_scales``): the nearest-rank percentile ``sorted(a)[round(p / 100 * (n - 1))]`` of the
   per-observation ``max |x|``; ``element_percentile``: the max over observations of ``P_p(|x|)`` (numpy interpolation).
3. ONE ``all_reduce(MAX)`` of the ``[3, layers, 3]`` table (amax, peak, non-finite flag), so every rank raises together
   (upstream: ``all_gather_object``, the same values).
4. ``scale = max(amax, amax_floor) * margin / 448`` (upstream's arithmetic plus the floor).
5. vLLM names: ``model.layers.N.self_attn.{k,v}_scale`` and ``...self_attn.attn.q_scale``.

K and V are observed after ``k_norm`` and RoPE, where NeMo-RL's Megatron worker observes them and vLLM's FP8 cache
stores them (not at ``k_proj``: docs/low_precision.md). [reconstruction] Q (``include_q``) is the ``q_proj`` output.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from nemo_ais.config import require_config
from nemo_ais.formats.fp8_block import E4M3_MAX
from nemo_ais.refit.config import KV_REDUCTIONS as KV_REDUCTIONS, KVReduction as KVReduction

KVKind = Literal["q", "k", "v"]
KINDS: tuple[str, ...] = ("q", "k", "v")
FP32_MIN_SENTINEL = float(torch.finfo(torch.float32).min)  # vLLM's "never loaded" value
KV_METRIC_PREFIX = "kv_cache/"
_UNOBSERVED = -1.0
_ATTN_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn$")
_PERCENT = 100.0


_KV_FIELDS: dict[str, tuple[Any, dict[str, float], str]] = {
    "reduction": (
        "percentile_of_amax",
        {},
        "percentile_of_amax (NeMo-RL's rule): max |x| per observation, then the nearest-rank percentile over "
        "observations (the max for <= 500 of them at 99.9); element_percentile: percentile of |x| over each "
        "observation's elements, then the max over observations (clips the top (100 - p) % of elements).",
    ),
    "percentile": (99.9, {"gt": 0.0, "le": 100.0}, "p of the rule, in (0, 100] (100 = max)."),
    "margin": (1.05, {"ge": 1.0, "le": 4.0}, "Head-room factor on the percentile amax."),
    "amax_floor": (1e-4, {"gt": 0.0}, "Floor of the amax, so an all-zero layer gets a scale > 0."),
}


def kv_field(knob: str) -> Any:
    """The ``Field`` of KV calibration knob ``knob`` (also the twin config's ``kv_*`` keys)."""
    default, bounds, description = _KV_FIELDS[knob]
    return Field(default, description=description, **bounds)


class KVScaleConfig(BaseModel):
    """Calibration constants (NeMo-RL's defaults: its rule, 99.9th percentile, 1.05 margin)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    reduction: KVReduction = kv_field("reduction")
    percentile: float = kv_field("percentile")
    margin: float = kv_field("margin")
    amax_floor: float = kv_field("amax_floor")
    include_q: bool = Field(True, description="Also calibrate and require q_scale (FP8 attention); else K/V only.")


def kv_scale_names(layer: int) -> dict[str, str]:
    """Checkpoint names of layer ``layer``'s Q/K/V scales, as vLLM ``load_weights`` takes them."""
    prefix = f"model.layers.{layer}.self_attn."
    return {"q": prefix + "attn.q_scale", "k": prefix + "k_scale", "v": prefix + "v_scale"}


def engine_name(name: str) -> str:
    """The engine parameter a checkpoint scale name lands in (``self_attn.attn.k_scale``)."""
    if ".self_attn.attn." in name:
        return name
    return name.replace(".self_attn.", ".self_attn.attn.")


def percentile_amax(x: torch.Tensor, percentile: float) -> torch.Tensor:
    """``percentile(|x|, p)`` with numpy's linear interpolation, from two ``kthvalue`` calls.

    Returns:
        0-dim float64 (inf if ``x`` holds NaN/Inf).

    Raises:
        ValueError: ``x`` is empty.
    """
    if x.numel() == 0:
        raise ValueError(
            f"percentile_amax: x is empty ({list(x.shape)} {x.dtype}), expected at least one "
            "value (a percentile of no values is undefined)"
        )
    a = x.detach().reshape(-1).abs().to(torch.float32)
    if not bool(torch.isfinite(a).all()):
        return torch.tensor(math.inf, dtype=torch.float64)
    pos = percentile / _PERCENT * (a.numel() - 1)
    lo = math.floor(pos)
    frac = pos - lo
    v_lo = a.kthvalue(lo + 1).values.double()
    if frac == 0:
        return v_lo
    v_hi = a.kthvalue(lo + 2).values.double()
    return v_lo + (v_hi - v_lo) * frac


def nearest_rank_percentile(values: torch.Tensor, percentile: float) -> torch.Tensor:
    """``sorted(values)[round(p / 100 * (n - 1))]``, NeMo-RL's ``_percentile`` (n <= 500: max)."""
    n = values.numel()
    rank = max(0, min(n - 1, round((percentile / _PERCENT) * (n - 1))))
    return values.sort().values[rank]


@dataclass(frozen=True)
class KVScales:
    """Globally combined calibration result.

    Attributes:
        amax: float64 ``[layers, 3]`` (q, k, v): the rule's amax, max over ranks.
        scale: float64 ``[layers, 3]``: ``max(amax, floor) * margin / 448``.
        include_q: whether q scales are part of the result.
        peak: float64 ``[layers, 3]`` max ``|x|`` (-1: unobserved); None if not calibrated here.
    """

    amax: torch.Tensor
    scale: torch.Tensor
    include_q: bool
    peak: torch.Tensor | None = None

    def to_vllm(self) -> dict[str, float]:
        """``{vLLM scale name: value}`` for every layer (q only if ``include_q``)."""
        out = {}
        for layer in range(self.scale.shape[0]):
            names = kv_scale_names(layer)
            for j, kind in enumerate(KINDS):
                if kind != "q" or self.include_q:
                    out[names[kind]] = float(self.scale[layer, j])
        return out

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, 0-dim fp32 tensor)`` pairs to append to the refit stream."""
        return [(n, torch.tensor(v, dtype=torch.float32)) for n, v in self.to_vllm().items()]

    def peak_over_range(self) -> torch.Tensor:
        """``peak / (scale * 448)``, float64 ``[layers, 3]``: > 1 where calibration saturates."""
        if self.peak is None:
            raise ValueError("KVScales.peak is None: these scales were not calibrated here")
        return self.peak / (self.scale * E4M3_MAX)


def kv_saturation_metrics(scales: KVScales) -> dict[str, float]:
    """``kv_cache/peak_over_range_<kind>``: max over layers of :meth:`KVScales.peak_over_range`."""
    ratio = scales.peak_over_range()
    kinds = KINDS if scales.include_q else KINDS[1:]
    return {f"{KV_METRIC_PREFIX}peak_over_range_{kind}": float(ratio[:, KINDS.index(kind)].max()) for kind in kinds}


class KVSaturationCounter:
    """Counts what an E4M3 KV cache saturates (``|x| / scale > 448``), per layer and kind."""

    def __init__(self, scales: KVScales) -> None:
        self.scale = scales.scale.to(torch.float32)
        self.saturated = torch.zeros(self.scale.shape, dtype=torch.float64)
        self.total = torch.zeros(self.scale.shape, dtype=torch.float64)

    def observe(self, layer: int, kind: KVKind, x: torch.Tensor) -> None:
        """Count one tensor of layer ``layer``'s ``kind`` (every element)."""
        j = KINDS.index(kind)
        s = self.scale[layer, j].to(x.device)
        over = (x.detach().float() / s).abs() > E4M3_MAX
        self.saturated[layer, j] += over.sum(dtype=torch.float64).cpu()
        self.total[layer, j] += x.numel()

    def fractions(self) -> dict[str, float]:
        """``{kind: saturated / total}`` over every layer, for each kind observed."""
        out = {}
        for j, kind in enumerate(KINDS):
            total = float(self.total[:, j].sum())
            if total > 0:
                out[kind] = float(self.saturated[:, j].sum()) / total
        return out

    def metrics(self) -> dict[str, float]:
        """``kv_cache/saturated_frac_<kind>`` for each kind observed."""
        return {f"{KV_METRIC_PREFIX}saturated_frac_{k}": v for k, v in self.fractions().items()}


class KVScaleCalibrator:
    """Accumulates per-layer Q/K/V observations; :meth:`compute_scales` reduces them.

    ``token_mask`` (``[B, T]``, optional): while set, hooks observe only its nonzero rows.
    """

    def __init__(self, num_layers: int, config: KVScaleConfig | None = None) -> None:
        require_config(config, KVScaleConfig, "KVScaleCalibrator(config)", optional=True)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers={num_layers!r} is invalid: expected an int >= 1")
        self.num_layers = num_layers
        self.config = config or KVScaleConfig()
        self.token_mask: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every observation (call at each weight sync)."""
        # (layer, kind column, max |x|, the rule's statistic), 0-dim tensors on x's device
        self._observations: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []

    def observe(self, layer: int, kind: KVKind, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Record one activation ``x [..., D]`` of ``layer`` / ``kind`` (rows where ``mask``)."""
        if not 0 <= layer < self.num_layers or kind not in KINDS:
            raise ValueError(
                f"observe: layer={layer} kind={kind!r} is invalid: expected layer in "
                f"[0, {self.num_layers}) and kind in {KINDS}"
            )
        if mask is not None:
            if tuple(mask.shape) != tuple(x.shape[:-1]):
                raise ValueError(
                    f"observe: mask {list(mask.shape)} does not match x {list(x.shape)}: expected x.shape[:-1]"
                )
            x = x[mask.to(torch.bool)]
        if x.numel() == 0:
            return
        # through float32, the scales' dtype: an fp64 value beyond its range becomes inf here
        amax = x.detach().abs().amax().float().double()
        # the rule's statistic: element_percentile's percentile (computed in float32), else the amax
        stat = percentile_amax(x, self.config.percentile) if self.config.reduction == "element_percentile" else amax
        self._observations.append((layer, KINDS.index(kind), amax, stat))

    def local_tables(self) -> torch.Tensor:
        """This rank's float64 ``[3, layers, 3]``: amax, peak (-1: unobserved), non-finite flag."""
        table = torch.full((3, self.num_layers, len(KINDS)), _UNOBSERVED, dtype=torch.float64)
        table[2] = 0.0
        if not self._observations:
            return table
        values = torch.stack([torch.stack([a, s]) for _, _, a, s in self._observations]).cpu()
        cells: dict[tuple[int, int], list[int]] = {}
        for i, (layer, j, _, _) in enumerate(self._observations):
            cells.setdefault((layer, j), []).append(i)
        for (layer, j), rows in cells.items():
            amax, stat = values[rows, 0], values[rows, 1]
            if not bool(torch.isfinite(amax).all() and torch.isfinite(stat).all()):
                table[2, layer, j] = 1.0
                continue
            if self.config.reduction == "element_percentile":
                table[0, layer, j] = stat.max()  # the percentile was taken per observation
            else:
                table[0, layer, j] = nearest_rank_percentile(stat, self.config.percentile)
            table[1, layer, j] = amax.max()
        return table

    def local_amax(self) -> torch.Tensor:
        """This rank's float64 ``[layers, 3]`` amax of the rule (-1 where nothing was observed)."""
        return self.local_tables()[0]

    def compute_scales(
        self, group: dist.ProcessGroup | None = None, device: torch.device | str | None = None
    ) -> KVScales:
        """Combine ranks (one all_reduce MAX if ``group``, on ``device``); the scales, on CPU.

        Raises:
            ValueError: from globally reduced values (all ranks raise): non-finite activations,
                or a required layer/kind no rank observed.
        """
        table = self.local_tables()
        if group is not None:
            table = table.to(device or "cpu")
            dist.all_reduce(table, op=dist.ReduceOp.MAX, group=group)
            table = table.cpu()
        amax, peak, nonfinite = table[0], table[1], table[2]
        kinds = KINDS if self.config.include_q else KINDS[1:]
        cols = [KINDS.index(k) for k in kinds]
        bad = (nonfinite[:, cols] > 0).nonzero().tolist()
        if bad:
            where = ", ".join(f"layer {i} {kinds[j]}" for i, j in bad[:8])
            raise ValueError(
                f"KV-scale calibration: non-finite activations in {len(bad)} layer/kind pair(s) ({where}); refusing to "
                "send scales derived from NaN/Inf (or from values beyond float32's range)"
            )
        missing = (amax[:, cols] < 0).nonzero().tolist()
        if missing:
            where = ", ".join(f"layer {i} {kinds[j]}" for i, j in missing[:8])
            raise ValueError(
                f"KV-scale calibration: no activations observed for {len(missing)} layer/kind "
                f"pair(s) ({where}); expected every layer's {'/'.join(kinds)} projection "
                "to run under the hooks (install_hooks, then a forward pass)"
            )
        floor = self.config.amax_floor
        scale = amax.clamp_min(floor) * self.config.margin / E4M3_MAX
        # 1.0 marks a scale never calibrated (vLLM's default; the refit guard refuses it): a calibrated one that
        # rounds to 1.0 in fp32 (amax * margin = 448, e.g. margin 2 and amax 224) moves one fp32 ulp up (1.2e-7)
        scale = torch.where(scale.float() == 1.0, torch.full_like(scale, 1.0 + 2.0**-23), scale)
        if not self.config.include_q:
            scale[:, 0] = 1.0  # q not calibrated: not sent (to_vllm skips it)
        return KVScales(amax, scale, self.config.include_q, peak)

    def install_hooks(self, model: nn.Module) -> _HookHandles:
        """Hooks on each ``*.layers.N.self_attn`` (HF layout); ``.remove()`` the result.

        K and V at the attention's ``past_key_values.update`` call (a forward without a cache gets a pass-through one
        while hooked), Q at the ``q_proj`` output (module doc, 1).
        """
        handles = []
        for name, module in model.named_modules():
            match = _ATTN_RE.search(name)
            if match is None or not all(hasattr(module, f"{kind}_proj") for kind in KINDS):
                continue
            layer = int(match.group(1))
            if layer >= self.num_layers:
                raise ValueError(f"{name}: layer {layer} >= num_layers={self.num_layers}")
            if "past_key_values" not in inspect.signature(module.forward).parameters:
                raise ValueError(
                    f"{name}: its forward takes no past_key_values; install_hooks reads K and V at the HF attention's "
                    "KV-cache update (transformers >= 5 attention layout expected)"
                )
            handles.append(module.register_forward_pre_hook(self._cache_hook(layer), with_kwargs=True))
            handles.append(module.q_proj.register_forward_hook(self._q_hook(layer)))
        if not handles:
            raise ValueError(
                "install_hooks: found no '*.layers.N.self_attn' module with q_proj/k_proj/"
                "v_proj children (HF attention layout expected)"
            )
        return _HookHandles(handles)

    def _cache_hook(self, layer: int):
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return args, {**kwargs, "past_key_values": _ObservedCache(kwargs.get("past_key_values"), layer, self)}

        return hook

    def _q_hook(self, layer: int):
        def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            self.observe(layer, "q", output, self.token_mask)

        return hook


class _ObservedCache:
    """The KV cache an attention layer writes to (or None), seen by :meth:`KVScaleCalibrator.install_hooks`.

    ``update`` observes K and V (``[B, heads, T, D]`` as ``[B, T, heads * D]`` rows), then hands them to the layer's
    own cache, or to a fresh HF ``DynamicCache`` when the forward has none (an attention may ask an empty cache its
    length). Every other attribute is the cache's.
    """

    def __init__(self, inner: Any, layer: int, calibrator: KVScaleCalibrator) -> None:
        if inner is None:
            from transformers import DynamicCache

            inner = DynamicCache()
        self.inner, self.layer, self.calibrator = inner, layer, calibrator

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for kind, states in (("k", key_states), ("v", value_states)):
            self.calibrator.observe(self.layer, kind, states.transpose(1, 2).flatten(2), self.calibrator.token_mask)
        return self.inner.update(key_states, value_states, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


class _HookHandles:
    """Removable group of forward hooks; also a context manager."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def remove(self) -> None:
        """Remove every hook."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def __enter__(self) -> _HookHandles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def collect_engine_kv_scales(model: nn.Module) -> dict[str, float]:
    """``{name: value}`` of every ``q_scale`` / ``k_scale`` / ``v_scale`` parameter or buffer."""
    out = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name.rsplit(".", 1)[-1] in ("q_scale", "k_scale", "v_scale") and t.numel() == 1:
            out[name] = float(t.detach().reshape(()))
    return out


def verify_kv_scales(
    engine_scales: Mapping[str, float | torch.Tensor], expected: Mapping[str, float], rtol: float = 1e-6
) -> None:
    """Raise ``ValueError`` listing every sent scale the engine does not hold.

    A scale missing, never loaded (``finfo(float32).min``), left at 1.0, not finite and > 0, or off by more than
    ``rtol`` from ``expected`` (:meth:`KVScales.to_vllm`).
    """
    problems = []
    for name, want in expected.items():
        got = engine_scales.get(engine_name(name), engine_scales.get(name))
        if got is None:
            problems.append(f"{name}: not found in the engine (looked for {engine_name(name)})")
            continue
        got = float(got)
        if got == FP32_MIN_SENTINEL:
            problems.append(f"{name}: never loaded (still vLLM's finfo(float32).min sentinel)")
        elif got == 1.0 and want != 1.0:
            problems.append(f"{name}: left at its default 1.0, expected {want:.6g}")
        elif not math.isfinite(got) or got <= 0:
            problems.append(f"{name}: invalid value {got!r}, expected a finite scale > 0")
        elif abs(got - want) > rtol * abs(want):
            problems.append(f"{name}: engine holds {got:.9g}, sent {want:.9g}")
    if problems:
        raise ValueError(
            f"FP8 KV-cache scales not loaded correctly ({len(problems)} of {len(expected)}):\n" + "\n".join(problems)
        )


def require_calibrated_kv_scales(scales: Mapping[str, float] | None, num_layers: int) -> None:
    """Refit guard: every Q/K/V scale of layers ``0..num_layers-1`` is calibrated (none is 1.0)."""
    scales = {} if scales is None else scales
    problems = []
    for layer in range(num_layers):
        bad = []
        for name in kv_scale_names(layer).values():
            value = scales.get(name)
            if value is None:
                bad.append(f"{name} never calibrated")
            elif float(value) == 1.0:
                bad.append(f"{name} left at the default 1.0")
            elif not math.isfinite(float(value)) or float(value) <= 0:
                bad.append(f"{name}={float(value)!r} is not a finite scale > 0")
        if bad:
            problems.append(f"layer {layer}: " + ", ".join(bad))
    if problems:
        raise ValueError(
            f"FP8 KV cache is on but the refit would stream default KV scales to vLLM "
            f"({len(problems)} of {num_layers} layers):\n" + "\n".join(problems) + "\n"
            "Run calibrate_qkv_fp8_scales(data, include_q=True) on the policy before the refit "
            "(NeMo-RL's grpo_train does when vllm_cfg.kv_cache_dtype is fp8, except for the "
            "refit before the initial validation: set grpo.val_at_start: false)."
        )
