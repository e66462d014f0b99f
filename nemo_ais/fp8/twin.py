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
   linears) becomes the format's module (:class:`~nemo_ais.fp8.fp8_linear.Fp8Linear` for
   ``fp8``, :class:`~nemo_ais.fp8.quant_linear.QuantLinear` otherwise), fused
   transformers-5 MoE experts one module per expert and projection; embeddings,
   ``lm_head``, norms and MoE routers stay unquantized, and so do the exclusions:
   the first/last ``num_*_layers_in_bf16`` layers, attention (``attention_in_bf16``) and
   ``keep_patterns``. A quantized linear's in-dim must suit the format (16 NVFP4, 32 MXFP8).
2. Refit (:meth:`RolloutTwin.sync_weights`): every step the trainer's weights are
   re-quantized (FP8 may also take codes + scales from the vLLM-format stream). NVFP4
   shards that vLLM fuses (q/k/v_proj, gate/up_proj of a layer) share one weight amax,
   the max over the group (:func:`~nemo_ais.fp8.formats.shared_weight_amax`), as
   vLLM's loader requires; the rest is copied as is.
3. Calibration, stale after every refit: the KV-cache scales (``fp8`` / ``nvfp4`` KV:
   ``amax * margin / 448`` per layer from :class:`~nemo_ais.fp8.kv_scales.KVScaleCalibrator`
   under ``kv_calibration_reduction``: by default NeMo-RL's rule, ``max |K|`` of the
   calibration forward,
   or sent with the refit) and, for ``nvfp4_w4a4``, each quantized linear's static input
   amax: ``max |x|`` of its input over the valid tokens of one forward with activation
   quantization off (ModelOpt's ``max`` calibration; vLLM's ``input_scale = amax / 2688``).
   Done on ``sync_weights(..., calibration_input_ids=...)`` or else on the next
   :meth:`~RolloutTwin.generate` / :meth:`~RolloutTwin.score` batch.
4. KV cache (:class:`~nemo_ais.fp8.kv_cache.QuantizedKVCache`): K after RoPE and V are
   fake-quantized as they are written, so attention reads the quantized values.
5. Generation (:func:`~nemo_ais.fp8.generation.generate`): a sampling loop with HF's KV
   cache; the reported log-prob is that of the UNFILTERED tempered distribution.

With nothing to simulate (``format: bf16``, ``kv_cache: bf16``, no ``compute_dtype``;
``Fp8RolloutConfig(enabled=False)``) the twin is an exact copy of the original model (the
BF16 arm's rollout engine): same code path, bit-identical log-probs.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from nemo_ais.config import require_config
from nemo_ais.fp8.checks import check_finite
from nemo_ais.fp8.formats import LinearFakeQuant, fused_shard_group, linear_fake_quant
from nemo_ais.fp8.formats import shared_weight_amax as _shared_weight_amax
from nemo_ais.fp8.fp8_linear import Fp8Experts, Fp8Linear
from nemo_ais.fp8.generation import (
    GenerationOutput,
    LogprobsMode,
    MismatchStats,
    check_prompt,
    generate,
    logprob_mismatch,
    positions,
    score_responses,
)
from nemo_ais.fp8.grids import E4M3_MAX
from nemo_ais.fp8.kv_cache import QuantizedKVCache
from nemo_ais.fp8.kv_scales import (
    KVSaturationCounter,
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
)
from nemo_ais.fp8.nvfp4 import NVFP4_BLOCK
from nemo_ais.fp8.quant_linear import QuantExperts, QuantLinear
from nemo_ais.fp8.rollout_config import Fp8RolloutConfig, RolloutPrecisionConfig

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
    "score_responses",
]

logger = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
# A decoder layer's index in a HF module name: "model.layers.3.self_attn.q_proj".
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ATTENTION_RE = re.compile(r"\.self_attn\.")
# KV-cache scale names of a refit stream (kv_scales.kv_scale_names, or vLLM's remapped).
_KV_SCALE_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:attn\.)?([qkv])_scale$")
_SCALE_SUFFIX = "_scale_inv"  # "<...>.weight" -> "<...>.weight_scale_inv"
_SYNC_NONFINITE = "refusing to sync NaN/Inf into the engine"
# Linear layers inside a decoder layer that vLLM keeps in BF16 (MoE routers).
_ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})


