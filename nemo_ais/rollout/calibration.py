# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's calibration forwards: W4A4 static input amax and the KV-cache scales.

One forward of a left-padded batch (``logits_to_keep=1``), of the twin or a trainer model with the same module names.
Input amax (``nvfp4_w4a4``): ``max |x|`` of each quantized linear's input over valid tokens, activation quantization off
(ModelOpt's ``max``); a MoE projection's experts share the max [reconstruction]. KV scales:
:class:`~nemo_ais.refit.kv_scales.KVScaleCalibrator` on K and V as the KV cache receives them (after RoPE).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from nemo_ais.formats.checks import check_finite
from nemo_ais.refit.kv_scales import KVScaleCalibrator, KVScaleConfig, KVScales
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LinearFakeQuant, max_into
from nemo_ais.rollout.linear import QuantLinear
from nemo_ais.rollout.sampling import positions


def _forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask), logits_to_keep=1)


def static_input_modules(model: nn.Module, fake_quant: LinearFakeQuant) -> dict[str, QuantLinear]:
    """The quantized linears of ``model`` whose activations need a calibrated static amax."""
    if not fake_quant.static_input_amax:
        return {}
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.fake_quant.static_input_amax}


def observe_input_amax(
    observed: nn.Module, modules: Mapping[str, nn.Module], input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``{name: max |x|}`` of the inputs of ``observed``'s modules named as ``modules``.

    Rows count where ``attention_mask`` is 1; a module that saw no row is absent. ``modules`` may be plain linears
    (BF16 calibration). A routed expert's input gathers rows of the whole batch, so no mask can drop its padding: with
    MoE experts among ``modules``, each row of a padded batch runs alone, without its padding.
    """
    for name in modules:  # the twin's module names, looked up in another model (the trainer's)
        try:
            observed.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"{name}: the observed model has no such module (a transformers-5 fused-experts MoE holds its experts "
                "as one 3-D parameter); calibrate on the twin itself, or on a model with per-expert linears"
            ) from None
    seen: dict[str, torch.Tensor] = {}
    if any(map(_is_expert, modules)) and not bool(attention_mask.all()):
        for ids, valid in zip(input_ids, attention_mask.to(torch.bool), strict=True):
            if not valid.any():  # an all-padding row: masked out, as in one batched forward
                continue
            row = ids[valid][None]
            for name, amax in observe_input_amax(observed, modules, row, torch.ones_like(row)).items():
                max_into(seen, name, amax)
        return seen
    mask = attention_mask.to(torch.bool)

    def hook(name: str):
        def record(_module: nn.Module, inputs: tuple) -> None:
            x = inputs[0]
            rows = x[mask] if tuple(x.shape[:-1]) == tuple(mask.shape) else x
            if rows.numel():
                max_into(seen, name, rows.detach().abs().amax().to(torch.float32))

        return record

    handles = [observed.get_submodule(n).register_forward_pre_hook(hook(n)) for n in modules]
    quantized = [m for m in modules.values() if isinstance(m, QuantLinear)]
    for module in quantized:
        module.calibrating = True
    try:
        _forward(observed, input_ids, attention_mask)
    finally:
        for module in quantized:
            module.calibrating = False
        for handle in handles:
            handle.remove()
    return seen


def _is_expert(name: str) -> bool:
    """A MoE expert's linear (``...mlp.experts.3.gate_proj``, the twin's ``...experts.gate_up_proj.3``)."""
    return ".experts." in f".{name}"


def _projection(name: str) -> str:
    """An expert's MoE projection: its name without the expert index (``experts.3.gate_proj``, ``up_proj.3``)."""
    return re.sub(r"\.\d+$", "", re.sub(r"\.experts\.\d+\.", ".experts.", name))


def shared_input_amax(names: Iterable[str], seen: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: amax}`` of ``names``; an expert takes its projection's max over the experts that saw a row.

    Raises:
        ValueError: a module (a projection of experts) that saw no row, or a non-finite amax.
    """
    projection_max: dict[str, torch.Tensor] = {}
    for name, amax in seen.items():
        max_into(projection_max, _projection(name), amax)
    out = {}
    for name in names:
        amax = projection_max.get(_projection(name)) if _is_expert(name) else seen.get(name)
        if amax is None:
            raise ValueError(
                f"calibrate_input_amax: no input observed for {name}; expected every "
                "W4A4 linear to run in the calibration forward"
            )
        check_finite(amax, f"calibrate_input_amax: {name}", what="activations", action="")
        out[name] = amax
    return out


def store_input_amax(modules: dict[str, QuantLinear], seen: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`shared_input_amax` of ``modules``, stored on them (``input_amax``) and returned."""
    out = shared_input_amax(modules, seen)
    for name, module in modules.items():
        module.input_amax = out[name]
    return out


def kv_scales_from_forward(
    observed: nn.Module,
    num_layers: int,
    config: RolloutPrecisionConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
) -> KVScales:
    """Per-layer KV scales of one forward of ``observed`` under ``config``'s calibration rule."""
    calibrator = KVScaleCalibrator(
        num_layers,
        KVScaleConfig(
            reduction=config.kv_calibration_reduction,
            percentile=config.kv_calibration_percentile,
            margin=config.kv_calibration_margin,
            amax_floor=config.kv_amax_floor,
            include_q=False,
        ),
    )
    calibrator.token_mask = attention_mask
    with calibrator.install_hooks(observed):
        _forward(observed, input_ids, attention_mask)
    return calibrator.compute_scales()
