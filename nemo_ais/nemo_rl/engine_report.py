# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What each vLLM worker really holds, held against what the run asked for.

Two silent failures: a kernel fallback (below compute capability 10.0 vLLM runs NVFP4 with the weight-only Marlin kernel
and only logs it, so "W4A4" rolls out as W4A16), and a keep-in-BF16 disagreement (vLLM's ModelOpt exclusion matches an
entry as a substring, so ``...mlp.gate`` keeps ``...mlp.gate_up_proj`` in BF16 too; veRL #7519).

The driver asks three times: before ``setup()`` every Ray node by NVML (:func:`require_native_nodes`), after ``setup()``
every vLLM worker's GPU (:func:`require_native_gpu`), after the first refit every layer's quant method and kernel
(:func:`require_engine_formats`). An engine is reached through its generation actor (:func:`engine_rpc`), sync
(``vllm.LLM``) or async (``AsyncLLM``, ``vllm_cfg.async_engine``) alike. Read from vLLM 0.20.0 and 0.25.1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from nemo_ais.rules.native_kernels import NATIVE_KERNELS
from nemo_ais.rules.vllm_layers import fused_parts, layer_index

logger = logging.getLogger(__name__)

# held formats whose activations stay in BF16 although the method's format quantizes them
_WEIGHT_ONLY = {k.family: k.weight_only for k in NATIVE_KERNELS.values()}


class HeldLayer(NamedTuple):
    """One vLLM module with a quant method, as its worker holds it."""

    name: str  # vLLM's module name, e.g. model.layers.0.mlp.gate_up_proj
    method: str  # the quant method's class name
    held: str  # held_format(): bf16, fp8, fp8_weight_only, mxfp8, nvfp4_w4a4, ...
    moe: bool  # an expert stack (FusedMoE method)


class EngineLayers(NamedTuple):
    """One vLLM worker process: its GPU and every module's held format."""

    pid: int
    host: str
    device: str  # the GPU's name ("" without CUDA)
    capability: tuple[int, int] | None  # CUDA compute capability (None without CUDA)
    layers: tuple[HeldLayer, ...]


def mro_names(obj: Any) -> tuple[str, ...]:
    """Class names of ``type(obj)`` and its bases, most derived first (vLLM's quant classes)."""
    return tuple(c.__name__ for c in type(obj).__mro__)


def _first(obj: Any, *names: str) -> Any:
    return next((v for name in names if (v := getattr(obj, name, None))), None)


def held_format(quant_method: Any) -> str:
    """The format a vLLM quant method runs (``bf16``, ``fp8_weight_only``, ..., ``unknown:<c>``)."""
    names = mro_names(quant_method)
    kernel = type(_first(quant_method, "kernel", "fp8_linear")).__name__
    backend = str(_first(quant_method, "nvfp4_backend", "mxfp8_backend", "fp8_backend") or "")
    weight_only = "Marlin" in kernel or "MARLIN" in backend.upper() or bool(getattr(quant_method, "use_marlin", False))
    if any(n.startswith("Unquantized") for n in names):
        return "bf16"
    if any("NvFp4" in n for n in names):
        w4a16 = any("W4A16" in n for n in names) or weight_only
        return "nvfp4_w4a16" if w4a16 else "nvfp4_w4a4"
    if any("MxFp8" in n for n in names):
        return _WEIGHT_ONLY["mxfp8"] if weight_only else "mxfp8"
    if any(n.startswith("Fp8") for n in names):
        return _WEIGHT_ONLY["fp8"] if weight_only else "fp8"
    return f"unknown:{names[0]}"


def engine_layers(worker: Any = None) -> EngineLayers:
    """In a vLLM worker (``collective_rpc``): its GPU and every layer's format (None: GPU only)."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else ""
    capability = tuple(torch.cuda.get_device_capability()) if cuda else None
    model = None
    if worker is not None:
        get_model = getattr(worker, "get_model", None)
        model = get_model() if callable(get_model) else worker.model_runner.model
    layers = tuple(
        HeldLayer(name, type(m).__name__, held_format(m), any("MoE" in n for n in mro_names(m)))
        for name, module in (model.named_modules() if model is not None else ())
        if (m := getattr(module, "quant_method", None)) is not None
    )
    return EngineLayers(os.getpid(), socket.gethostname(), device, capability, layers)


GpuReader = Callable[[str | None], "list[tuple[str, tuple[int, int]]] | None"]


def nvml_gpus(visible: str | None = None) -> list[tuple[str, tuple[int, int]]] | None:
    """This node's NVIDIA GPUs as NVML reads them (no CUDA context): ``[(name, capability)]``.

    ``visible``: a ``CUDA_VISIBLE_DEVICES`` value (indices or ``GPU-`` UUIDs), or None for
    every GPU of the node. None when NVML cannot be read here (no driver, no ``pynvml``).
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver, or no nvidia-ml-py (vLLM's dependency) here
        return None
    try:
        if visible is None:
            ids: list[str] = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        else:
            ids = [v.strip() for v in visible.split(",") if v.strip()]
        gpus = []
        for gpu in ids:
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(gpu)
                if gpu.startswith(("GPU-", "MIG-"))
                else pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
            )
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append((name.decode() if isinstance(name, bytes) else name, (major, minor)))
        return gpus
    except Exception as err:  # a device NVML cannot open (e.g. a MIG UUID): not readable
        logger.warning("nemo_ais: NVML could not read the GPUs %s: %s", visible or "(all)", err)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _read_node(read: GpuReader) -> tuple[str, list[tuple[str, tuple[int, int]]] | None]:
    return socket.gethostname(), read(None)


def require_native_nodes(
    rollout_format: str, *, read: GpuReader | None = None, timeout_s: float = 120.0
) -> dict[str, list[tuple[str, tuple[int, int]]]]:
    """Before ``setup()``: RuntimeError if no GPU of the Ray cluster runs the format natively.

    One zero-resource Ray task per alive node reads its GPUs (``read``; None: :func:`nvml_gpus`).
    Returns ``{host: [(gpu, capability)]}``; unreadable GPUs are left to :func:`require_native_gpu`.
    """
    need = NATIVE_KERNELS.get(rollout_format)
    if need is None:
        return {}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_read_node)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            read or nvml_gpus
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]
    try:
        found = ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for ref in refs:
            ray.cancel(ref, force=True)
        logger.warning(
            "nemo_ais: the Ray nodes did not report their GPUs in %.0f s; the engines' GPUs "
            "are checked for %s after setup()",
            timeout_s,
            rollout_format,
        )
        return {}
    gpus = {host: listed for host, listed in found if listed}
    if not gpus:
        logger.warning(
            "nemo_ais: NVML read no GPU on the %d Ray node(s); the engines' GPUs are checked for %s after setup()",
            len(found),
            rollout_format,
        )
    elif all(cap < need.min_capability for listed in gpus.values() for _, cap in listed):
        held = "; ".join(
            f"{host}: "
            + ", ".join(
                f"{k} x {name} (compute capability {'.'.join(map(str, cap))})"
                for (name, cap), k in sorted(Counter(listed).items())
            )
            for host, listed in sorted(gpus.items())
        )
        raise RuntimeError(
            f"rollout format {rollout_format} needs a GPU of compute capability >= {need.min_text} ({need.gpus}), and "
            f"no GPU of the Ray cluster has it ({held}): vLLM would run {need.fallback} instead. Refused before "
            "setup() starts the engines; choose a format these GPUs run natively (the offline check: python -m "
            "nemo_ais.preflight CONFIG)"
        )
    return gpus


