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
Following NeMo-RL's trainer-side calibration:

1. Observe the Q/K/V activations of every attention layer (forward hooks on the HF
   ``q_proj`` / ``k_proj`` / ``v_proj`` outputs, :meth:`KVScaleCalibrator.install_hooks`),
   optionally only at valid tokens (``token_mask``).
2. Per observation, ``a = percentile(|x|, p)`` (linear interpolation between order
   statistics, as ``numpy.percentile``); per layer and kind keep the MAX over observations.
3. Combine ranks: ONE ``all_reduce(MAX)`` over ``group`` (None = one process) of the
   ``[layers, 3]`` amax table and of a non-finite flag table, so every rank raises together.
4. ``scale = max(amax, amax_floor) * margin / 448`` (defaults p = 99.9, margin = 1.05), the
   DEQUANT multiplier of the E4M3 KV cache.
5. Names as vLLM loads them: ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (vLLM
   remaps them to ``...self_attn.attn.k_scale``) and ``model.layers.N.self_attn.attn.q_scale``.

:func:`verify_kv_scales` checks what the engine holds afterwards: a scale never loaded
(vLLM initialises them to ``finfo(float32).min``), left at its default 1.0, or different
from what was sent raises ``ValueError``. [reconstruction] :meth:`KVScaleCalibrator.install_hooks` observes the HF ``k_proj``
output, i.e. K before RoPE (and before a ``k_norm``). NeMo-RL v0.7.0's Megatron worker, and
our override of it (:mod:`nemo_ais.megatron.kv_calibration`), observe the attention inputs
after q/k-norm and RoPE, which is what vLLM's FP8 cache stores; RoPE rotates pairs of
channels, so the two amax values can differ slightly, which the margin covers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from nemo_ais.config import require_config
from nemo_ais.fp8.quant import E4M3_MAX

__all__ = [
    "FP32_MIN_SENTINEL",
    "KVScaleCalibrator",
    "KVScaleConfig",
    "KVScales",
    "collect_engine_kv_scales",
    "engine_name",
    "kv_scale_names",
    "percentile_amax",
    "require_calibrated_kv_scales",
    "verify_kv_scales",
]

KVKind = Literal["q", "k", "v"]
KINDS: tuple[str, ...] = ("q", "k", "v")
FP32_MIN_SENTINEL = float(torch.finfo(torch.float32).min)  # vLLM's "never loaded" value
_UNOBSERVED = -1.0
_ATTN_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn$")
_PERCENT = 100.0


class KVScaleConfig(BaseModel):
    """Calibration constants (NeMo-RL defaults: 99.9th percentile, 1.05 margin)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    percentile: float = Field(
        99.9, gt=0.0, le=100.0, description="Percentile of |x| per observation (100 = max)."
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


@dataclass(frozen=True)
class KVScales:
    """Globally combined calibration result.

    Attributes:
        amax: float64 ``[layers, 3]`` (columns q, k, v), max over ranks and observations.
        scale: float64 ``[layers, 3]`` dequant scales ``max(amax, floor) * margin / 448``.
        include_q: whether q scales are part of the result.
    """

    amax: torch.Tensor
    scale: torch.Tensor
    include_q: bool

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


class KVScaleCalibrator:
    """Accumulates per-layer Q/K/V percentile amax; :meth:`compute_scales` reduces them.

    Args:
        num_layers: number of attention layers (same on every rank).
        config: calibration constants.

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
        self._amax = torch.full((self.num_layers, len(KINDS)), _UNOBSERVED, dtype=torch.float64)
        self._nonfinite = torch.zeros(self.num_layers, len(KINDS), dtype=torch.float64)

    def observe(
        self, layer: int, kind: KVKind, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> None:
        """Record ``percentile(|x|)`` of one activation tensor (max with earlier ones).

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
        a = percentile_amax(x, self.config.percentile)
        j = KINDS.index(kind)
        if not bool(torch.isfinite(a)):
            self._nonfinite[layer, j] = 1.0
            return
        self._amax[layer, j] = torch.maximum(self._amax[layer, j], a)

    def local_amax(self) -> torch.Tensor:
        """This rank's float64 ``[layers, 3]`` table (-1 where nothing was observed)."""
        return self._amax.clone()

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
        table = torch.stack([self._amax, self._nonfinite])
        if group is not None:
            table = table.to(device or "cpu")
            dist.all_reduce(table, op=dist.ReduceOp.MAX, group=group)
            table = table.cpu()
        amax, nonfinite = table[0], table[1]
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
        return KVScales(amax, scale, self.config.include_q)

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
