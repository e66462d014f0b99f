# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Rules shared by the runtime and the offline check, below both (torch-free, stdlib only).

* :mod:`.keep_bf16` -- which linear layers stay in BF16: the ONE rule the twin, the refit
  stream, the vLLM refit patch and ``nemo_ais.preflight`` call.
* :mod:`.vllm_layers` -- vLLM's view of HF names: decoder layer, projection, fused group.
* :mod:`.config_keys` -- dotted-key lookup in a NeMo-RL config mapping.
* :mod:`.native_kernels` -- the GPU each rollout format needs to run as named.
"""
