# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A CPU stand-in for NeMo-RL's ``VllmGenerationWorker`` Ray actor (a vLLM engine on a GPU).

Its own module, importing nothing but Ray, so that a fresh Ray worker process imports it
without torch or nemo_ais (what those processes import is what the tests check).
``llm.collective_rpc(callable)`` stands in for vLLM's: it runs the callable in this
process (where vLLM's in-process executor would run it) and records its name.
"""

from __future__ import annotations

import ray


class LLM:
    """vLLM's ``LLM`` as the check uses it: ``collective_rpc(callable)`` (recorded)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(getattr(method, "__qualname__", repr(method)))
        return [method(None, *args, **(kwargs or {}))]  # one engine worker (TP = 1)


@ray.remote(num_cpus=0)
class GenerationWorker:
    """Stands in for upstream's ``VllmGenerationWorker``."""

    def __init__(self) -> None:
        self.llm = LLM()

    def rpc_calls(self) -> list[str]:
        return self.llm.calls
