# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""FP8 KV-cache scale calibration of a Megatron-Core GPT model, in NeMo-RL's result format.

The trainer-side half of NeMo-RL's ``calibrate_qkv_fp8_scales`` (v0.7.0 and main), computed with
:class:`nemo_ais.refit.kv_scales.KVScaleCalibrator`:

1. Forward pre-hooks on every ``decoder.layers.N.self_attention.core_attention``: its inputs are what vLLM's FP8 KV
   cache stores (K after k-norm and RoPE, V as projected).
2. Per observation the rule's statistic (default upstream's ``max |x|``, then the nearest-rank percentile); the layer
   key is the GLOBAL ``layer_number - 1``.
3. ONE ``all_reduce(MAX)`` of the ``[3, num_layers, 3]`` table over ``group`` (every rank of the model: the default
   group in a NeMo-RL worker; upstream also merges by max); other stages' layers hold -1 (same collective everywhere).
4. ``scale = max(amax, 1e-4) * margin / 448``, as ``{vLLM name: float}``.

No Megatron or NeMo-RL import: modules are found by name, so any tree of that shape tests it.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch import nn

from nemo_ais.formats.fp8_block import E4M3_MAX
from nemo_ais.refit.kv_scales import (
    KINDS,
    KV_METRIC_PREFIX,
    KV_REDUCTIONS,
    KVReduction,
    KVSaturationCounter,
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
    kv_saturation_metrics,
    kv_scale_names,
)

logger = logging.getLogger(__name__)

FP8_FORMAT = "fp8"  # NeMo-RL's "format" entry
# The NeMo-RL worker's rule, set by launchers/run_grpo_ais.py from ais_kv_calibration.reduction
KV_REDUCTION_ENV = "NEMO_AIS_KV_REDUCTION"
_SELF_ATTN_RE = re.compile(r"(?:^|\.)decoder\.layers\.(\d+)\.self_attention$")
_QKV_ARGS = ("query", "key", "value")
SATURATION_WARN_FRACTION = 1e-3  # the share of elements the element P99.9 rule clips


def kv_calibration_config(
    percentile: float, margin: float, include_q: bool, reduction: KVReduction = "percentile_of_amax"
) -> KVScaleConfig:
    """Validated calibration constants; a bad value raises ``ValueError`` naming the argument."""
    if not isinstance(include_q, bool):
        raise ValueError(f"include_q={include_q!r} is invalid: expected a bool")
    try:
        return KVScaleConfig(percentile=percentile, margin=margin, include_q=include_q, reduction=reduction)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}={e.get('input')!r} is invalid: {e['msg']}" for e in err.errors()
        )
        raise ValueError(
            f"calibrate_qkv_fp8_scales: {problems} (percentile in (0, 100], margin in [1, 4], "
            "reduction percentile_of_amax or element_percentile)"
        ) from None


def kv_reduction_from_env(environ: Mapping[str, str] | None = None) -> KVReduction:
    """The rule in ``NEMO_AIS_KV_REDUCTION`` (unset: ``percentile_of_amax``; else ValueError)."""
    value = (os.environ if environ is None else environ).get(KV_REDUCTION_ENV) or "percentile_of_amax"
    if value not in KV_REDUCTIONS:
        raise ValueError(
            f"{KV_REDUCTION_ENV}={value!r} is invalid: expected one of {list(KV_REDUCTIONS)} "
            "(launchers/run_grpo_ais.py sets it from ais_kv_calibration.reduction)"
        )
    return value


def find_attention_layers(model: nn.Module | Sequence[nn.Module]) -> dict[int, nn.Module]:
    """``{global layer index: self_attention}`` of a (wrapped, or chunked) Megatron-Core GPT model.

    Raises:
        ValueError: no such module, multi-latent attention, or a duplicate global index.
    """
    chunks = [model] if isinstance(model, nn.Module) else list(model)
    layers: dict[int, nn.Module] = {}
    for chunk in chunks:
        for name, module in chunk.named_modules():
            if _SELF_ATTN_RE.search(name) is None or not hasattr(module, "core_attention"):
                continue
            if type(module).__name__.startswith("MLA"):
                raise ValueError(
                    f"{name}: {type(module).__name__} (multi-latent attention) is not "
                    "supported: FP8 KV-cache calibration expects separate K/V heads"
                )
            layer = int(module.layer_number) - 1
            if layer in layers:
                raise ValueError(f"{name}: global layer index {layer} appears twice")
            layers[layer] = module
    if not layers:
        raise ValueError(
            "found no '*.decoder.layers.N.self_attention' module with a 'core_attention' "
            "child: expected a Megatron-Core GPT model (or its DDP / Float16Module wrapper)"
        )
    return dict(sorted(layers.items()))


