# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Simulated low-precision rollout engine: the "twin" of a Hugging Face causal LM.

The twin stands in for vLLM (one rollout format and KV cache) on CPU, so the mismatch AIS corrects is real without a
GPU (``docs/low_precision.md``, "Twin"): build (:mod:`~nemo_ais.rollout.modules`), refit
(:mod:`~nemo_ais.rollout.weight_loader`), calibration, stale after every refit (:mod:`~nemo_ais.rollout.calibration`),
quantized KV cache (:mod:`~nemo_ais.rollout.kv_cache`), generation (:mod:`~nemo_ais.rollout.sampling`). With nothing to
simulate (``format`` and ``kv_cache`` both ``bf16``) the twin is an exact copy of the model (the BF16 arm):
bit-identical log-probs.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from nemo_ais.config import require_config
from nemo_ais.formats.kv_cache import get_kv_format
from nemo_ais.refit.kv_scales import KVSaturationCounter, KVScales
from nemo_ais.rollout.calibration import (
    kv_scales_from_forward,
    observe_input_amax,
    static_input_modules,
    store_input_amax,
)
from nemo_ais.rollout.config import Fp8RolloutConfig as Fp8RolloutConfig, RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LinearFakeQuant, linear_fake_quant, shared_weight_amax as _shared_weight_amax
from nemo_ais.rollout.faults import RefitFaultInjector
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.modules import head_dim, num_layers, quantized_module, quantized_module_names
from nemo_ais.rollout.readback import RefitReadback, kv_scale_readback, weight_readback
from nemo_ais.rollout.sampling import (
    GenerationOutput,
    check_prompt,
    check_token_ids,
    generate,
    logprob_mismatch as logprob_mismatch,
    score_responses,
)
from nemo_ais.rollout.weight_loader import WeightLoader, received_kv_scales

logger = logging.getLogger(__name__)


