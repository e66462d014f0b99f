# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""What the gloo harness's fork server imports once (``_harness.run_distributed``).

Every rank is forked from that server with these modules loaded. Megatron-Core is optional
here: an import that fails in any way is left to the Megatron tests, which then fail with
its traceback (the server itself would otherwise die and take every distributed test with
it).
"""

import contextlib

import torch.distributed  # noqa: F401

with contextlib.suppress(Exception):
    import megatron.core.parallel_state  # noqa: F401
