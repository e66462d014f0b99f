# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""nemo_ais: Adaptive Importance Sampling (AIS) for FP8-rollout RL on NeMo-RL.

Subpackages:
  * ``nemo_ais.core``    -- the method (weights, statistics, diagnostics, mixer, loss); pure torch.
  * ``nemo_ais.formats`` -- one record per low-precision format (FP8, MXFP8, NVFP4, MXFP4).
  * ``nemo_ais.refit``   -- the weight-refit stream into vLLM (any format) and KV scales.
  * ``nemo_ais.rollout`` -- the simulated rollout engine ("twin"); ``nemo_ais.tools``: its tools.
  * ``nemo_ais.rules``   -- rules shared by the runtime and the offline check (torch-free).
  * ``nemo_ais.fp8``     -- compatibility face of the former rollout-precision package.
  * ``nemo_ais.nemo_rl`` -- NeMo-RL adapter, v0.7.0 and main (imports NeMo-RL lazily).
  * ``nemo_ais.megatron``-- Megatron-Core process-group helpers (imports megatron lazily).
  * ``nemo_ais.embedded``-- the one-CPU GRPO experiment behind ``nemo-ais run``.
  * ``nemo_ais.preflight``-- offline config checks and memory budget (torch-free).
"""

__version__ = "0.1.0"
