# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Tools built on the rollout engine, out of the numerics.

``nemo-ais attribute`` (:mod:`.attribution`) and ``nemo-ais calibrate-input-amax``
(:mod:`.input_amax_file`).
"""
