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
"""FP8 KV-cache scale calibration of a Megatron-Core GPT model, in NeMo-RL's result format.

The trainer-side half of NeMo-RL's ``calibrate_qkv_fp8_scales`` (v0.7.0 and main have
the same one), computed with :class:`nemo_ais.refit.kv_scales.KVScaleCalibrator`:

1. Hook every ``decoder.layers.N.self_attention.core_attention`` (forward PRE-hook).
   Megatron-Core's ``SelfAttention.forward`` calls ``core_attention(query, key, value,
   attention_mask, ...)`` after ``linear_qkv``, the q/k layernorms and RoPE, so its inputs
   are exactly what vLLM's FP8 KV cache stores: K after k-norm and RoPE, V as projected
   (and Q as the FP8 attention kernel sees it). Shapes ``[s, b, heads, dim]`` (or
   ``[t, heads, dim]`` for packed THD); with GQA, K/V have ``num_query_groups`` heads; with
   tensor parallelism each rank sees its own heads.
2. Per observation (one micro-batch of one layer on one rank), the rule's statistic
   (``reduction``): by default upstream's, ``max |x|`` of the whole tensor (padding
   included, as upstream) and, per layer and kind, the nearest-rank p-th percentile over
   this rank's observations; ``element_percentile``: ``percentile(|x|, p)`` per
   observation, then the max. The layer key is the GLOBAL layer
   index ``self_attention.layer_number - 1`` (Megatron numbers layers from 1 across all
   pipeline stages), never the local position in the stage's ``ModuleList``.
3. Combine ranks with ONE ``all_reduce(MAX)`` of a fixed-size ``[3, num_layers, 3]``
   float64 table (amax, peak and non-finite flags) over ``group``. Layers not on this pipeline
   stage hold the "unobserved" value -1, so every rank makes the same single collective
   whatever its stage. The group must span every rank that holds a layer or a shard of
   one: TP ranks hold different heads, PP stages different layers, DP/CP ranks different
   tokens. In a NeMo-RL policy worker that is the default (WORLD) group (it holds exactly
   the policy's ranks). MAX is idempotent, so ranks that hold identical activations
   (none here) could not bias it, unlike a SUM. Upstream merges its per-rank values by
   max too (``all_gather_object``), so the default rule's scales equal upstream's.
4. ``scale = max(amax, 1e-4) * margin / 448``; the result dict maps vLLM parameter names
   to floats, as ``convert_calibration_to_vllm_format`` does upstream.

This module imports no Megatron or NeMo-RL code (it finds the modules by name and
attributes), so it is unit-testable with any module tree of the same shape.
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

__all__ = [
    "FP8_FORMAT",
    "KV_REDUCTION_ENV",
    "calibrate_qkv_fp8_scales",
    "find_attention_layers",
    "install_core_attention_hooks",
    "kv_calibration_config",
    "kv_reduction_from_env",
    "log_kv_saturation",
    "log_saturated_fraction",
    "nemo_rl_calibration_result",
    "previous_kv_scales",
    "reduce_kv_scales",
]

logger = logging.getLogger(__name__)

FP8_FORMAT = "fp8"  # NeMo-RL's "format" entry
# The NeMo-RL worker's rule, set by launchers/run_grpo_ais.py from ais_kv_calibration.reduction
KV_REDUCTION_ENV = "NEMO_AIS_KV_REDUCTION"
_SELF_ATTN_RE = re.compile(r"(?:^|\.)decoder\.layers\.(\d+)\.self_attention$")
_QKV_ARGS = ("query", "key", "value")
SATURATION_WARN_FRACTION = 1e-3  # the share of elements the element P99.9 rule clips


def kv_calibration_config(
    percentile: float,
    margin: float,
    include_q: bool,
    reduction: KVReduction = "percentile_of_amax",
) -> KVScaleConfig:
    """Validated calibration constants; a bad value raises ``ValueError`` naming the argument."""
    if not isinstance(include_q, bool):
        raise ValueError(f"include_q={include_q!r} is invalid: expected a bool")
    try:
        return KVScaleConfig(
            percentile=percentile, margin=margin, include_q=include_q, reduction=reduction
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}={e.get('input')!r} is invalid: {e['msg']}"
            for e in err.errors()
        )
        raise ValueError(
            f"calibrate_qkv_fp8_scales: {problems} (percentile in (0, 100], margin in [1, 4], "
            "reduction percentile_of_amax or element_percentile)"
        ) from None


def kv_reduction_from_env(environ: Mapping[str, str] | None = None) -> KVReduction:
    """The rule named by ``NEMO_AIS_KV_REDUCTION`` (unset or empty: ``percentile_of_amax``).

    Raises:
        ValueError: naming the variable, its value and the accepted ones.
    """
    value = (os.environ if environ is None else environ).get(KV_REDUCTION_ENV) or (
        "percentile_of_amax"
    )
    if value not in KV_REDUCTIONS:
        raise ValueError(
            f"{KV_REDUCTION_ENV}={value!r} is invalid: expected one of {list(KV_REDUCTIONS)} "
            "(launchers/run_grpo_ais.py sets it from ais_kv_calibration.reduction)"
        )
    return value


def find_attention_layers(model: nn.Module | Sequence[nn.Module]) -> dict[int, nn.Module]:
    """``{global layer index: self_attention module}`` of a Megatron-Core GPT model.

    Args:
        model: the model, possibly wrapped (DDP / Float16Module), or a list of virtual
            pipeline chunks.

    Returns:
        Every ``*.decoder.layers.N.self_attention`` that has a ``core_attention`` child,
        keyed by ``layer_number - 1`` (global across pipeline stages), sorted.

    Raises:
        ValueError: no such module, multi-latent attention (its cache is not K/V), or two
            modules with the same global index.
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
    model: nn.Module | Sequence[nn.Module],
    calibrator: KVScaleCalibrator,
    counter: KVSaturationCounter | None = None,
) -> list[torch.utils.hooks.RemovableHandle]:
    """Forward pre-hooks feeding each ``core_attention``'s query/key/value to ``calibrator``.

    Q is observed only when ``calibrator.config.include_q``; ``counter`` (optional) sees
    the same tensors.

    Returns:
        The hook handles (call ``.remove()`` on each).

    Raises:
        ValueError: see :func:`find_attention_layers`; a global layer index outside
            ``[0, calibrator.num_layers)``.
    """
    kinds = ("q", "k", "v") if calibrator.config.include_q else ("k", "v")
    handles = []
    for layer, attention in find_attention_layers(model).items():
        if not 0 <= layer < calibrator.num_layers:
            raise ValueError(
                f"attention layer_number={layer + 1} is outside the model's "
                f"num_layers={calibrator.num_layers}"
            )
        hook = _qkv_pre_hook(calibrator, layer, kinds, counter)
        handles.append(attention.core_attention.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def _qkv_pre_hook(
    calibrator: KVScaleCalibrator,
    layer: int,
    kinds: tuple[str, ...],
    counter: KVSaturationCounter | None = None,
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


def reduce_kv_scales(
    calibrator: KVScaleCalibrator,
    group: dist.ProcessGroup | None,
    device: torch.device | None = None,
) -> KVScales:
    """Combine ranks with ONE ``all_reduce(MAX)`` of the ``[3, layers, 3]`` table on ``device``.

    ``device`` is where the collective runs (a CUDA device for NCCL groups; None = CPU).
    Raises ``ValueError`` on every rank together for non-finite activations or a layer/kind
    no rank observed (:meth:`KVScaleCalibrator.compute_scales`).
    """
    return calibrator.compute_scales(group=group, device=device)


def nemo_rl_calibration_result(
    scales: KVScales, percentile: float, margin: float
) -> dict[str, Any]:
    """NeMo-RL v0.7.0's return value: ``{"format", "percentile", "margin", "layers"}``.

    ``layers`` is the flat ``{vLLM parameter name: float}`` dict that upstream builds with
    ``convert_calibration_to_vllm_format`` and the driver passes as ``kv_scales`` to the
    refit: ``model.layers.N.self_attn.attn.q_scale`` (``include_q`` only),
    ``model.layers.N.self_attn.k_scale`` and ``.v_scale`` for every global layer N.
    """
    return {
        "format": FP8_FORMAT,
        "percentile": float(percentile),
        "margin": float(margin),
        "layers": scales.to_vllm(),
    }


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
    """Hook, run the forward passes, reduce over ``group`` and return NeMo-RL's dict.

    Logs (INFO) the largest calibration value over ``scale * 448`` per kind, the max over
    layers (:func:`~nemo_ais.refit.kv_scales.kv_saturation_metrics`; > 1: the calibration
    data saturates in E4M3), and WARNING when that happens. With ``previous_scales`` (the
    last calibration's ``layers``: the scales the rollout engine held while it generated
    the data calibrated on now) it also counts the elements of this calibration's K / V
    with ``|x| > previous scale * 448`` -- what that FP8 KV cache saturated, up to the
    trainer/engine numerics -- and logs ``kv_cache/saturated_frac_<kind>`` over every
    layer and rank (one more ``all_reduce(SUM)`` of a ``[2, layers, 3]`` table; WARNING
    above 0.1 %, the share the element-percentile rule clips by design).

    Args:
        model: this rank's Megatron-Core model (its pipeline stage's layers).
        run_forward: runs every calibration forward pass on this rank (e.g. the worker's
            ``get_logprobs`` on its data shard); its result is discarded.
        num_layers: the model's total (global) number of transformer layers.
        percentile: p of the rule, in (0, 100].
        margin: head-room factor, in [1, 4].
        include_q: also calibrate Q (``q_scale``); K/V only otherwise.
        reduction: ``percentile_of_amax`` (NeMo-RL's rule) or ``element_percentile``.
        group: the group spanning every rank of the model (None = one process).
        device: device of the collective (the CUDA device for NCCL).
        previous_scales: ``{vLLM scale name: float}`` in use until now, or None (first
            calibration: nothing counted).

    Returns:
        ``{"format": "fp8", "percentile": float, "margin": float, "layers": {name: float}}``,
        identical on every rank of ``group``.
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
    scales = reduce_kv_scales(calibrator, group, device)  # steps 3-4
    log_kv_saturation(scales, reduction)
    if counter is not None:
        log_saturated_fraction(counter, group, device)
    return nemo_rl_calibration_result(scales, percentile, margin)


def previous_kv_scales(layers: Mapping[str, float], num_layers: int) -> KVScales:
    """The scales a previous calibration returned (``{vLLM scale name: float}``) as a table.

    A kind without a scale (q when it was not calibrated) gets +inf: nothing counts as
    saturated there.
    """
    table = torch.full((num_layers, len(KINDS)), math.inf, dtype=torch.float64)
    for layer in range(num_layers):
        for j, kind in enumerate(KINDS):
            value = layers.get(kv_scale_names(layer)[kind])
            if value is not None:
                table[layer, j] = float(value)
    return KVScales(amax=table * E4M3_MAX, scale=table, include_q=False)


def log_saturated_fraction(
    counter: KVSaturationCounter,
    group: dist.ProcessGroup | None,
    device: torch.device | None = None,
) -> dict[str, float]:
    """``kv_cache/saturated_frac_<kind>`` summed over ranks; logged (INFO, WARNING > 0.1 %).

    Returns:
        ``{"kv_cache/saturated_frac_k": float, "kv_cache/saturated_frac_v": float}`` (and
        ``_q`` if observed), identical on every rank of ``group``.
    """
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
