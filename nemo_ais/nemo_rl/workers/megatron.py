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
"""AIS Megatron policy worker (import only inside a NeMo-RL Megatron worker process).

FP8 KV-cache scales and the refit: NeMo-RL v0.7.0's ``grpo.refit_policy_generation``
passes the calibrated ``kv_scales`` only on the non-colocated path
(``broadcast_weights_for_collective(kv_scales=...)``); the colocated path calls
``stream_weights_via_ipc_zmq(buffer_size_bytes=...)`` without them, and upstream's
``_iter_params_with_optional_kv_scales`` then streams every q/k/v scale as 1.0 (so does
``weight_sync.IPCWeightSynchronizer``). NeMo-RL main passes them on both paths. This
worker remembers the scales of its last calibration and streams them when a refit passes
none (v0.7.0's colocated path), uses the driver's when given (both paths on main), and
refuses (``ValueError`` naming the layer) a refit with the FP8 KV cache on whose scales
would be defaults. Every worker
holds the same scales (the calibration ends in one all-reduce), so all raise together.
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

__all__ = ["AISMegatronMixin", "AISMegatronPolicyWorker", "fp8_kv_cache_enabled"]


def fp8_kv_cache_enabled(policy_cfg: Any) -> bool:
    """``policy.generation`` is vLLM with ``vllm_cfg.kv_cache_dtype`` fp8* (upstream's test)."""
    kv_cache_dtype = get(policy_cfg, "generation.vllm_cfg.kv_cache_dtype", "auto")
    return get(policy_cfg, "generation.backend") == "vllm" and str(kv_cache_dtype).startswith("fp8")


class AISMegatronMixin(AISTrainMixin):
    """:class:`AISTrainMixin` on Megatron: its DP group, our FP8 KV calibration, the refit check.

    Put before a ``MegatronPolicyWorkerImpl`` (or a subclass of it: NeMo-RL's ModelOpt
    ``MegatronQuantPolicyWorker``, see :mod:`.megatron_quant`) in the bases.
    """

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

        Same signature and result as v0.7.0 and main (``{"format", "percentile",
        "margin", "layers": {vLLM scale name: float}}``); Q/K/V are read, as upstream, at
        the ``core_attention`` inputs (after q/k-norm and RoPE). The rule is upstream's
        by default (``max |x|`` per micro-batch, nearest-rank percentile over the
        micro-batches, max over ranks: the same scales, a test compares them with
        upstream's function); ``NEMO_AIS_KV_REDUCTION=element_percentile`` (the
        launcher's ``ais_kv_calibration.reduction``) selects the element percentile.
        Differences: layer keys are global across pipeline stages (upstream keys by the
        stage-local index); only ``core_attention`` itself is hooked (upstream's substring
        match also hooks its children); ranks are combined by ONE ``all_reduce(MAX)`` over
        the default group (every TP/PP/CP/DP rank of the policy) instead of
        ``all_gather_object`` + ``broadcast_object_list``; an all-zero layer gets the
        1e-4 amax floor (upstream: scale 0); ``include_q=False`` returns K/V names only
        (upstream's converter needs ``q_scale``); the ``FP8_MAX_Q/K/V`` environment
        overrides are not read (448). Logs the calibration's largest value over
        ``scale * 448`` per kind (WARNING when > 1: it saturates) and, from the second
        calibration on, ``kv_cache/saturated_frac_<kind>``: the fraction of this data's
        K / V elements above the previous scales * 448 (what the rollout's FP8 cache
        saturated; WARNING above 0.1 %).
        """
        self.model.eval()
        result = calibrate_qkv_fp8_scales(
            self.model,
            lambda: self.get_logprobs(
                data=data, micro_batch_size=micro_batch_size, require_router_replay=False
            ),
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
        """The scales a refit streams: the driver's, else the last calibration's; checked.

        Raises:
            ValueError: FP8 KV cache on and a layer's q/k/v scale would stream as a default.
        """
        if not fp8_kv_cache_enabled(self.cfg):
            return kv_scales
        scales = kv_scales if kv_scales is not None else self._ais_kv_scales
        require_calibrated_kv_scales(scales, self.megatron_bridge.transformer_config.num_layers)
        return scales

    def stream_weights_via_ipc_zmq(
        self,
        buffer_size_bytes: int = 0,
        kv_scales: dict[str, float] | None = None,
        **upstream_kwargs: Any,
    ) -> None:
        """Upstream's colocated refit, with the calibrated KV scales if it is given none.

        v0.7.0 passes no ``kv_scales`` here; main passes the driver's (the same dict our
        calibration returned), which are then used as given. Other keywords go to upstream.
        """
        super().stream_weights_via_ipc_zmq(
            buffer_size_bytes=buffer_size_bytes,
            kv_scales=self._ais_refit_kv_scales(kv_scales),
            **upstream_kwargs,
        )

    def broadcast_weights_for_collective(
        self, kv_scales: dict[str, float] | None = None, **upstream_kwargs: Any
    ) -> None:
        """Upstream's non-colocated refit, with the same scale check.

        Every other keyword reaches upstream unchanged (main: ``buffer_size_bytes``,
        ``num_buffers``; v0.7.0 takes none).
        """
        super().broadcast_weights_for_collective(
            kv_scales=self._ais_refit_kv_scales(kv_scales), **upstream_kwargs
        )


@ray.remote(
    runtime_env=get_runtime_env_for_policy_worker("megatron_policy_worker")
)  # pragma: no cover
class AISMegatronPolicyWorker(AISMegatronMixin, MegatronPolicyWorkerImpl):
    """``MegatronPolicyWorker`` + the AIS prepare step + our FP8 KV-scale calibration."""
