# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The simulated rollout engine ("twin"): quantized linear layers, KV cache, sampling, calibration.

Entry point: :class:`nemo_ais.rollout.twin.RolloutTwin`; its config:
:class:`nemo_ais.rollout.config.RolloutPrecisionConfig`.
"""
