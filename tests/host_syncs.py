# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Count the device-to-host reads of a call (the loss promises one per call)."""

from __future__ import annotations

import torch

_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def count_host_syncs(monkeypatch) -> list[str]:
    """Patch every tensor method that reads values to the host; returns the list they append to."""
    calls: list[str] = []
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _original=original, _name=name, **k):
            calls.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls
