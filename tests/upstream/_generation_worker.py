# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A CPU stand-in for NeMo-RL's ``VllmGenerationWorker`` Ray actor (a vLLM engine on a GPU).

Its own module, importing nothing but Ray at module level, so that a fresh Ray worker
process imports it without torch or nemo_ais (what those processes import is what the
tests check); :func:`generation_over` (driver side) imports NeMo-RL when called.
``llm.collective_rpc(callable)`` stands in for vLLM's: it runs the callable in this
process (where vLLM's in-process executor would run it) and records its name; it hands
the callable vLLM's ``Worker`` (``tests/_vllm_layers.py``: a model whose layers carry
vLLM's quant-method classes) when the actor is given a ``model_spec``, else None.

:class:`AsyncGenerationWorker` stands in for ``VllmAsyncGenerationWorker`` (an async Ray
actor) and :class:`AsyncLLM` for vLLM's: a coroutine ``collective_rpc`` whose result the
engine's output task sets on the engine's event loop, waking no other loop (as vLLM 0.20.0
and 0.25.1 do), so a caller that awaits it on a loop of its own waits forever.
"""

from __future__ import annotations

import asyncio
import types

import ray


class LLM:
    """vLLM's ``LLM`` as the check uses it: ``collective_rpc(callable)`` (recorded)."""

    def __init__(self, worker=None) -> None:
        self.calls: list[str] = []
        self.worker = worker

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(getattr(method, "__qualname__", repr(method)))
        return [method(self.worker, *args, **(kwargs or {}))]  # one engine worker (TP = 1)


class AsyncLLM:
    """vLLM's ``AsyncLLM`` as the check uses it: ``collective_rpc``, its output task, ``errored``.

    ``mode``: ``handler`` (the output task is ``output_handler``), ``resources`` (only
    ``engine_core.resources.output_queue_task``), ``none`` (no output task), ``dead``
    (``errored``) or ``silent`` (the task never answers).
    """

    def __init__(self, worker=None, mode: str = "handler") -> None:
        self.calls: list[str] = []
        self.worker = worker
        self.errored = mode == "dead"
        self._requests: asyncio.Queue = asyncio.Queue()
        # started on the running loop when the engine is built, as vLLM's output handler
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._serve(mode != "silent")) if mode != "none" else None
        self.output_handler = task if mode != "resources" else None
        resources = types.SimpleNamespace(output_queue_task=task)
        self.engine_core = types.SimpleNamespace(resources=resources)

    async def _serve(self, answer: bool) -> None:
        while True:
            future, method, args, kwargs = await self._requests.get()
            if answer:
                future.set_result([method(self.worker, *args, **(kwargs or {}))])  # TP = 1

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(getattr(method, "__qualname__", repr(method)))
        future = asyncio.get_running_loop().create_future()
        self._requests.put_nowait((future, method, args, kwargs))  # not thread-safe: vLLM's isn't
        return await future


@ray.remote(num_cpus=0)
class AsyncGenerationWorker:
    """Stands in for upstream's ``VllmAsyncGenerationWorker`` (``vllm_cfg.async_engine``)."""

    def __init__(self, model_spec: dict[str, str] | None = None, mode: str = "handler"):
        worker = None
        if model_spec is not None:
            from _vllm_layers import Worker

            worker = Worker(model_spec)
        self.llm = AsyncLLM(worker, mode)

    async def rpc_calls(self) -> list[str]:
        return self.llm.calls


@ray.remote(num_cpus=0)
class GenerationWorker:
    """Stands in for upstream's ``VllmGenerationWorker``."""

    def __init__(self, model_spec: dict[str, str] | None = None) -> None:
        worker = None
        if model_spec is not None:  # an engine whose layers hold these vLLM quant methods
            from _vllm_layers import Worker

            worker = Worker(model_spec)
        self.llm = LLM(worker)

    def rpc_calls(self) -> list[str]:
        return self.llm.calls


def generation_over(actors: list, layout: list | None = None) -> object:
    """Upstream's real ``VllmGeneration`` / ``RayWorkerGroup`` dispatch over these actors.

    Built with ``__new__`` (no engine is started). ``layout``: ``[dp][pp][tp]`` actor
    indices; default one data-parallel rank per actor, so
    ``run_all_workers_single_data(..., run_rank_0_only_axes=[tp, pp])`` reaches each.
    """
    from nemo_rl.distributed.named_sharding import NamedSharding
    from nemo_rl.distributed.worker_groups import RayWorkerGroup
    from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration

    group = RayWorkerGroup.__new__(RayWorkerGroup)
    group._workers = actors
    group.sharding_annotations = NamedSharding(
        layout=layout if layout is not None else [[[i]] for i in range(len(actors))],
        names=["data_parallel", "pipeline_parallel", "tensor_parallel"],
    )
    generation = VllmGeneration.__new__(VllmGeneration)
    generation.worker_group = group
    return generation
