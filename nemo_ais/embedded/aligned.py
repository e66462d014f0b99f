# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""QaRL's rollout-aligned trainer forward: the trainer's log-probs in the rollout's arithmetic.

**[reconstruction]** of QaRL (arXiv 2604.07853; no code is public): the learner keeps its fp32 master weights and runs
the rollout engine's low-bit arithmetic in the forward, with a straight-through estimator (STE) in the backward, so
pi_old and pi_theta both come from the arithmetic that sampled the tokens. Per quantized linear, with the twin's fake
quantization (:data:`nemo_ais.rollout.fake_quant.LINEAR_FAKE_QUANT`) and ``ST(f)`` = forward ``f``, backward identity:

1. ``W_q = ST(weight_fq)(W; amax_W)``, ``amax_W`` NVFP4's global amax of the current
   weights over vLLM's fused shards (detached);
2. ``x_q = ST(activation_fq)(x; amax_x)``, ``amax_x`` the twin's static input amax of the
   last refit (NVFP4 W4A4; FP8 and MXFP8 scale per block; W4A16 keeps ``x``);
3. ``y = x_q W_q^T`` in fp32, ``+ b``;
4. KV cache (fp8 / nvfp4): K after RoPE and V pass through ``ST(kv_fq)`` with the twin's KV scales of the last refit.

Gradient: ``dL/dW = (dL/dy)^T x_q``, ``dL/dx = (dL/dy) W_q`` (tested). At pi_old the trainer and the twin's
teacher-forced ``score`` agree to float32 rounding (tested); docs/embedded.md says what is left of the mismatch.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from nemo_ais.rollout.fake_quant import LinearFakeQuant, shared_weight_amax, straight_through
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.twin import RolloutTwin


class StraightThroughLinear(nn.Module):
    """``nn.Linear`` in the rollout format's fake quantization, STE backward (steps 1-3).

    Holds the trainer's own ``weight`` and ``bias`` parameters (shared, not copied), so the gradient lands on them and
    ``state_dict`` keys are those of ``nn.Linear``.

    Attributes:
        weight_amax: 0-dim fp32 NVFP4 global amax of ``W`` (None: the format has none);
            set by :class:`RolloutAlignedPolicy` before each forward.
        input_amax: 0-dim fp32 static input amax (NVFP4 W4A4), from the twin; else None.
    """

    def __init__(self, linear: nn.Linear, fake_quant: LinearFakeQuant, name: str) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.fake_quant = fake_quant
        self.name = name
        self.weight_amax: torch.Tensor | None = None
        self.input_amax: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = ST(fq_act)(x) @ ST(fq_w)(W)^T (+ b)`` in fp32, returned in ``x.dtype``."""
        fq = self.fake_quant
        w_q = straight_through(fq.weight, self.weight, amax=self.weight_amax, name=self.name)
        x_q = straight_through(fq.activation, x, amax=self.input_amax, name=f"{self.name} input")
        y = F.linear(x_q.to(torch.float32), w_q)
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(x.dtype)


class StraightThroughKVCache(QuantizedKVCache):
    """The twin's quantized KV cache with an identity gradient through the writes (step 4)."""

    def _quantize(self, x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        quantize = functools.partial(super()._quantize, layer=layer, which=which)
        return straight_through(quantize, x)


class RolloutAlignedPolicy(nn.Module):
    """The trainer's forward in the rollout engine's arithmetic (module doc).

    A view of ``policy`` that SHARES its parameters, with the twin's quantized linears replaced by
    :class:`StraightThroughLinear`; ``policy`` itself (evaluation, checkpoints, refit) is unchanged. ``engine``'s
    calibration of the last refit is read at every forward.

    Raises:
        NotImplementedError: a quantized module that is not an ``nn.Linear`` (fused MoE experts).
    """

    def __init__(self, policy: nn.Module, engine: RolloutTwin) -> None:
        super().__init__()
        shared = {id(p): p for p in policy.parameters()}
        self.model = copy.deepcopy(policy, memo=shared)
        self.engine = engine
        self.linears: dict[str, StraightThroughLinear] = {}
        for name in engine.quantized_module_names:
            module = self.model.get_submodule(name)
            if type(module) is not nn.Linear:
                raise NotImplementedError(
                    f"{name}: policy.rollout_aligned_quantization supports nn.Linear layers, "
                    f"got {type(module).__name__} (fused MoE experts are not aligned)"
                )
            self.linears[name] = StraightThroughLinear(module, engine.fake_quant, f"{name}.weight")
            self.model.set_submodule(name, self.linears[name])

    def _load_calibration(self) -> None:
        """Set each linear's weight amax (current ``W``) and the twin's input amax."""
        fq = self.engine.fake_quant
        weights = {f"{n}.weight": m.weight for n, m in self.linears.items()}
        weight_amax = shared_weight_amax(weights) if fq.shared_weight_amax else {}
        input_amax = self.engine.input_amax
        for name, linear in self.linears.items():
            linear.weight_amax = weight_amax.get(f"{name}.weight")
            linear.input_amax = input_amax.get(name)
            if fq.static_input_amax and linear.input_amax is None:
                raise ValueError(
                    f"{name}: the twin's static input amax is not calibrated (format "
                    f"{fq.format}); sync the engine with calibration_input_ids first"
                )

    def _kv_cache(self) -> StraightThroughKVCache | None:
        """A fresh straight-through KV cache with the twin's scales (None: bf16 KV)."""
        if not self.engine.kv_cache_quantized:
            return None
        if self.engine.kv_scales is None:
            raise ValueError(
                f"the twin's {self.engine.config.kv_cache} KV-cache scales are not calibrated; "
                "sync the engine with calibration_input_ids first"
            )
        config = self.engine.config
        return StraightThroughKVCache(config.kv_cache, self.engine.kv_scales, error_scale=config.error_scale)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, **kwargs):
        """The model's forward in the rollout arithmetic (steps 1-4); ``use_cache`` is ignored."""
        del use_cache
        self._load_calibration()
        cache = self._kv_cache()
        return self.model(input_ids=input_ids, past_key_values=cache, use_cache=cache is not None, **kwargs)
