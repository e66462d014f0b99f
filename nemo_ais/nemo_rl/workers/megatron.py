# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""AIS Megatron policy worker (import only inside a NeMo-RL Megatron worker process).

NeMo-RL v0.7.0's colocated refit (``stream_weights_via_ipc_zmq``) passes no ``kv_scales``, so upstream streams every
q/k/v scale as 1.0 (main passes them on both paths). This worker then streams its last calibration's scales, and refuses
an FP8-KV-cache refit whose scales would be defaults (``ValueError`` naming the layer, on every worker alike).
"""

from typing import Any

import ray
import torch
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

from nemo_ais.megatron import get_data_parallel_group
from nemo_ais.megatron.kv_calibration import calibrate_qkv_fp8_scales, kv_reduction_from_env
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin
from nemo_ais.refit.kv_scales import require_calibrated_kv_scales
from nemo_ais.rules.config_keys import get


def fp8_kv_cache_enabled(policy_cfg: Any) -> bool:
    """``policy.generation`` is vLLM with ``vllm_cfg.kv_cache_dtype`` fp8* (upstream's test)."""
    kv_cache_dtype = get(policy_cfg, "generation.vllm_cfg.kv_cache_dtype", "auto")
    return get(policy_cfg, "generation.backend") == "vllm" and str(kv_cache_dtype).startswith("fp8")


class AISMegatronMixin(AISTrainMixin):
    """:class:`AISTrainMixin` on Megatron: its DP group, our FP8 KV calibration, the refit check."""

    _ais_kv_scales: dict[str, float] | None = None  # the last calibration's "layers"

    def _ais_dp_group(self):
        return get_data_parallel_group()

    @torch.no_grad()
    def calibrate_qkv_fp8_scales(
        self,
        *,
        data: Any,
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]:
        """NeMo-RL's KV-scale calibration, computed by :mod:`nemo_ais.megatron.kv_calibration`.

        Upstream's signature, result and default rule (a test compares the scales); Q/K/V read at the ``core_attention``
        inputs; ``NEMO_AIS_KV_REDUCTION=element_percentile`` selects the element percentile. Differences: global layer
        keys across pipeline stages; only ``core_attention`` itself hooked; ONE ``all_reduce(MAX)`` over the default
        group; the 1e-4 amax floor; ``include_q=False`` returns K/V only; ``FP8_MAX_Q/K/V`` not read; logs the peak over
        ``scale * 448`` and, from the second calibration on, the saturated fraction under the previous scales.
        """
        self.model.eval()
        result = calibrate_qkv_fp8_scales(
            self.model,
            lambda: self.get_logprobs(data=data, micro_batch_size=micro_batch_size, require_router_replay=False),
            num_layers=self.megatron_bridge.transformer_config.num_layers,
            percentile=percentile,
            margin=margin,
            include_q=include_q,
            reduction=kv_reduction_from_env(),
            group=torch.distributed.group.WORLD if torch.distributed.is_initialized() else None,
            device=self._ais_device(),
            previous_scales=self._ais_kv_scales,  # what the rollout's FP8 cache held
        )
        self._ais_kv_scales = dict(result["layers"])  # for refits that pass none (colocated)
        return result

    def _ais_refit_kv_scales(self, kv_scales: dict[str, float] | None) -> dict[str, float] | None:
        """The scales a refit streams (the driver's, else the last calibration's), checked."""
        if not fp8_kv_cache_enabled(self.cfg):
            return kv_scales
        scales = kv_scales if kv_scales is not None else self._ais_kv_scales
        require_calibrated_kv_scales(scales, self.megatron_bridge.transformer_config.num_layers)
        return scales

    def stream_weights_via_ipc_zmq(
        self, buffer_size_bytes: int = 0, kv_scales: dict[str, float] | None = None, **upstream_kwargs: Any
    ) -> None:
        """Upstream's colocated refit, with the calibrated KV scales if given none (v0.7.0)."""
        super().stream_weights_via_ipc_zmq(
            buffer_size_bytes=buffer_size_bytes, kv_scales=self._ais_refit_kv_scales(kv_scales), **upstream_kwargs
        )

    def broadcast_weights_for_collective(
        self, kv_scales: dict[str, float] | None = None, **upstream_kwargs: Any
    ) -> None:
        """Upstream's non-colocated refit, with the same scale check (other keywords passed on)."""
        super().broadcast_weights_for_collective(kv_scales=self._ais_refit_kv_scales(kv_scales), **upstream_kwargs)


@ray.remote(runtime_env=get_runtime_env_for_policy_worker("megatron_policy_worker"))  # pragma: no cover
class AISMegatronPolicyWorker(AISMegatronMixin, MegatronPolicyWorkerImpl):
    """``MegatronPolicyWorker`` + the AIS prepare step + our FP8 KV-scale calibration."""
