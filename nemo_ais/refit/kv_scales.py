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
"""Per-step FP8 KV-cache scale calibration (Q/K/V), combined across ranks with MAX.

Weights move at every RL step, so the FP8 KV-cache scales must be recalibrated at every
weight sync (vLLM's own ``calculate_kv_scales`` takes them from its first batch only).
Two rules (``KVScaleConfig.reduction``), same steps otherwise:

1. Observe the Q/K/V activations of every attention layer (forward hooks on the HF
   ``q_proj`` / ``k_proj`` / ``v_proj`` outputs, :meth:`KVScaleCalibrator.install_hooks`,
   or Megatron's ``core_attention`` inputs, :mod:`nemo_ais.megatron.kv_calibration`),
   optionally only at valid tokens (``token_mask``). One call = one observation (one
   micro-batch of one layer).
2. Per layer and kind, this rank's amax:

   * ``percentile_of_amax`` (default; NeMo-RL's ``calibrate_qkv_fp8_scales``): each
     observation records ``a_i = max |x|`` over the whole tensor; the amax is the
     nearest-rank p-th percentile of the list ``a_1..a_n``:
     ``sorted(a)[round(p / 100 * (n - 1))]`` (Python's ``round``, half to even, as
     upstream). For ``n <= 500`` observations at p = 99.9 that is ``max_i a_i``: no
     element of the calibration data saturates.
   * ``element_percentile``: each observation records ``P_p(|x|)`` over its elements
     (linear interpolation, as ``numpy.percentile``); the amax is the max over
     observations. It clips the top (100 - p) % of every observation's elements
     (attention-sink tokens, outlier channels) and selects over every element.

3. Combine ranks: ONE ``all_reduce(MAX)`` over ``group`` (None = one process) of the
   ``[3, layers, 3]`` table (amax, peak ``max |x|``, non-finite flags), so every rank
   raises together. (Upstream: ``all_gather_object`` + max per key, the same values.)
4. ``scale = max(amax, amax_floor) * margin / 448`` (defaults p = 99.9, margin = 1.05), the
   DEQUANT multiplier of the E4M3 KV cache. Upstream has no floor (an all-zero layer gets
   scale 0); otherwise the arithmetic is upstream's, so the scales are bit-identical.
5. Names as vLLM loads them: ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (vLLM
   remaps them to ``...self_attn.attn.k_scale``) and ``model.layers.N.self_attn.attn.q_scale``.

Saturation: :meth:`KVScales.peak_over_range` is ``peak / (scale * 448)`` per layer and
kind, the largest calibration value over the largest E4M3-representable one (> 1: some
elements of the calibration data saturate); :func:`kv_saturation_metrics` logs its max over
layers per kind. The fraction of elements above ``scale * 448`` needs the activations
again once the scale is known (the rule's statistic is formed first), so it is counted
where they are at hand: :class:`KVSaturationCounter` (the twin's quantized KV cache counts
every K/V element it writes).

:func:`verify_kv_scales` checks what the engine holds afterwards: a scale never loaded
(vLLM initialises them to ``finfo(float32).min``), left at its default 1.0, or different
from what was sent raises ``ValueError``. [reconstruction] :meth:`KVScaleCalibrator.install_hooks` observes the HF ``k_proj``
output, i.e. K before RoPE (and before a ``k_norm``). NeMo-RL's Megatron worker, and
our override of it (:mod:`nemo_ais.megatron.kv_calibration`), observe the attention inputs
after q/k-norm and RoPE, which is what vLLM's FP8 cache stores; RoPE rotates pairs of
channels, so the two amax values can differ slightly, which the margin covers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from nemo_ais.config import require_config
from nemo_ais.formats.fp8_block import E4M3_MAX

__all__ = [
    "FP32_MIN_SENTINEL",
    "KV_REDUCTIONS",
    "KVReduction",
    "KVSaturationCounter",
    "KVScaleCalibrator",
    "KVScaleConfig",
    "KVScales",
    "collect_engine_kv_scales",
    "engine_name",
    "kv_saturation_metrics",
    "kv_scale_names",
    "nearest_rank_percentile",
    "percentile_amax",
    "require_calibrated_kv_scales",
    "verify_kv_scales",
]

KVKind = Literal["q", "k", "v"]
KVReduction = Literal["percentile_of_amax", "element_percentile"]
KV_REDUCTIONS: tuple[str, ...] = KVReduction.__args__
KINDS: tuple[str, ...] = ("q", "k", "v")
FP32_MIN_SENTINEL = float(torch.finfo(torch.float32).min)  # vLLM's "never loaded" value
KV_METRIC_PREFIX = "kv_cache/"
_UNOBSERVED = -1.0
_ATTN_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn$")
_PERCENT = 100.0


class KVScaleConfig(BaseModel):
    """Calibration constants (NeMo-RL's defaults: its rule, 99.9th percentile, 1.05 margin)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    reduction: KVReduction = Field(
        "percentile_of_amax",
        description="percentile_of_amax (NeMo-RL's rule): max |x| per observation, then the "
        "nearest-rank percentile over observations (the max for <= 500 of them at 99.9); "
        "element_percentile: percentile of |x| over each observation's elements, then the "
        "max over observations (clips the top (100 - p) % of elements).",
    )
    percentile: float = Field(
        99.9, gt=0.0, le=100.0, description="p of the rule, in (0, 100] (100 = max)."
    )
    margin: float = Field(
        1.05, ge=1.0, le=4.0, description="Head-room factor on the percentile amax."
    )
    amax_floor: float = Field(
        1e-4, gt=0.0, description="Floor of the amax, so an all-zero layer gets a scale > 0."
    )
    include_q: bool = Field(
        True, description="Also calibrate and require q_scale (FP8 attention); else K/V only."
    )


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
    """``percentile(|x|, p)`` with linear interpolation (numpy's default), exactly.

    Uses two ``kthvalue`` order statistics (no sort, no 16M-element ``quantile`` limit).

    Args:
        x: any non-empty floating tensor (flattened; detached).
        percentile: in (0, 100]; 100 gives ``max |x|``.

    Returns:
        0-dim float64; NaN/Inf if ``x`` holds any (the caller flags it).

    Raises:
        ValueError: ``x`` is empty (a percentile of no values is undefined;
            :meth:`KVScaleCalibrator.observe` skips empty activations instead).
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
    """``sorted(values)[round(p / 100 * (n - 1))]``, NeMo-RL's ``_percentile`` (index clamped).

    Python's ``round`` (half to even) of the same float64 expression as upstream, so the
    chosen order statistic is upstream's. For ``p = 99.9`` and ``n <= 500`` it is the max.

    Args:
        values: non-empty 1-D tensor (e.g. the per-observation amax of one layer and kind).
        percentile: in (0, 100].

    Returns:
        0-dim tensor, one of ``values``.
    """
    n = values.numel()
    rank = max(0, min(n - 1, round((percentile / _PERCENT) * (n - 1))))
    return values.sort().values[rank]


def _max_over(values: torch.Tensor, percentile: float) -> torch.Tensor:
    """The max over observations (``element_percentile``; ``percentile`` was applied per one)."""
    return values.max()


def _observation_amax(x: torch.Tensor, percentile: float) -> torch.Tensor:
    """``max |x|`` of one observation (``percentile_of_amax``), float64, on ``x``'s device."""
    return x.detach().abs().amax().double()