def install_core_attention_hooks(
    model: nn.Module | Sequence[nn.Module], calibrator: KVScaleCalibrator, counter: KVSaturationCounter | None = None
) -> list[torch.utils.hooks.RemovableHandle]:
    """Pre-hooks feeding each ``core_attention``'s q / k / v to ``calibrator`` (and ``counter``).

    Returns the handles; ValueError as :func:`find_attention_layers` or a layer out of range.
    """
    kinds = ("q", "k", "v") if calibrator.config.include_q else ("k", "v")
    handles = []
    for layer, attention in find_attention_layers(model).items():
        if not 0 <= layer < calibrator.num_layers:
            raise ValueError(
                f"attention layer_number={layer + 1} is outside the model's num_layers={calibrator.num_layers}"
            )
        hook = _qkv_pre_hook(calibrator, layer, kinds, counter)
        handles.append(attention.core_attention.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def _qkv_pre_hook(
    calibrator: KVScaleCalibrator, layer: int, kinds: tuple[str, ...], counter: KVSaturationCounter | None = None
) -> Callable:
    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        qkv = list(args[:3]) + [kwargs.get(name) for name in _QKV_ARGS[len(args[:3]) :]]
        for kind, name, x in zip(("q", "k", "v"), _QKV_ARGS, qkv, strict=True):
            if kind not in kinds:
                continue
            if not isinstance(x, torch.Tensor):
                raise ValueError(
                    f"layer {layer} core_attention: {name} is {type(x).__name__}, expected a "
                    "tensor as argument (query, key, value, ...)"
                )
            calibrator.observe(layer, kind, x)
            if counter is not None:
                counter.observe(layer, kind, x)

    return hook


def calibrate_qkv_fp8_scales(
    model: nn.Module | Sequence[nn.Module],
    run_forward: Callable[[], Any],
    *,
    num_layers: int,
    percentile: float = 99.9,
    margin: float = 1.05,
    include_q: bool = False,
    reduction: KVReduction = "percentile_of_amax",
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    previous_scales: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Hook, run the forwards, reduce over ``group`` and return NeMo-RL's dict (every rank alike).

    Logs the peak over ``scale * 448`` per kind (WARNING > 1) and, given ``previous_scales`` (the engine's while it
    generated this data), ``kv_cache/saturated_frac_<kind>`` (one more ``all_reduce(SUM)``; WARNING > 0.1 %).

    Args:
        model: this rank's Megatron-Core model.
        run_forward: runs every calibration forward on this rank (result discarded).
        num_layers: the global number of transformer layers.
        percentile: p of the rule, in (0, 100]. margin: in [1, 4].
        include_q: also calibrate Q. reduction: the rule.
        group: spans every rank of the model (None: one process). device: of the collective.
        previous_scales: ``{vLLM scale name: float}`` in use until now, or None.
    """
    config = kv_calibration_config(percentile, margin, include_q, reduction)  # validated
    calibrator = KVScaleCalibrator(num_layers, config)
    counter = None
    if previous_scales is not None:
        counter = KVSaturationCounter(previous_kv_scales(previous_scales, num_layers))
    handles = install_core_attention_hooks(model, calibrator, counter)  # step 1
    try:
        with torch.no_grad():
            run_forward()  # step 2: observe every micro-batch
    finally:
        for handle in handles:
            handle.remove()
    scales = calibrator.compute_scales(group=group, device=device)  # steps 3-4: ONE all_reduce(MAX)
    log_kv_saturation(scales, reduction)
    if counter is not None:
        log_saturated_fraction(counter, group, device)
    return {"format": FP8_FORMAT, "percentile": float(percentile), "margin": float(margin), "layers": scales.to_vllm()}


def previous_kv_scales(layers: Mapping[str, float], num_layers: int) -> KVScales:
    """A previous calibration's ``{vLLM name: float}`` as a table (+inf where a kind has none)."""
    table = torch.full((num_layers, len(KINDS)), math.inf, dtype=torch.float64)
    for layer in range(num_layers):
        names = kv_scale_names(layer)
        for j, kind in enumerate(KINDS):
            if (value := layers.get(names[kind])) is not None:
                table[layer, j] = float(value)
    return KVScales(amax=table * E4M3_MAX, scale=table, include_q=False)


def log_saturated_fraction(
    counter: KVSaturationCounter, group: dist.ProcessGroup | None, device: torch.device | None = None
) -> dict[str, float]:
    """``kv_cache/saturated_frac_<kind>`` summed over ranks, logged (WARNING > 0.1 %), returned."""
    table = torch.stack([counter.saturated, counter.total])
    if group is not None:
        table = table.to(device)
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group)
        table = table.cpu()
    saturated, total = table[0].sum(dim=0), table[1].sum(dim=0)
    metrics = {
        f"{KV_METRIC_PREFIX}saturated_frac_{kind}": float(saturated[j] / total[j])
        for j, kind in enumerate(KINDS)
        if total[j] > 0
    }
    logger.info("FP8 KV cache saturation under the previous scales: %s", metrics)
    over = {k: v for k, v in metrics.items() if v > SATURATION_WARN_FRACTION}
    if over:
        logger.warning(
            "FP8 KV cache: more than %.1f %% of this step's K/V elements exceed the previous "
            "scales * 448 (saturated in the rollout's FP8 cache): %s",
            100 * SATURATION_WARN_FRACTION,
            over,
        )
    return metrics


def log_kv_saturation(scales: KVScales, reduction: str) -> dict[str, float]:
    """Log ``kv_cache/peak_over_range_<kind>`` (INFO; WARNING where > 1) and return it."""
    metrics = kv_saturation_metrics(scales)
    logger.info("FP8 KV calibration (%s): %s", reduction, metrics)
    saturating = {k: v for k, v in metrics.items() if v > 1}
    if saturating:
        logger.warning(
            "FP8 KV calibration (%s): the calibration data's largest |x| exceeds scale * 448 "
            "(saturates in E4M3) for %s",
            reduction,
            saturating,
        )
    return metrics
