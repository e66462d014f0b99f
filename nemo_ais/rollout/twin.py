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
"""Simulated low-precision rollout engine: the "twin" of a Hugging Face causal LM.

The twin stands in for vLLM running in one rollout format (``fp8``, ``mxfp8``,
``nvfp4_w4a16``, ``nvfp4_w4a4``, or ``bf16``) with a ``bf16``, ``fp8`` or ``nvfp4`` KV
cache, on one CPU machine, so the rollout-training mismatch that AIS corrects is real and
measurable without a GPU. What it simulates (``docs/low_precision.md``, "Twin"):

1. Build: a deep copy of the trainer's model (cast to ``compute_dtype`` if set). Every
   ``nn.Linear`` inside a decoder layer (q/k/v/o_proj, gate/up/down_proj, per-expert
   linears) becomes the format's module (:class:`~nemo_ais.rollout.linear.Fp8Linear` for
   ``fp8``, :class:`~nemo_ais.rollout.linear.QuantLinear` otherwise), fused
   transformers-5 MoE experts one module per expert and projection; embeddings,
   ``lm_head``, norms and MoE routers stay unquantized, and so do the exclusions:
   the first/last ``num_*_layers_in_bf16`` layers, attention (``attention_in_bf16``) and
   ``keep_patterns``. A quantized linear's in-dim must suit the format (16 NVFP4, 32 MXFP8).
2. Refit (:meth:`RolloutTwin.sync_weights`): every step the trainer's weights are
   re-quantized (FP8 may also take codes + scales from the vLLM-format stream). NVFP4
   shards that vLLM fuses (q/k/v_proj, gate/up_proj of a layer) share one weight amax,
   the max over the group (:func:`~nemo_ais.rollout.fake_quant.shared_weight_amax`), as
   vLLM's loader requires; the rest is copied as is.
3. Calibration, stale after every refit: the KV-cache scales (``fp8`` / ``nvfp4`` KV:
   ``amax * margin / 448`` per layer from :class:`~nemo_ais.refit.kv_scales.KVScaleCalibrator`
   under ``kv_calibration_reduction``: by default NeMo-RL's rule, ``max |K|`` of the
   calibration forward,
   or sent with the refit) and, for ``nvfp4_w4a4``, each quantized linear's static input
   amax: ``max |x|`` of its input over the valid tokens of one forward with activation
   quantization off (ModelOpt's ``max`` calibration; vLLM's ``input_scale = amax / 2688``).
   Done on ``sync_weights(..., calibration_input_ids=...)`` or else on the next
   :meth:`~RolloutTwin.generate` / :meth:`~RolloutTwin.score` batch.
4. KV cache (:class:`~nemo_ais.rollout.kv_cache.QuantizedKVCache`): K after RoPE and V are
   fake-quantized as they are written, so attention reads the quantized values.
5. Generation (:func:`~nemo_ais.rollout.sampling.generate`): a sampling loop with HF's KV
   cache; the reported log-prob is that of the UNFILTERED tempered distribution.

With nothing to simulate (``format: bf16``, ``kv_cache: bf16``, no ``compute_dtype``;
``Fp8RolloutConfig(enabled=False)``) the twin is an exact copy of the original model (the
BF16 arm's rollout engine): same code path, bit-identical log-probs.

Layout: this module holds :class:`RolloutTwin` (its state and public methods); step 1
lives in :mod:`~nemo_ais.rollout.modules`, step 2 in :mod:`~nemo_ais.rollout.weight_loader`,
step 3's forwards in :mod:`~nemo_ais.rollout.calibration`, step 4 in
:mod:`~nemo_ais.rollout.kv_cache` and step 5 in :mod:`~nemo_ais.rollout.sampling`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from nemo_ais.config import require_config
from nemo_ais.formats.nvfp4 import NVFP4_BLOCK
from nemo_ais.refit.kv_scales import KVSaturationCounter, KVScales
from nemo_ais.rollout.calibration import (
    kv_scales_from_forward,
    observe_input_amax,
    static_input_modules,
    store_input_amax,
)
from nemo_ais.rollout.config import Fp8RolloutConfig, RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LinearFakeQuant, linear_fake_quant
from nemo_ais.rollout.fake_quant import shared_weight_amax as _shared_weight_amax
from nemo_ais.rollout.faults import RefitFaultInjector
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.modules import (
    head_dim,
    num_layers,
    quantized_module,
    quantized_module_names,
)
from nemo_ais.rollout.sampling import (
    GenerationOutput,
    LogprobsMode,
    MismatchStats,
    check_prompt,
    generate,
    logprob_mismatch,
    score_responses,
)
from nemo_ais.rollout.weight_loader import WeightLoader, received_kv_scales

__all__ = [
    "Fp8RolloutConfig",
    "Fp8Twin",
    "GenerationOutput",
    "LogprobsMode",
    "MismatchStats",
    "RolloutPrecisionConfig",
    "RolloutTwin",
    "generate",
    "logprob_mismatch",
    "quantized_module_names",
    "score_responses",
]

logger = logging.getLogger(__name__)


class RolloutTwin:
    """Simulated low-precision rollout engine of a HF causal LM (module doc).

    Attributes:
        model: the twin (a deep copy of the original, eval mode). Do not call
            ``.to(dtype)`` on it: that would cast the FP8 codes (use ``compute_dtype``).
        config: the :class:`RolloutPrecisionConfig` (or its subclass
            :class:`Fp8RolloutConfig`) it was built with.
        fake_quant: the format's :class:`~nemo_ais.rollout.fake_quant.LinearFakeQuant`.
        quantized_module_names: the modules running the format (empty for ``bf16``).
        kv_scales: the current :class:`~nemo_ais.refit.kv_scales.KVScales` (``scale`` is
            float64 ``[layers, 3]``, columns q, k, v; q is not simulated and stays 1.0),
            or None until calibrated (quantized KV cache only).
        kv_saturation: the :class:`~nemo_ais.refit.kv_scales.KVSaturationCounter` of the
            last ``generate`` / ``score`` with a quantized KV cache: the fraction of the K/V
            elements it wrote with ``|x| > scale * 448`` (``.metrics()``:
            ``kv_cache/saturated_frac_k`` / ``_v``); None before.
        num_layers: decoder layers.
    """

    def __init__(self, model: nn.Module, config: RolloutPrecisionConfig | None = None) -> None:
        require_config(config, RolloutPrecisionConfig, "RolloutTwin(config)", optional=True)
        self.config = config if config is not None else RolloutPrecisionConfig()
        self.fake_quant: LinearFakeQuant = linear_fake_quant(self.config)
        twin = copy.deepcopy(model)
        # eval() only: requires_grad flags are kept, since flipping them can change which
        # CPU GEMM kernel runs (and so the last bits); every call runs under no_grad.
        twin.eval()
        if self.config.torch_compute_dtype is not None:
            twin.to(self.config.torch_compute_dtype)
        self.num_layers = num_layers(twin)
        if self.config.kv_cache == "nvfp4" and head_dim(twin) % NVFP4_BLOCK:
            raise ValueError(
                f"kv_cache='nvfp4' needs a head dim that is a multiple of {NVFP4_BLOCK}, "
                f"got {head_dim(twin)}"
            )
        self.quantized_module_names = tuple(quantized_module_names(twin, self.config))
        amax = self._initial_weight_amax(twin)
        for name in self.quantized_module_names:
            self._replace_module(twin, name, amax)
        self.model = twin
        self.kv_scales: KVScales | None = None
        # K/V elements the last generate / score's quantized cache saturated (|x| > s * 448)
        self.kv_saturation: KVSaturationCounter | None = None
        self._loader = WeightLoader(
            twin, self.quantized_module_names, self.fake_quant.shared_weight_amax
        )
        fault = self.config.refit_fault  # TEST/BENCH ONLY (nemo_ais.rollout.faults)
        self._fault = None if fault is None else RefitFaultInjector(fault, self)

    # ---- build ----------------------------------------------------------------------

    @property
    def fp8_module_names(self) -> tuple[str, ...]:
        """The quantized modules (the FP8 twin's name for :attr:`quantized_module_names`)."""
        return self.quantized_module_names

    @property
    def kv_cache_fp8(self) -> bool:
        """Whether the KV cache is simulated in FP8 (``kv_cache == "fp8"``)."""
        return self.config.kv_cache == "fp8"

    @property
    def kv_cache_quantized(self) -> bool:
        """Whether the KV cache is quantized at all (``fp8`` or ``nvfp4``)."""
        return self.config.kv_cache != "bf16"

    def _linear_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``{"<module>.weight": weight}`` of the quantized ``nn.Linear`` modules of ``model``."""
        out = {}
        for name in self.quantized_module_names:
            module = model.get_submodule(name)
            if isinstance(module, nn.Linear):
                out[f"{name}.weight"] = module.weight
        return out

    def _initial_weight_amax(self, model: nn.Module) -> dict[str, torch.Tensor]:
        if not self.fake_quant.shared_weight_amax:
            return {}
        return _shared_weight_amax(self._linear_weights(model))

    def _replace_module(self, twin: nn.Module, name: str, amax: dict[str, torch.Tensor]) -> None:
        parent_name, _, child = name.rpartition(".")
        parent = twin.get_submodule(parent_name)
        module = getattr(parent, child)
        weight_amax = amax.get(f"{name}.weight")
        new = quantized_module(module, name, self.config, self.fake_quant, weight_amax)
        setattr(parent, child, new)

    # ---- refit ----------------------------------------------------------------------

    @torch.no_grad()
    def sync_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        calibration_input_ids: torch.Tensor | None = None,
        calibration_attention_mask: torch.Tensor | None = None,
    ) -> int:
        """Refit: load the trainer's current weights, re-quantizing the quantized linears.

        Accepts a ``state_dict`` or a stream of ``(name, tensor)`` with the original
        model's (HF) names; a partial set updates only those tensors, except that NVFP4's
        fused shards (q/k/v_proj, gate/up_proj of a layer) must come together (they share
        one global scale). In format ``fp8`` a linear's weight may also arrive as vLLM
        receives it from :func:`~nemo_ais.refit.stream.fp8_weight_stream`:
        ``(name, float8_e4m3fn codes)`` plus ``(name + "_scale_inv", fp32 scales)``,
        loaded as is. KV-cache scales sent with the refit
        (``model.layers.N.self_attn.k_scale`` / ``v_scale``, e.g.
        :meth:`~nemo_ais.refit.kv_scales.KVScales.named_tensors`) become :attr:`kv_scales`
        (every layer's K and V are then required). Otherwise every refit makes the KV
        scales and static input amax stale: they are recalibrated here from the
        calibration batch if one is given, else on the next :meth:`generate` /
        :meth:`score` batch.

        Returns:
            The number of tensors loaded.

        Raises:
            ValueError: an unknown name, a shape mismatch, non-finite values (nothing
                after the offending tensor is loaded), FP8 codes without their scales
                (or the reverse), a fused NVFP4 group with a member missing, or KV scales
                missing for some layer.
        """
        items = weights.items() if isinstance(weights, Mapping) else weights
        if self._fault is not None:
            items = list(items)
        n_loaded, kv_sent = self._loader.load(items)
        for module in static_input_modules(self.model, self.fake_quant).values():
            module.input_amax = None  # stale: the weights moved
        previous_kv_scales = self.kv_scales
        self.kv_scales = received_kv_scales(kv_sent, self.num_layers) if kv_sent else None
        if self._fault is not None:  # TEST/BENCH ONLY: a planted refit bug
            self._fault.after_load(self, dict(items), previous_kv_scales)
        if calibration_input_ids is not None:
            if calibration_attention_mask is None:
                calibration_attention_mask = torch.ones_like(calibration_input_ids)
            self._calibrate_stale(calibration_input_ids, calibration_attention_mask)
        return n_loaded

    # ---- calibration ----------------------------------------------------------------

    @property
    def input_amax(self) -> dict[str, torch.Tensor | None]:
        """``{module name: static input amax}`` (``nvfp4_w4a4``; None = not calibrated)."""
        return {
            n: m.input_amax for n, m in static_input_modules(self.model, self.fake_quant).items()
        }

    def _calibrate_stale(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        if any(a is None for a in self.input_amax.values()):
            self.calibrate_input_amax(input_ids, attention_mask)
        if self.kv_cache_quantized and self.kv_scales is None:
            self.calibrate_kv_scales(input_ids, attention_mask)

    @torch.no_grad()
    def calibrate_input_amax(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        model: nn.Module | None = None,
    ) -> dict[str, torch.Tensor]:
        """Static input amax of every W4A4 linear: ``max |x|`` over valid tokens, stored for use.

        One forward of the left-padded ``[B, S]`` batch with activation quantization off
        (ModelOpt's ``max`` calibration). Inputs ``[B, S, K]`` count only where
        ``attention_mask`` is 1; MoE expert inputs (routed rows) all count, and every
        expert of a projection gets the max over the experts [reconstruction: one input
        scale per fused MoE projection, as vLLM's NVFP4 MoE kernels apply].

        Args:
            input_ids, attention_mask: the calibration batch.
            model: the model to observe: None = the twin itself (engine-side); a trainer
                model with the same (unfused) module names for trainer-side calibration.

        Returns:
            ``{module name: 0-dim fp32 amax}`` (empty for formats without static inputs).

        Raises:
            ValueError: a module whose input was never observed, or non-finite inputs.
        """
        check_prompt(input_ids, attention_mask)
        modules = static_input_modules(self.model, self.fake_quant)
        if not modules:
            return {}
        observed = self.model if model is None else model
        return store_input_amax(
            modules, observe_input_amax(observed, modules, input_ids, attention_mask)
        )

    @torch.no_grad()
    def calibrate_kv_scales(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        model: nn.Module | None = None,
    ) -> KVScales:
        """Per-layer KV scales from one forward pass (KV unquantized), stored for use.

        ``scale = max(amax, floor) * margin / 448`` for x = the ``k_proj`` / ``v_proj``
        outputs at non-padding positions, amax by the config's ``kv_calibration_reduction``
        (default NeMo-RL's: ``max |x|`` of this one forward; ``element_percentile``:
        ``P_p(|x|)``), margin and floor from the config, computed
        by :class:`~nemo_ais.refit.kv_scales.KVScaleCalibrator` (K before RoPE, the HF-hook
        rule; the cache applies the scale to K after RoPE, as vLLM does). The NVFP4 KV
        cache uses ``scale * 448`` as its static global amax. The result is stored in
        :attr:`kv_scales` and used until the next :meth:`sync_weights`.

        Args:
            input_ids, attention_mask: a left-padded ``[B, S]`` calibration batch.
            model: the model to observe: None = the twin itself (engine-side, like
                vLLM's ``calculate_kv_scales``); pass the trainer's model for NeMo-RL's
                trainer-side calibration.

        Returns:
            :class:`~nemo_ais.refit.kv_scales.KVScales`; K and V scales finite and > 0.
        """
        check_prompt(input_ids, attention_mask)
        if model is None and any(a is None for a in self.input_amax.values()):
            self.calibrate_input_amax(input_ids, attention_mask)
        observed = self.model if model is None else model
        self.kv_scales = kv_scales_from_forward(
            observed, self.num_layers, self.config, input_ids, attention_mask
        )
        logger.debug("calibrated KV scales (q, k, v): %s", self.kv_scales.scale)
        return self.kv_scales

    # ---- generation -----------------------------------------------------------------

    def _cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> DynamicCache | None:
        """Calibrate what is stale on these prompts; a fresh quantized KV cache or None."""
        self._calibrate_stale(input_ids, attention_mask)
        if not self.kv_cache_quantized:
            return None
        assert self.kv_scales is not None
        self.kv_saturation = KVSaturationCounter(self.kv_scales)
        return QuantizedKVCache(self.config.kv_cache, self.kv_scales, self.kv_saturation)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        logprobs_mode: LogprobsMode = "unfiltered",
    ) -> GenerationOutput:
        """:func:`~nemo_ais.rollout.sampling.generate` with the twin, arguments as there.

        Stale calibration (after a refit: KV scales, W4A4 input amax) is first redone on
        these prompts, as vLLM's ``calculate_kv_scales`` does on its first batch.
        """
        return generate(
            self.model,
            input_ids,
            attention_mask,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            logprobs_mode=logprobs_mode,
            past_key_values=self._cache(input_ids, attention_mask),
        )

    def score(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_ids: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        logprobs_mode: LogprobsMode = "unfiltered",
    ) -> torch.Tensor:
        """:func:`~nemo_ais.rollout.sampling.score_responses` under the twin: ``[B, T]`` fp32."""
        return score_responses(
            self.model,
            input_ids,
            attention_mask,
            response_ids,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            logprobs_mode=logprobs_mode,
            past_key_values=self._cache(input_ids, attention_mask),
        )


Fp8Twin = RolloutTwin  # the earlier name, kept: the twin was FP8-only