# rule -> (statistic of one observation, reduction over this rank's observations)
_RULES: dict[str, tuple[Callable, Callable]] = {
    "percentile_of_amax": (_observation_amax, nearest_rank_percentile),
    "element_percentile": (percentile_amax, _max_over),
}


@dataclass(frozen=True)
class KVScales:
    """Globally combined calibration result.

    Attributes:
        amax: float64 ``[layers, 3]`` (columns q, k, v): the rule's amax, max over ranks.
        scale: float64 ``[layers, 3]`` dequant scales ``max(amax, floor) * margin / 448``.
        include_q: whether q scales are part of the result.
        peak: float64 ``[layers, 3]`` ``max |x|`` over every observation and rank (-1 where
            nothing was observed), or None when the scales did not come from a calibration
            (e.g. sent with a refit).
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
        """``peak / (scale * 448)``, float64 ``[layers, 3]``: > 1 where calibration data saturates.

        Raises:
            ValueError: no ``peak`` (the scales were not calibrated here).
        """
        if self.peak is None:
            raise ValueError("KVScales.peak is None: these scales were not calibrated here")
        return self.peak / (self.scale * E4M3_MAX)


def kv_saturation_metrics(scales: KVScales) -> dict[str, float]:
    """``kv_cache/peak_over_range_<kind>``: max over layers of :meth:`KVScales.peak_over_range`.

    One value per calibrated kind (q only with ``include_q``); > 1 means the largest
    calibration value of some layer lies beyond ``scale * 448`` and saturates in E4M3.
    """
    ratio = scales.peak_over_range()
    kinds = KINDS if scales.include_q else KINDS[1:]
    return {
        f"{KV_METRIC_PREFIX}peak_over_range_{kind}": float(ratio[:, KINDS.index(kind)].max())
        for kind in kinds
    }


class KVSaturationCounter:
    """Counts the elements an E4M3 KV cache saturates: ``|x| / scale > 448``, per layer and kind.

    Args:
        scales: the scales in use; compared in float32, as the engine stores them.
    """

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

    Args:
        num_layers: number of attention layers (same on every rank).
        config: calibration constants, including the rule (``reduction``).

    Attributes:
        token_mask: optional ``[B, T]`` mask; while set, hooks observe only the rows of
            ``[B, T, D]`` outputs where it is nonzero (set it before each forward).
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

    def observe(
        self, layer: int, kind: KVKind, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> None:
        """Record one activation tensor: its ``max |x|`` and the rule's statistic.

        No host sync in the default rule (non-finite values are flagged in
        :meth:`compute_scales`).

        Args:
            layer: attention layer index in ``[0, num_layers)``.
            kind: ``"q"``, ``"k"`` or ``"v"``.
            x: ``[..., D]`` activations (e.g. ``[B, T, D]`` projection output).
            mask: optional mask over ``x.shape[:-1]``; only rows where it is nonzero count.
        """
        if not 0 <= layer < self.num_layers or kind not in KINDS:
            raise ValueError(
                f"observe: layer={layer} kind={kind!r} is invalid: expected layer in "
                f"[0, {self.num_layers}) and kind in {KINDS}"
            )
        if mask is not None:
            if tuple(mask.shape) != tuple(x.shape[:-1]):
                raise ValueError(
                    f"observe: mask {list(mask.shape)} does not match x {list(x.shape)}: "
                    "expected x.shape[:-1]"
                )
            x = x[mask.to(torch.bool)]
        if x.numel() == 0:
            return
        statistic, _ = _RULES[self.config.reduction]
        amax = _observation_amax(x, self.config.percentile)
        stat = amax if statistic is _observation_amax else statistic(x, self.config.percentile)
        self._observations.append((layer, KINDS.index(kind), amax, stat))

    def local_tables(self) -> torch.Tensor:
        """This rank's float64 ``[3, layers, 3]`` table: the rule's amax, peak, non-finite flag.

        -1 in the first two planes where nothing (finite) was observed.
        """
        table = torch.full((3, self.num_layers, len(KINDS)), _UNOBSERVED, dtype=torch.float64)
        table[2] = 0.0
        if not self._observations:
            return table
        values = torch.stack([torch.stack([a, s]) for _, _, a, s in self._observations]).cpu()
        _, reduce = _RULES[self.config.reduction]
        cells: dict[tuple[int, int], list[int]] = {}
        for i, (layer, j, _, _) in enumerate(self._observations):
            cells.setdefault((layer, j), []).append(i)
        for (layer, j), rows in cells.items():
            amax, stat = values[rows, 0], values[rows, 1]
            if not bool(torch.isfinite(amax).all() and torch.isfinite(stat).all()):
                table[2, layer, j] = 1.0
                continue
            table[0, layer, j] = reduce(stat, self.config.percentile)
            table[1, layer, j] = amax.max()
        return table

    def local_amax(self) -> torch.Tensor:
        """This rank's float64 ``[layers, 3]`` amax of the rule (-1 where nothing was observed)."""
        return self.local_tables()[0]

    def compute_scales(
        self, group: dist.ProcessGroup | None = None, device: torch.device | str | None = None
    ) -> KVScales:
        """Combine ranks (one all_reduce MAX if ``group``) and form the scales.

        Args:
            group: process group to combine over; None = this process only.
            device: where the collective runs (a CUDA device for an NCCL group; None = CPU,
                for gloo). The result is always on CPU.

        Raises:
            ValueError: from globally reduced values only (all ranks raise together):
                non-finite activations seen on any rank, or a required layer/kind that
                no rank observed.
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
                f"KV-scale calibration: non-finite activations in {len(bad)} layer/kind "
                f"pair(s) ({where}); refusing to send scales derived from NaN/Inf"
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
        if not self.config.include_q:
            scale[:, 0] = 1.0  # q not calibrated: not sent (to_vllm skips it)
        return KVScales(amax, scale, self.config.include_q, peak)

    def install_hooks(self, model: nn.Module) -> _HookHandles:
        """Forward hooks on every ``*.layers.N.self_attn.{q,k,v}_proj`` of an HF model.

        Returns:
            A handle; ``.remove()`` (or use it as a context manager) removes the hooks.

        Raises:
            ValueError: no such attention module, or a layer index >= ``num_layers``.
        """
        handles = []
        for name, module in model.named_modules():
            match = _ATTN_RE.search(name)
            if match is None:
                continue
            layer = int(match.group(1))
            if layer >= self.num_layers:
                raise ValueError(f"{name}: layer {layer} >= num_layers={self.num_layers}")
            for kind in KINDS:
                proj = getattr(module, f"{kind}_proj", None)
                if proj is not None:
                    handles.append(proj.register_forward_hook(self._hook(layer, kind)))
        if not handles:
            raise ValueError(
                "install_hooks: found no '*.layers.N.self_attn' module with q_proj/k_proj/"
                "v_proj children (HF attention layout expected)"
            )
        return _HookHandles(handles)

    def _hook(self, layer: int, kind: str):
        def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            self.observe(layer, kind, output, self.token_mask)

        return hook


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
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if name.rsplit(".", 1)[-1] in ("q_scale", "k_scale", "v_scale") and t.numel() == 1:
            out[name] = float(t.detach().reshape(()))
    return out


def verify_kv_scales(
    engine_scales: Mapping[str, float | torch.Tensor],
    expected: Mapping[str, float],
    rtol: float = 1e-6,
) -> None:
    """Check that the engine holds the scales that were sent (after ``load_weights``).

    Args:
        engine_scales: engine name (or checkpoint name) -> value, e.g. from
            :func:`collect_engine_kv_scales` on the engine's model.
        expected: what was sent, :meth:`KVScales.to_vllm`.
        rtol: relative tolerance (fp32 storage of a float64 scale is within 2^-24).

    Raises:
        ValueError: listing every scale that is missing, never loaded
            (``finfo(float32).min``), left at its default 1.0, non-positive/non-finite,
            or different from the one sent.
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
            f"FP8 KV-cache scales not loaded correctly ({len(problems)} of {len(expected)}):\n"
            + "\n".join(problems)
        )


def require_calibrated_kv_scales(scales: Mapping[str, float] | None, num_layers: int) -> None:
    """Refit guard: every Q/K/V scale of every layer is calibrated, so none streams as 1.0.

    NeMo-RL's refit streams ``scales.get(name, 1.0)`` for each of :func:`kv_scale_names`
    of layers ``0..num_layers-1`` when the FP8 KV cache is on.

    Args:
        scales: vLLM name -> scale about to be streamed (None: never calibrated).
        num_layers: the model's (global) number of attention layers.

    Raises:
        ValueError: naming, per layer, each scale that is missing (never calibrated), left
            at the default 1.0, or not a finite value > 0.
    """
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
