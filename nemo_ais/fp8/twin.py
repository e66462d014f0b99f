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
"""Simulated FP8 rollout engine: the "FP8 twin" of a Hugging Face causal LM.

The twin stands in for vLLM with ``precision: fp8`` (and optionally
``kv_cache_dtype: fp8``) on one CPU machine, so the rollout-training mismatch that AIS
corrects is real and measurable without a GPU. What it simulates (``docs/low_precision.md``):

1. Build: a deep copy of the trainer's model. Every ``nn.Linear`` inside a decoder
   layer (q/k/v/o_proj, gate/up/down_proj, per-expert linears) becomes a W8A8
   :class:`~nemo_ais.fp8.fp8_linear.Fp8Linear`, fused transformers-5 MoE experts an
   :class:`~nemo_ais.fp8.fp8_linear.Fp8Experts`; embeddings, ``lm_head``, norms, MoE
   routers and the first/last ``num_*_layers_in_bf16`` decoder layers stay unquantized.
2. Refit (:meth:`Fp8Twin.sync_weights`): every step the trainer's weights are
   re-quantized blockwise (128x128, E4M3), or taken as FP8 codes + scales from the
   vLLM-format stream (:func:`~nemo_ais.fp8.stream.fp8_weight_stream`); the rest is
   copied as is.
3. FP8 KV cache (optional): per layer, ``k_scale = P_p(|K|) * margin / 448`` (and
   ``v_scale`` likewise), sent with the refit or calibrated by the twin after every
   refit with :class:`~nemo_ais.fp8.kv_scales.KVScaleCalibrator` (NeMo-RL's rule:
   hooks on the ``k_proj`` / ``v_proj`` outputs). The engine then applies them as vLLM
   does: K (after RoPE) and V are fake-quantized to E4M3 with that per-tensor scale
   when they are written to the cache, so attention reads the FP8 values, in prefill
   and in decode. Queries and the attention math stay in the compute dtype.
4. Generation (:func:`~nemo_ais.fp8.generation.generate`): a sampling loop with HF's KV cache; the reported
   log-prob of a sampled token is ``log softmax(logits / temperature)`` of the
   UNFILTERED tempered distribution (``logprobs_mode="unfiltered"``): top-k/top-p
   change what is sampled, not the reported log-prob (why: :func:`generate`).

With ``Fp8RolloutConfig(enabled=False)`` the twin is an exact copy of the original
model (the BF16 arm's rollout engine): same code path, bit-identical log-probs.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from transformers import DynamicCache

from nemo_ais.config import require_config
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
from nemo_ais.fp8.kv_scales import KVScaleCalibrator, KVScaleConfig, KVScales
from nemo_ais.fp8.quant import E4M3_MAX, Family, check_finite

__all__ = [
    "Fp8RolloutConfig",
    "Fp8Twin",
    "GenerationOutput",
    "LogprobsMode",
    "MismatchStats",
    "generate",
    "logprob_mismatch",
    "score_responses",
]

logger = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
_COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
# A decoder layer's index in a HF module name: "model.layers.3.self_attn.q_proj".
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# KV-cache scale names of a refit stream (kv_scales.kv_scale_names, or vLLM's remapped).
_KV_SCALE_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:attn\.)?([qkv])_scale$")
_SCALE_SUFFIX = "_scale_inv"  # "<...>.weight" -> "<...>.weight_scale_inv"
_SYNC_NONFINITE = "refusing to sync NaN/Inf into the engine"
# Linear layers inside a decoder layer that vLLM keeps in BF16 (MoE routers).
_ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})


class Fp8RolloutConfig(BaseModel):
    """How the twin simulates vLLM's FP8 rollout (``docs/low_precision.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    enabled: bool = Field(
        True, description="False = the twin is an exact copy of the model (the BF16 arm)."
    )
    weight_block: tuple[int, int] = Field(
        (128, 128), description="Weight quantization tile (out, in); 128x128 as in vLLM."
    )
    activation_group: int = Field(
        128, gt=0, description="Per-token activation group size along the hidden dim."
    )
    weight_family: Family = Field(
        "a", description="Weight quant formula family (docs/low_precision.md); 'a' = vLLM/DeepGEMM."
    )
    activation_family: Family = Field(
        "b", description="Activation quant formula family; 'b' = vLLM per-token-group quant."
    )
    ue8m0: bool = Field(False, description="Power-of-two (UE8M0) scales for weights and acts.")
    weight_eps: float = Field(1e-4, ge=0.0, description="Floor of a weight tile's amax.")
    activation_eps: float = Field(1e-10, ge=0.0, description="Floor of an act group's amax.")
    num_first_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the first N decoder layers unquantized (NeMo-RL key)."
    )
    num_last_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the last N decoder layers unquantized (NeMo-RL key)."
    )
    kv_cache_fp8: bool = Field(False, description="Simulate vLLM's FP8 (E4M3) KV cache.")
    kv_calibration_percentile: float = Field(
        99.9, gt=0.0, le=100.0, description="Percentile of |K|, |V| used as the amax."
    )
    kv_calibration_margin: float = Field(
        1.05, ge=1.0, le=4.0, description="Multiplies the calibrated amax (outlier headroom)."
    )
    kv_amax_floor: float = Field(
        1e-4, gt=0.0, description="Floor of the calibrated amax (all-zero K/V stay finite)."
    )
    compute_dtype: Literal["float32", "bfloat16", "float64"] | None = Field(
        None, description="Cast the twin to this dtype before quantizing; None keeps the model's."
    )

    @model_validator(mode="after")
    def _check_block(self) -> Fp8RolloutConfig:
        if any(b <= 0 for b in self.weight_block):
            raise ValueError(
                f"weight_block={self.weight_block} is invalid: expected two positive ints "
                "(vLLM block FP8 uses (128, 128))"
            )
        return self

    @property
    def torch_compute_dtype(self) -> torch.dtype | None:
        """``compute_dtype`` as a ``torch.dtype`` (None = keep the model's dtype)."""
        return None if self.compute_dtype is None else _COMPUTE_DTYPES[self.compute_dtype]