def _actor_gpus(generation_worker: Any, read: GpuReader = nvml_gpus) -> list[EngineLayers]:
    """On a generation worker (Ray actor), sync or async engine: its visible GPUs by NVML."""
    gpus = read(os.environ.get("CUDA_VISIBLE_DEVICES") or None)  # unset or "": the node's
    if gpus is None:
        return []
    return [EngineLayers(os.getpid(), socket.gethostname(), n, c, ()) for n, c in gpus]


RPC_TIMEOUT_S = 120.0
"""How long :func:`engine_rpc` waits for an async engine's ``collective_rpc`` (seconds)."""


class AsyncEngineUnreachable(RuntimeError):
    """An async (``AsyncLLM``) engine whose event loop :func:`engine_rpc` cannot find."""


class Unreached(NamedTuple):
    """An actor's answer when :func:`engine_rpc` could not reach its async engine."""

    reason: str


def _engine_loop(llm: Any) -> asyncio.AbstractEventLoop | None:
    """The running loop an ``AsyncLLM`` answers on: its output task's (vLLM 0.20.0, 0.25.1)."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    for task in (getattr(llm, "output_handler", None), getattr(resources, "output_queue_task", None)):
        if isinstance(task, asyncio.Future) and not task.done():
            loop = task.get_loop()
            if loop.is_running() and not loop.is_closed():
                return loop
    return None


async def _awaited_rpc(llm: Any, method: Callable[..., Any], timeout_s: float) -> Any:
    result = await llm.collective_rpc(method, timeout=timeout_s)
    return await result if asyncio.iscoroutine(result) else result  # as NeMo-RL awaits it


def engine_rpc(generation_worker: Any, method: Callable[..., Any], timeout_s: float = RPC_TIMEOUT_S) -> list[Any]:
    """On a generation actor: ``method`` in every vLLM worker process of its engine (a list).

    ``vllm.LLM.collective_rpc`` answers directly. ``AsyncLLM``'s coroutine goes to the engine's own event loop
    (``run_coroutine_threadsafe``, as NeMo-RL main's sparse refit does: Ray runs ``__ray_call__`` outside the actor's
    loop, and vLLM wakes no other loop) and is waited for at most ``timeout_s``, during which the actor takes no other
    call. See docs/nemo_rl.md, "FP8 refit seam".

    Raises:
        AsyncEngineUnreachable: an async engine without a running output task.
        RuntimeError: the async engine is dead (``AsyncLLM.errored``), or this is its own event loop's thread.
        TimeoutError: the async engine did not answer in time (the call is cancelled).
    """
    llm = generation_worker.llm
    if not inspect.iscoroutinefunction(llm.collective_rpc):
        return list(llm.collective_rpc(method))
    name = getattr(method, "__qualname__", repr(method))
    where = f"the async vLLM engine in generation actor pid {os.getpid()}"
    if getattr(llm, "errored", False):
        raise RuntimeError(f"{where} is dead (AsyncLLM.errored): collective_rpc({name}) not sent")
    loop = _engine_loop(llm)
    if loop is None:
        raise AsyncEngineUnreachable(
            f"{where} has no running output task (AsyncLLM.output_handler), so "
            f"collective_rpc({name}) cannot be run on its event loop"
        )
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # no running loop in this thread: the usual case
        running = None
    if running is loop:
        raise RuntimeError(f"engine_rpc({name}) called on the event loop of {where}")
    future = asyncio.run_coroutine_threadsafe(_awaited_rpc(llm, method, timeout_s), loop)
    try:
        return list(future.result(timeout_s))
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"collective_rpc({name}) on {where} did not answer within {timeout_s:.0f} s") from None


def _answer_or_unreached(fn: Callable[[Any], list[Any]], generation_worker: Any) -> list[Any]:
    try:
        return fn(generation_worker)
    except AsyncEngineUnreachable as err:
        return [Unreached(str(err))]


def ask_engines(policy_generation: Any, fn: Callable[[Any], list[Any]]) -> tuple[list[list[Any]], list[str]]:
    """``fn`` (an :func:`engine_rpc` call) on each model-owning generation actor.

    Returns the answers per actor (an unreachable actor's: ``[]``) and why each actor that
    could not be reached was not, so one such actor hides nothing the others answered.
    """
    answer = functools.update_wrapper(functools.partial(_answer_or_unreached, fn), fn)
    per_worker = ask_generation_actors(policy_generation, answer)  # named as ``fn``
    unreached = [r.reason for group in per_worker for r in group if isinstance(r, Unreached)]
    return [[r for r in group if not isinstance(r, Unreached)] for group in per_worker], unreached


def raise_engine_problems(head: str, problems: list[str], unreached: list[str]) -> None:
    """What :func:`ask_engines`' callers found, raised.

    RuntimeError: ``head``, then one line per problem and per engine not read;
    AsyncEngineUnreachable: no problem, but some engine not read (each named).
    """
    if problems:
        lines = problems + [f"not read: {u}" for u in unreached]
        raise RuntimeError(head + "\n  " + "\n  ".join(lines))
    if unreached:
        raise AsyncEngineUnreachable("; ".join(unreached))


def _engine_gpus(generation_worker: Any) -> list[EngineLayers]:
    """On a generation worker (Ray actor): every vLLM worker process's GPU (no layers)."""
    return engine_rpc(generation_worker, _gpu_only)


def _gpu_only(worker: Any = None) -> EngineLayers:
    return engine_layers(None)


def _engine_layers_all(generation_worker: Any) -> list[EngineLayers]:
    """On a generation worker (Ray actor): every vLLM worker process's layers."""
    return engine_rpc(generation_worker, engine_layers)


def ask_generation_actors(
    policy_generation: Any, fn: Callable[[Any], list[Any]], *, every_actor: bool = False
) -> list[list[Any]]:
    """``fn`` on each model-owning generation actor (``every_actor``: on all of them)."""
    import ray

    rank_0_only = None if every_actor else ["tensor_parallel", "pipeline_parallel"]
    futures = policy_generation.worker_group.run_all_workers_single_data(
        "__ray_call__", fn=fn, run_rank_0_only_axes=rank_0_only
    )
    return ray.get(futures)


def gpu_problems(rollout_format: str, reports: Iterable[EngineLayers]) -> list[str]:
    """One line per vLLM process whose GPU cannot run ``rollout_format`` natively."""
    need = NATIVE_KERNELS.get(rollout_format)
    if need is None:
        return []
    return [
        f"vLLM process {r.pid} on {r.host}: rollout format {rollout_format} needs a GPU of compute capability >= "
        f"{need.min_text} ({need.gpus}); {r.device or 'no GPU'} has "
        f"{'.'.join(map(str, r.capability)) if r.capability else 'none'}, where vLLM runs {need.fallback} instead"
        for r in reports
        if r.capability is None or r.capability < need.min_capability
    ]


def require_native_gpu(
    policy_generation: Any, rollout_format: str, *, async_engine: bool = False, read: GpuReader = nvml_gpus
) -> list[EngineLayers]:
    """After ``setup()``: RuntimeError if the engines' GPUs run the rollout format as another.

    ``async_engine`` (vLLM's ``AsyncLLM``): instead of the output task :func:`engine_rpc` needs, EVERY generation actor
    (one per node an engine spans) reads its GPUs with ``read`` (NVML): its ``CUDA_VISIBLE_DEVICES``, or every GPU of
    its node where upstream unset it (parallel engines: ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``).
    """
    if async_engine:
        per_worker = ask_generation_actors(
            policy_generation, functools.partial(_actor_gpus, read=read), every_actor=True
        )
    else:
        per_worker = ask_generation_actors(policy_generation, _engine_gpus)
    reports = [r for group in per_worker for r in group]
    if async_engine and not reports:
        logger.warning(
            "nemo_ais: NVML could not be read in the async generation workers; their GPUs are not checked for %s",
            rollout_format,
        )
    problems = gpu_problems(rollout_format, reports)
    if problems:
        raise RuntimeError(f"the rollout engines cannot run {rollout_format} natively:\n  " + "\n  ".join(problems))
    return reports


def expects_bf16(kept_in_bf16: Callable[[str], bool], vllm_name: str) -> bool:
    """Whether the run keeps vLLM module ``vllm_name`` in BF16 (a fused module: all its parts)."""
    if layer_index(vllm_name) is None:
        return True
    return all(kept_in_bf16(n) for n in fused_parts(vllm_name))


def format_problems(
    rollout_format: str, reports: Sequence[EngineLayers], kept_in_bf16: Callable[[str], bool], *, nemo_rl_version: str
) -> list[str]:
    """One line per layer whose held format is not the one the run's rule gives it.

    ``kept_in_bf16``: the run's keep-in-BF16 rule on a HF name (the refit stream's);
    ``nemo_rl_version``: v0.7.0 never re-processes NVFP4 experts after a refit.
    """
    kernel = NATIVE_KERNELS[rollout_format]
    problems = []
    for r in reports:
        where = f"vLLM process {r.pid} on {r.host}"
        gpu = f"{r.device or 'no GPU'} (compute capability {r.capability or 'none'})"
        for layer in r.layers:
            want_bf16 = expects_bf16(kept_in_bf16, layer.name)
            if layer.held == "bf16" and not want_bf16:
                problems.append(
                    f"{where}: {layer.name} is held in BF16 ({layer.method}) but the run quantizes it to "
                    f"{rollout_format} (an engine ignore entry that also matches this layer?)"
                )
            elif layer.held != "bf16" and want_bf16:
                problems.append(
                    f"{where}: {layer.name} is held as {layer.held} ({layer.method}) but the run keeps it in BF16"
                )
            elif layer.held not in ("bf16", rollout_format):
                if layer.held.startswith(kernel.family) or layer.held == kernel.weight_only:
                    problems.append(
                        f"{where}: {layer.name} runs {layer.held} ({layer.method}) on {gpu}, "
                        f"not {rollout_format}: its activations are not quantized"
                    )
                else:
                    problems.append(
                        f"{where}: {layer.name} is held as {layer.held} ({layer.method}), expected {rollout_format}"
                    )
            if (
                layer.moe
                and not kernel.refit_reloads_experts_v070
                and layer.held != "bf16"
                and nemo_rl_version == "v0.7.0"
            ):
                problems.append(
                    f"{where}: {layer.name} is an NVFP4 expert stack: NeMo-RL v0.7.0 re-processes only dense NVFP4 "
                    "layers after a refit, so its experts would keep their first weights (use NeMo-RL main)"
                )
    return problems


def require_engine_formats(
    policy_generation: Any, rollout_format: str, kept_in_bf16: Callable[[str], bool], *, nemo_rl_version: str
) -> list[EngineLayers]:
    """After the first refit: RuntimeError naming each layer not held as the run's rule says.

    AsyncEngineUnreachable: no layer problem among the engines read, but some async engine not read (each named).
    """
    per_worker, unreached = ask_engines(policy_generation, _engine_layers_all)
    reports = [r for group in per_worker for r in group]
    problems = format_problems(rollout_format, reports, kept_in_bf16, nemo_rl_version=nemo_rl_version)
    head = f"the rollout engines do not hold what the run quantizes ({rollout_format}); {len(problems)} problem(s):"
    raise_engine_problems(head, problems, unreached)
    return reports