class RolloutTwin:
    """Simulated low-precision rollout engine of a HF causal LM (module doc).

    Attributes:
        model: the twin (a deep copy, eval mode; never ``.to(dtype)``: use ``compute_dtype``).
        quantized_module_names: the modules running the format (empty for ``bf16``).
        kv_scales: the current :class:`~nemo_ais.refit.kv_scales.KVScales`, or None.
        kv_saturation: the last quantized-cache call's :class:`~nemo_ais.refit.kv_scales.KVSaturationCounter`
            (``.metrics()``), or None.
    """

    def __init__(self, model: nn.Module, config: RolloutPrecisionConfig | None = None) -> None:
        require_config(config, RolloutPrecisionConfig, "RolloutTwin(config)", optional=True)
        # error_scale 0 is the BF16 engine itself (the dial's k = 0), not an fp32 replay of it
        self.config = (config if config is not None else RolloutPrecisionConfig()).simulated()
        self.fake_quant: LinearFakeQuant = linear_fake_quant(self.config)
        twin = copy.deepcopy(model)
        # eval() only: flipping requires_grad can change the CPU GEMM kernel (last bits).
        twin.eval()
        if self.config.torch_compute_dtype is not None:
            twin.to(self.config.torch_compute_dtype)
        self.num_layers = num_layers(twin)
        kv = get_kv_format(self.config.kv_cache) if self.kv_cache_quantized else None
        if kv is not None and kv.head_dim_multiple > 1:  # read the head dim only where it matters
            kv.check_head_dim(head_dim(twin), "RolloutTwin")
        names = self.quantized_module_names = tuple(quantized_module_names(twin, self.config))
        amax = {}
        if self.fake_quant.shared_weight_amax:
            linears = {n: m for n in names if isinstance(m := twin.get_submodule(n), nn.Linear)}
            amax = _shared_weight_amax({f"{n}.weight": m.weight for n, m in linears.items()})
        for name in names:
            weight_amax = amax.get(f"{name}.weight")
            new = quantized_module(twin.get_submodule(name), name, self.config, self.fake_quant, weight_amax)
            twin.set_submodule(name, new)
        self.model = twin
        self.kv_scales: KVScales | None = None
        self.readback: RefitReadback | None = None  # of the last refit (config.verify_refit)
        self.kv_saturation: KVSaturationCounter | None = None
        self._loader = WeightLoader(
            twin, self.quantized_module_names, self.fake_quant.shared_weight_amax, self.config.torch_compute_dtype
        )
        fault = self.config.refit_fault  # TEST/BENCH ONLY (nemo_ais.rollout.faults)
        self._fault = None if fault is None else RefitFaultInjector(fault, self)

    @property
    def fp8_module_names(self) -> tuple[str, ...]:
        """The quantized modules (the FP8 twin's name for :attr:`quantized_module_names`)."""
        return self.quantized_module_names

    @property
    def kv_cache_fp8(self) -> bool:
        """Whether the KV cache is simulated in FP8 (``kv_cache == "fp8"``)."""
        return self.config.kv_cache_fp8

    @property
    def kv_cache_quantized(self) -> bool:
        """Whether the KV cache is quantized at all (``fp8`` or ``nvfp4``)."""
        return self.config.kv_cache != "bf16"

    @torch.no_grad()
    def sync_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        calibration_input_ids: torch.Tensor | None = None,
        calibration_attention_mask: torch.Tensor | None = None,
    ) -> int:
        """Refit: load the trainer's current weights by HF name, re-quantizing; returns the count.

        A partial set updates only those tensors (NVFP4's fused shards come together); format ``fp8`` also takes codes
        plus ``<name>_scale_inv``. KV scales sent with the refit become :attr:`kv_scales`; else they and the input amax
        are recalibrated on the calibration batch, if given, or the next :meth:`generate` / :meth:`score` batch.

        Raises:
            ValueError: an unknown name, a shape mismatch, non-finite values, codes without scales or for a module held
                in high precision, a fused NVFP4 group incomplete, or KV scales missing, not one number or for no layer
                (the weights are then loaded and no KV scale is held: the next batch calibrates them).
        """
        items = self._loader.as_held(weights.items() if isinstance(weights, Mapping) else weights)
        sent = None  # the refit's tensors by name, for the fault and the readback
        if self._fault is not None or self.config.verify_refit:
            items = list(items)
            sent = dict(items)
        previous_kv_scales = self.kv_scales
        try:
            n_loaded, kv_sent = self._loader.load(items)
            self.kv_scales = received_kv_scales(kv_sent, self.num_layers) if kv_sent else None
        except BaseException:
            # weights may be in: no scale or readback of the previous refit may pass for this one's
            self.kv_scales = self.readback = None
            raise
        finally:
            for module in static_input_modules(self.model, self.fake_quant).values():
                module.input_amax = None  # stale: the weights moved
        if self._fault is not None:  # TEST/BENCH ONLY: a planted refit bug
            self._fault.after_load(self, sent, previous_kv_scales)
        if calibration_input_ids is not None:
            if calibration_attention_mask is None:
                calibration_attention_mask = torch.ones_like(calibration_input_ids)
            self._calibrate_stale(calibration_input_ids, calibration_attention_mask)
        if self.config.verify_refit:
            self.readback = self._read_back(
                sent, None if kv_sent else calibration_input_ids, calibration_attention_mask
            )
        return n_loaded

    def _read_back(
        self, weights: dict[str, torch.Tensor], input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> RefitReadback:
        """This refit read back (:mod:`nemo_ais.rollout.readback`); KV only with a batch."""
        error, module, count = weight_readback(self.model, self.quantized_module_names, weights)
        kv_error = None
        if self.kv_cache_quantized and input_ids is not None:
            expected = kv_scales_from_forward(self.model, self.num_layers, self.config, input_ids, attention_mask)
            kv_error = kv_scale_readback(self.kv_scales, expected)
        return RefitReadback(error, module, kv_error, count)

    @property
    def input_amax(self) -> dict[str, torch.Tensor | None]:
        """``{module name: static input amax}`` (``nvfp4_w4a4``; None = not calibrated)."""
        return {n: m.input_amax for n, m in static_input_modules(self.model, self.fake_quant).items()}

    def _calibrate_stale(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        if any(a is None for a in self.input_amax.values()):
            self.calibrate_input_amax(input_ids, attention_mask)
        if self.kv_cache_quantized and self.kv_scales is None:
            self.calibrate_kv_scales(input_ids, attention_mask)

    @torch.no_grad()
    def calibrate_input_amax(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, model: nn.Module | None = None
    ) -> dict[str, torch.Tensor]:
        """Static input amax of every W4A4 linear, stored and returned as ``{name: 0-dim fp32}``.

        One forward of the batch with activation quantization off (ModelOpt's ``max``), of the twin or of ``model`` (a
        trainer with the same module names); a MoE projection's experts share the max [reconstruction: one input scale
        per fused MoE projection, as vLLM's NVFP4 MoE kernels apply]. ValueError: a module never observed, or
        non-finite inputs.
        """
        check_prompt(input_ids, attention_mask)
        modules = static_input_modules(self.model, self.fake_quant)
        if not modules:
            return {}
        observed = self.model if model is None else model
        return store_input_amax(modules, observe_input_amax(observed, modules, input_ids, attention_mask))

    @torch.no_grad()
    def calibrate_kv_scales(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, model: nn.Module | None = None
    ) -> KVScales:
        """Per-layer KV scales from one forward (KV unquantized) of the twin or ``model``, stored.

        ``scale = max(amax, floor) * margin / 448`` of K and V as the cache receives them (after RoPE) at
        non-padding positions; the NVFP4 cache uses ``scale * 448`` as its static global amax.
        """
        check_prompt(input_ids, attention_mask)
        if model is None and any(a is None for a in self.input_amax.values()):
            self.calibrate_input_amax(input_ids, attention_mask)
        observed = self.model if model is None else model
        self.kv_scales = kv_scales_from_forward(observed, self.num_layers, self.config, input_ids, attention_mask)
        logger.debug("calibrated KV scales (q, k, v): %s", self.kv_scales.scale)
        return self.kv_scales

    def _cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> DynamicCache | None:
        """Calibrate what is stale on these prompts; a fresh quantized KV cache or None."""
        self._calibrate_stale(input_ids, attention_mask)
        if not self.kv_cache_quantized:
            return None
        assert self.kv_scales is not None
        self.kv_saturation = KVSaturationCounter(self.kv_scales)
        return QuantizedKVCache(self.config.kv_cache, self.kv_scales, self.kv_saturation, self.config.error_scale)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **sampling: Any) -> GenerationOutput:
        """:func:`~nemo_ais.rollout.sampling.generate` with the twin (keyword arguments as there).

        Stale calibration is first redone on these prompts (vLLM's ``calculate_kv_scales``).
        """
        check_token_ids(self.model, input_ids=input_ids)  # before the calibration forward reads them
        cache = self._cache(input_ids, attention_mask)
        return generate(self.model, input_ids, attention_mask, past_key_values=cache, **sampling)

    def score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_ids: torch.Tensor, **sampling: Any
    ) -> torch.Tensor:
        """:func:`~nemo_ais.rollout.sampling.score_responses` under the twin: ``[B, T]`` fp32."""
        check_token_ids(self.model, input_ids=input_ids, response_ids=response_ids)  # before the calibration forward
        cache = self._cache(input_ids, attention_mask)
        return score_responses(self.model, input_ids, attention_mask, response_ids, past_key_values=cache, **sampling)


Fp8Twin = RolloutTwin  # the earlier name, kept: the twin was FP8-only