def _num_layers(model: nn.Module) -> int:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


def _head_dim(model: nn.Module) -> int:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None)
    return int(head_dim or text.hidden_size // text.num_attention_heads)


def _is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused MoE experts module (3-D ``gate_up_proj`` / ``down_proj``)."""
    weight = getattr(module, "gate_up_proj", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 3


def _in_features(module: nn.Module) -> list[int]:
    if isinstance(module, nn.Linear):
        return [module.in_features]
    return [module.gate_up_proj.shape[-1], module.down_proj.shape[-1]]


def quantized_module_names(model: nn.Module, config: RolloutPrecisionConfig) -> list[str]:
    """Names of the modules the format quantizes (module doc, step 1), in model order.

    Raises:
        ValueError: first + last BF16 layers exceed the model's layers, or a quantized
            module's in-dim is not a multiple of the format's block (naming the module).
    """
    if config.format == "bf16":
        return []
    n_layers = _num_layers(model)
    first, last = config.num_first_layers_in_bf16, config.num_last_layers_in_bf16
    if first + last > n_layers:
        raise ValueError(
            f"num_first_layers_in_bf16={first} + num_last_layers_in_bf16={last} is invalid: "
            f"expected <= the model's {n_layers} decoder layers"
        )
    k_multiple = linear_fake_quant(config).k_multiple
    names = []
    for name, module in model.named_modules():
        match = _LAYER_RE.search(name)
        if match is None or not (isinstance(module, nn.Linear) or _is_fused_experts(module)):
            continue
        layer = int(match.group(1))
        kept = (
            layer < first
            or layer >= n_layers - last
            or name.rsplit(".", 1)[-1] in _ROUTER_NAMES
            or (config.attention_in_bf16 and _ATTENTION_RE.search(name) is not None)
            or any(re.search(p, name) for p in config.keep_patterns)
        )
        if kept:
            continue
        bad = [k for k in _in_features(module) if k % k_multiple]
        if bad:
            raise ValueError(
                f"{name}: in-dim {bad[0]} is not a multiple of {k_multiple}, which format "
                f"{config.format!r} needs (blocks along the in-dim); keep it unquantized "
                f"with keep_patterns=[{re.escape(name)!r}]"
            )
        names.append(name)
    return names


class RolloutTwin:
    """Simulated low-precision rollout engine of a HF causal LM (module doc).

    Attributes:
        model: the twin (a deep copy of the original, eval mode). Do not call
            ``.to(dtype)`` on it: that would cast the FP8 codes (use ``compute_dtype``).
        config: the :class:`RolloutPrecisionConfig` (or its subclass
            :class:`Fp8RolloutConfig`) it was built with.
        fake_quant: the format's :class:`~nemo_ais.fp8.formats.LinearFakeQuant`.
        quantized_module_names: the modules running the format (empty for ``bf16``).
        kv_scales: the current :class:`~nemo_ais.fp8.kv_scales.KVScales` (``scale`` is
            float64 ``[layers, 3]``, columns q, k, v; q is not simulated and stays 1.0),
            or None until calibrated (quantized KV cache only).
        kv_saturation: the :class:`~nemo_ais.fp8.kv_scales.KVSaturationCounter` of the
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
        self.num_layers = _num_layers(twin)
        if self.config.kv_cache == "nvfp4" and _head_dim(twin) % NVFP4_BLOCK:
            raise ValueError(
                f"kv_cache='nvfp4' needs a head dim that is a multiple of {NVFP4_BLOCK}, "
                f"got {_head_dim(twin)}"
            )
        self.quantized_module_names = tuple(quantized_module_names(twin, self.config))
        amax = self._initial_weight_amax(twin)
        for name in self.quantized_module_names:
            self._replace_module(twin, name, amax)
        self.model = twin
        self.kv_scales: KVScales | None = None
        # K/V elements the last generate / score's quantized cache saturated (|x| > s * 448)
        self.kv_saturation: KVSaturationCounter | None = None
        self._targets = self._sync_targets()
        self._fp8_weights = {
            f"{n}.weight": m
            for n in self.quantized_module_names
            if isinstance(m := self.model.get_submodule(n), Fp8Linear)
        }
        self._weight_groups = self._shared_amax_groups()

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
        cfg = self.config
        parent_name, _, child = name.rpartition(".")
        parent = twin.get_submodule(parent_name)
        module = getattr(parent, child)
        if cfg.format == "fp8":
            quant = dict(
                weight_block=cfg.weight_block,
                activation_group=cfg.activation_group,
                weight_family=cfg.weight_family,
                activation_family=cfg.activation_family,
                weight_eps=cfg.weight_eps,
                activation_eps=cfg.activation_eps,
                ue8m0=cfg.ue8m0,
            )
            if isinstance(module, nn.Linear):
                new = Fp8Linear.from_linear(module, name=f"{name}.weight", **quant)
            else:
                new = Fp8Experts(module, name=name, **quant)
        elif isinstance(module, nn.Linear):
            new = QuantLinear(
                module.weight.detach(),
                module.bias,
                self.fake_quant,
                name=f"{name}.weight",
                weight_amax=amax.get(f"{name}.weight"),
            )
        else:
            new = QuantExperts(
                module, lambda w, n: QuantLinear(w, None, self.fake_quant, name=n), name=name
            )
        setattr(parent, child, new)

    def _shared_amax_groups(self) -> dict[str, tuple[str, ...]]:
        """``{weight name: the weight names sharing its amax}`` for groups of 2 or more."""
        if not self.fake_quant.shared_weight_amax:
            return {}
        groups: dict[str, list[str]] = {}
        for name in self.quantized_module_names:
            if isinstance(self.model.get_submodule(name), QuantLinear):
                groups.setdefault(fused_shard_group(name), []).append(f"{name}.weight")
        return {n: tuple(g) for g in groups.values() if len(g) > 1 for n in g}

    def _static_input_modules(self) -> dict[str, QuantLinear]:
        """The quantized linears whose activations need a calibrated static amax."""
        if not self.fake_quant.static_input_amax:
            return {}
        return {
            n: m
            for n, m in self.model.named_modules()
            if isinstance(m, QuantLinear) and m.fake_quant.static_input_amax
        }

    # ---- refit ----------------------------------------------------------------------

    def _sync_targets(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """Map each trainer tensor name to the function that loads it into the twin."""
        targets: dict[str, Callable[[torch.Tensor], None]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            targets[name] = self._copier(name, param)
        for name, buf in self.model.named_buffers(remove_duplicate=False):
            # codes, scales and caches are written by the load functions below
            if not name.endswith((".weight", ".weight_scale_inv", ".weight_dequant")):
                targets[name] = self._copier(name, buf)
        for name in self.quantized_module_names:
            module = self.model.get_submodule(name)
            if isinstance(module, QuantExperts):
                for param, load in module.loaders().items():
                    targets[f"{name}.{param}"] = load
                continue
            targets[f"{name}.weight"] = module.load_weight
            if module.bias is not None:
                targets[f"{name}.bias"] = module.load_bias
        return targets

    @staticmethod
    def _copier(name: str, target: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def copy_(tensor: torch.Tensor) -> None:
            if tensor.shape != target.shape:
                raise ValueError(
                    f"sync_weights: {name} got {list(tensor.shape)}, expected {list(target.shape)}"
                )
            target.copy_(tensor)

        return copy_

    def _load_group(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the complete fused group ``weights`` with their shared amax."""
        amax = _shared_weight_amax(weights)
        for name, tensor in weights.items():
            module = self.model.get_submodule(name.removesuffix(".weight"))
            module.load_weight(tensor, amax=amax[name])

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
        receives it from :func:`~nemo_ais.fp8.stream.fp8_weight_stream`:
        ``(name, float8_e4m3fn codes)`` plus ``(name + "_scale_inv", fp32 scales)``,
        loaded as is. KV-cache scales sent with the refit
        (``model.layers.N.self_attn.k_scale`` / ``v_scale``, e.g.
        :meth:`~nemo_ais.fp8.kv_scales.KVScales.named_tensors`) become :attr:`kv_scales`
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
        n_loaded = 0
        pending: dict[str, dict[str, torch.Tensor]] = {}  # FP8 weight name -> codes/scale
        groups: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}  # fused NVFP4 shards
        kv_sent: dict[tuple[int, str], float] = {}
        for name, tensor in items:
            weight_name = name[: -len(_SCALE_SUFFIX)] if name.endswith(_SCALE_SUFFIX) else name
            kv_match = _KV_SCALE_RE.search(name)
            if weight_name in self._fp8_weights and (
                name != weight_name or tensor.dtype == FP8_DTYPE
            ):
                part = "scale" if name != weight_name else "codes"
                pending.setdefault(weight_name, {})[part] = tensor
                if len(pending[weight_name]) == 2:
                    got = pending.pop(weight_name)
                    self._fp8_weights[weight_name].load_quantized(got["codes"], got["scale"])
            elif kv_match is not None:
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                kv_sent[(int(kv_match.group(1)), kv_match.group(2))] = float(tensor)
            elif name in self._weight_groups:
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                group = groups.setdefault(self._weight_groups[name], {})
                group[name] = tensor.detach()
                if len(group) == len(self._weight_groups[name]):
                    self._load_group(groups.pop(self._weight_groups[name]))
            elif name in self._targets:
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                self._targets[name](tensor.detach())
            else:
                raise ValueError(
                    f"sync_weights: unknown tensor name {name!r}, expected a name of the "
                    f"original model's state_dict (e.g. {next(iter(self._targets))!r}), "
                    "its '.weight_scale_inv' or a KV-cache scale"
                )
            n_loaded += 1
        if pending:
            first = next(iter(pending))
            raise ValueError(
                f"sync_weights: {first} got only its {next(iter(pending[first]))} in FP8 "
                f"format, expected both '{first}' (float8_e4m3fn) and '{first}{_SCALE_SUFFIX}'"
            )
        if groups:
            members, got = next(iter(groups.items()))
            raise ValueError(
                f"sync_weights: {', '.join(sorted(set(members) - got.keys()))} missing: NVFP4 "
                f"shards {', '.join(members)} share one global scale (vLLM fuses them), "
                "expected all of them in the same sync"
            )
        for module in self._static_input_modules().values():
            module.input_amax = None  # stale: the weights moved
        self.kv_scales = self._received_kv_scales(kv_sent) if kv_sent else None
        if calibration_input_ids is not None:
            if calibration_attention_mask is None:
                calibration_attention_mask = torch.ones_like(calibration_input_ids)
            self._calibrate_stale(calibration_input_ids, calibration_attention_mask)
        return n_loaded

    def _received_kv_scales(self, sent: dict[tuple[int, str], float]) -> KVScales:
        """KV scales sent with the refit -> :class:`KVScales` (``amax = scale * 448``)."""
        missing = [
            f"layer {i} {kind}"
            for i in range(self.num_layers)
            for kind in ("k", "v")
            if (i, kind) not in sent
        ]
        bad = {k: v for k, v in sent.items() if not v > 0}
        if missing or bad:
            raise ValueError(
                f"sync_weights: KV-cache scales incomplete or invalid (missing: "
                f"{', '.join(missing[:6]) or 'none'}; not > 0: {bad or 'none'}), expected a "
                f"positive k_scale and v_scale for each of the {self.num_layers} layers"
            )
        scale = torch.ones(self.num_layers, 3, dtype=torch.float64)
        for (layer, kind), value in sent.items():
            scale[layer, "qkv".index(kind)] = value
        include_q = all((i, "q") in sent for i in range(self.num_layers))
        return KVScales(scale * E4M3_MAX, scale, include_q)

    # ---- calibration ----------------------------------------------------------------

    @property
    def input_amax(self) -> dict[str, torch.Tensor | None]:
        """``{module name: static input amax}`` (``nvfp4_w4a4``; None = not calibrated)."""
        return {n: m.input_amax for n, m in self._static_input_modules().items()}

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
        modules = self._static_input_modules()
        if not modules:
            return {}
        observed = self.model if model is None else model
        mask = attention_mask.to(torch.bool)
        seen: dict[str, torch.Tensor] = {}

        def hook(name: str):
            def record(_module: nn.Module, inputs: tuple) -> None:
                x = inputs[0]
                rows = x[mask] if tuple(x.shape[:-1]) == tuple(mask.shape) else x
                amax = rows.detach().abs().amax().to(torch.float32) if rows.numel() else None
                if amax is not None:
                    seen[name] = amax if name not in seen else torch.maximum(seen[name], amax)

            return record

        handles = [observed.get_submodule(n).register_forward_pre_hook(hook(n)) for n in modules]
        for module in modules.values():
            module.calibrating = True
        try:
            observed(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions(attention_mask),
                logits_to_keep=1,
            )
        finally:
            for module in modules.values():
                module.calibrating = False
            for handle in handles:
                handle.remove()
        return self._store_input_amax(modules, seen)

    def _store_input_amax(
        self, modules: dict[str, QuantLinear], seen: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Experts share their projection's max; check, store and return the amax table."""
        expert_max: dict[str, torch.Tensor] = {}
        for name, amax in seen.items():
            key = re.sub(r"\.\d+$", "", name)  # "...experts.gate_up_proj.3" -> per projection
            expert_max[key] = (
                amax if key not in expert_max else torch.maximum(expert_max[key], amax)
            )
        out = {}
        for name, module in modules.items():
            key = re.sub(r"\.\d+$", "", name)
            amax = seen.get(name)
            if ".experts." in f".{name}" and key in expert_max:
                amax = expert_max[key]
            if amax is None:
                raise ValueError(
                    f"calibrate_input_amax: no input observed for {name}; expected every "
                    "W4A4 linear to run in the calibration forward"
                )
            check_finite(amax, f"calibrate_input_amax: {name}", what="activations", action="")
            module.input_amax = amax
            out[name] = amax
        return out

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
        by :class:`~nemo_ais.fp8.kv_scales.KVScaleCalibrator` (K before RoPE, the HF-hook
        rule; the cache applies the scale to K after RoPE, as vLLM does). The NVFP4 KV
        cache uses ``scale * 448`` as its static global amax. The result is stored in
        :attr:`kv_scales` and used until the next :meth:`sync_weights`.

        Args:
            input_ids, attention_mask: a left-padded ``[B, S]`` calibration batch.
            model: the model to observe: None = the twin itself (engine-side, like
                vLLM's ``calculate_kv_scales``); pass the trainer's model for NeMo-RL's
                trainer-side calibration.

        Returns:
            :class:`~nemo_ais.fp8.kv_scales.KVScales`; K and V scales finite and > 0.
        """
        check_prompt(input_ids, attention_mask)
        cfg = self.config
        if model is None and any(a is None for a in self.input_amax.values()):
            self.calibrate_input_amax(input_ids, attention_mask)
        observed = self.model if model is None else model
        calibrator = KVScaleCalibrator(
            self.num_layers,
            KVScaleConfig(
                reduction=cfg.kv_calibration_reduction,
                percentile=cfg.kv_calibration_percentile,
                margin=cfg.kv_calibration_margin,
                amax_floor=cfg.kv_amax_floor,
                include_q=False,
            ),
        )
        calibrator.token_mask = attention_mask
        with calibrator.install_hooks(observed):
            observed(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions(attention_mask),
                logits_to_keep=1,
            )
        self.kv_scales = calibrator.compute_scales()
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
        """:func:`~nemo_ais.fp8.generation.generate` with the twin, arguments as there.

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
        """:func:`~nemo_ais.fp8.generation.score_responses` under the twin: ``[B, T]`` fp32."""
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