# --------------------------------------------------------------------------------------
# FP8 KV cache
# --------------------------------------------------------------------------------------


def _fake_quant_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor E4M3 round trip: ``clamp(x / s, ±448) -> e4m3 -> * s`` (vLLM fp8 KV)."""
    q = (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return (q.float() * scale).to(x.dtype)


class _Fp8KVCache(DynamicCache):
    """HF ``DynamicCache`` whose writes are fake-quantized to E4M3 with per-layer scales.

    ``update`` receives K after RoPE and V, exactly what vLLM writes into its FP8 cache;
    the returned (cached + new) states are the dequantized FP8 values, so the current
    step's attention also reads FP8 K/V, as vLLM's attention reads its cache.
    """

    def __init__(self, scales: KVScales) -> None:
        super().__init__()
        # columns (q, k, v) of the calibrated table; the engine holds them as fp32
        self.k_scale = scales.scale[:, 1].to(torch.float32)
        self.v_scale = scales.scale[:, 2].to(torch.float32)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        key_states = _fake_quant_kv(key_states, self.k_scale[layer_idx])
        value_states = _fake_quant_kv(value_states, self.v_scale[layer_idx])
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


# --------------------------------------------------------------------------------------
# The twin
# --------------------------------------------------------------------------------------


def _num_layers(model: nn.Module) -> int:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


def _is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused MoE experts module (3-D ``gate_up_proj`` / ``down_proj``)."""
    weight = getattr(module, "gate_up_proj", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 3


def _fp8_linear_names(model: nn.Module, config: Fp8RolloutConfig) -> list[str]:
    """Names of the modules vLLM would run in FP8 (module doc, step 1).

    ``nn.Linear`` layers and fused MoE experts inside FP8 decoder layers, minus routers.
    """
    n_layers = _num_layers(model)
    first, last = config.num_first_layers_in_bf16, config.num_last_layers_in_bf16
    if first + last > n_layers:
        raise ValueError(
            f"num_first_layers_in_bf16={first} + num_last_layers_in_bf16={last} is invalid: "
            f"expected <= the model's {n_layers} decoder layers"
        )
    names = []
    for name, module in model.named_modules():
        match = _LAYER_RE.search(name)
        if match is None or not (isinstance(module, nn.Linear) or _is_fused_experts(module)):
            continue
        layer = int(match.group(1))
        if layer < first or layer >= n_layers - last:
            continue
        if name.rsplit(".", 1)[-1] in _ROUTER_NAMES:
            continue
        names.append(name)
    return names


class Fp8Twin:
    """Simulated FP8 rollout engine of a HF causal LM (module doc).

    Attributes:
        model: the twin (a deep copy of the original, eval mode). Do not call
            ``.to(dtype)`` on it: that would cast the FP8 codes (use ``compute_dtype``).
        config: the :class:`Fp8RolloutConfig`.
        fp8_module_names: names of the linears running W8A8 (empty if disabled).
        kv_scales: the current :class:`~nemo_ais.fp8.kv_scales.KVScales` (``scale`` is
            float64 ``[layers, 3]``, columns q, k, v; q is not simulated and stays 1.0),
            or None until calibrated (FP8 KV only).
    """

    def __init__(self, model: nn.Module, config: Fp8RolloutConfig | None = None) -> None:
        require_config(config, Fp8RolloutConfig, "Fp8Twin(config)", optional=True)
        self.config = config if config is not None else Fp8RolloutConfig()
        twin = copy.deepcopy(model)
        # eval() only: requires_grad flags are kept, since flipping them can change which
        # CPU GEMM kernel runs (and so the last bits); every call runs under no_grad.
        twin.eval()
        self.fp8_module_names: tuple[str, ...] = ()
        if self.config.enabled:
            if self.config.torch_compute_dtype is not None:
                twin.to(self.config.torch_compute_dtype)
            self.fp8_module_names = tuple(_fp8_linear_names(twin, self.config))
            for name in self.fp8_module_names:
                self._replace_module(twin, name)
        self.model = twin
        self.num_layers = _num_layers(twin)
        self.kv_scales: KVScales | None = None
        self._targets = self._sync_targets()
        self._fp8_weights = {
            f"{n}.weight": m
            for n in self.fp8_module_names
            if isinstance(m := self.model.get_submodule(n), Fp8Linear)
        }

    @property
    def kv_cache_fp8(self) -> bool:
        """Whether the FP8 KV cache is simulated (``enabled and kv_cache_fp8``)."""
        return self.config.enabled and self.config.kv_cache_fp8

    def _replace_module(self, twin: nn.Module, name: str) -> None:
        cfg = self.config
        quant = dict(
            weight_block=cfg.weight_block,
            activation_group=cfg.activation_group,
            weight_family=cfg.weight_family,
            activation_family=cfg.activation_family,
            weight_eps=cfg.weight_eps,
            activation_eps=cfg.activation_eps,
            ue8m0=cfg.ue8m0,
        )
        parent_name, _, child = name.rpartition(".")
        parent = twin.get_submodule(parent_name)
        module = getattr(parent, child)
        if isinstance(module, nn.Linear):
            fp8 = Fp8Linear.from_linear(module, name=f"{name}.weight", **quant)
        else:
            fp8 = Fp8Experts(module, name=name, **quant)
        setattr(parent, child, fp8)

    def _sync_targets(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """Map each trainer tensor name to the function that loads it into the twin."""
        targets: dict[str, Callable[[torch.Tensor], None]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            targets[name] = self._copier(name, param)
        for name, buf in self.model.named_buffers(remove_duplicate=False):
            # FP8 codes, scales and caches are written by the load functions below
            if not name.endswith((".weight", ".weight_scale_inv", ".weight_dequant")):
                targets[name] = self._copier(name, buf)
        for name in self.fp8_module_names:
            module = self.model.get_submodule(name)
            if isinstance(module, Fp8Experts):
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

    @torch.no_grad()
    def sync_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        calibration_input_ids: torch.Tensor | None = None,
        calibration_attention_mask: torch.Tensor | None = None,
    ) -> int:
        """Refit: load the trainer's current weights, re-quantizing the FP8 linears.

        Accepts a ``state_dict`` or a stream of ``(name, tensor)`` with the original
        model's (HF) names; a partial set updates only those tensors. An FP8 linear's
        weight is either high precision (re-quantized here) or, as vLLM receives it from
        :func:`~nemo_ais.fp8.stream.fp8_weight_stream`, ``(name, float8_e4m3fn codes)``
        plus ``(name + "_scale_inv", fp32 scales)``, loaded as is. KV-cache scales sent
        with the refit (``model.layers.N.self_attn.k_scale`` / ``v_scale``, e.g.
        :meth:`~nemo_ais.fp8.kv_scales.KVScales.named_tensors`) become :attr:`kv_scales`
        (every layer's K and V are then required). Otherwise every refit makes the KV
        scales stale: they are recalibrated here from the calibration batch if one is
        given, else on the next :meth:`generate` / :meth:`score` batch.

        Returns:
            The number of tensors loaded.

        Raises:
            ValueError: an unknown name, a shape mismatch, non-finite values (nothing
                after the offending tensor is loaded), FP8 codes without their scales
                (or the reverse), or KV scales missing for some layer.
        """
        items = weights.items() if isinstance(weights, Mapping) else weights
        n_loaded = 0
        pending: dict[str, dict[str, torch.Tensor]] = {}  # FP8 weight name -> codes/scale
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
        self.kv_scales = self._received_kv_scales(kv_sent) if kv_sent else None
        if self.kv_cache_fp8 and self.kv_scales is None and calibration_input_ids is not None:
            if calibration_attention_mask is None:
                calibration_attention_mask = torch.ones_like(calibration_input_ids)
            self.calibrate_kv_scales(calibration_input_ids, calibration_attention_mask)
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

    @torch.no_grad()
    def calibrate_kv_scales(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        model: nn.Module | None = None,
    ) -> KVScales:
        """Per-layer FP8 KV scales from one forward pass (KV unquantized), stored for use.

        ``scale = max(P_p(|x|), floor) * margin / 448`` for x = the ``k_proj`` / ``v_proj``
        outputs at non-padding positions (``p``, margin, floor from the config), computed
        by :class:`~nemo_ais.fp8.kv_scales.KVScaleCalibrator` (K before RoPE, the HF-hook
        rule; the cache applies the scale to K after RoPE, as vLLM does). The result is
        stored in :attr:`kv_scales` and used until the next :meth:`sync_weights`.

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
        observed = self.model if model is None else model
        calibrator = KVScaleCalibrator(
            self.num_layers,
            KVScaleConfig(
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
        logger.debug("calibrated FP8 KV scales (q, k, v): %s", self.kv_scales.scale)
        return self.kv_scales

    def _cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> DynamicCache | None:
        """A fresh cache for one call: FP8 KV (calibrating first if stale) or None."""
        if not self.kv_cache_fp8:
            return None
        if self.kv_scales is None:
            self.calibrate_kv_scales(input_ids, attention_mask)
        assert self.kv_scales is not None
        return _Fp8KVCache(self.kv_scales)

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
        """:func:`generate` with the twin, arguments as there.

        With the FP8 KV cache, stale scales (after a refit) are first recalibrated on
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
        """:func:`score_responses` under the twin (FP8 KV cache included): ``[B, T]`` fp32."""
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
