# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Reusable multi-process gloo harness for CPU distributed tests.

Three tools, all plain functions (no pytest fixtures, so adapter tests can reuse them)::

    from tests.distributed._harness import run_distributed, count_collectives

    def _check(rank, world_size, scale):          # module level: pickled by name
        with count_collectives() as counter:
            t = torch.full((2,), float(rank), dtype=torch.float64)
            torch.distributed.all_reduce(t)
        return {"sum": t.tolist(), "calls": counter.names()}

    results = run_distributed(_check, world_size=2, args=(1.0,), timeout=60)
    # results[r] is what rank r returned (anything picklable)

* :func:`run_distributed` starts ``world_size`` fresh processes (``forkserver`` start
  method: each rank is forked from a server that only imported ``_rank_preload`` -- torch,
  Megatron-Core where it imports -- once per test process, so a rank does not pay those
  imports again and inherits no process group or thread pool; each rank sets the caller's
  ``sys.path``, working directory and environment of the call before it unpickles ``fn``,
  so ``fn``'s module is imported as a spawned rank would import it), joins them into one
  gloo process group (a ``file://`` rendezvous in a private temporary directory: no port
  to race for), runs
  ``fn(rank, world_size, *args, **kwargs)`` in each with ``torch.set_num_threads(1)`` and
  returns the per-rank return values in rank order. A rank that raises makes the call
  raise ``RuntimeError`` with every rank's traceback; a rank that does not finish within
  ``timeout`` seconds (a deadlock: one rank skipped a collective) makes it raise
  ``TimeoutError`` naming the stuck ranks, after killing all of them. A rank still costs
  its test module's imports and the gloo rendezvous: run several checks in one ``fn``.
* :func:`count_collectives` is a context manager that wraps every collective of
  ``torch.distributed`` (all_reduce, all_gather, broadcast, barrier, send/recv, ...) and
  records each call as a :class:`CollectiveCall` (name, group, payload bytes, dtypes).
  Calls are counted whether the code under test calls ``torch.distributed.all_reduce``,
  ``dist.all_reduce`` or a name it imported with ``from torch.distributed import ...``
  (module attributes of ``nemo_ais.*`` bound to a collective are patched too). Nested
  calls (``all_gather_object`` calling ``all_gather``) count once.
* Import: test files in ``tests/distributed`` do ``from _harness import ...`` (pytest's
  default ``prepend`` import mode puts the test's directory on ``sys.path``). Elsewhere::

      sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "distributed"))
      from _harness import run_distributed

  The function given to :func:`run_distributed` must be importable by the ranks
  under its module name (a module-level function of a test module is; a lambda or a
  closure is not). The ranks inherit the parent's ``sys.path``.
* :func:`float_bits` / :func:`assert_same_bits` compare floats by their IEEE-754 bit
  pattern, which is what "bit-identical across ranks" means (``0.0 != -0.0`` there, and
  ``nan`` equals itself only if the payload matches).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib.util
import inspect
import os
import pickle
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = [
    "COLLECTIVE_NAMES",
    "MEGATRON_MARKS",
    "CollectiveCall",
    "CollectiveCounter",
    "assert_same_bits",
    "count_collectives",
    "float_bits",
    "run_distributed",
]

# pytestmark of the tests that build Megatron-Core process groups on gloo.
MEGATRON_MARKS = [
    pytest.mark.distributed,
    pytest.mark.megatron,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed (pip install 'nemo-ais[megatron]')",
    ),
]

# Every public collective / point-to-point entry point of torch.distributed (those that
# exist in the installed torch are wrapped). new_group/init are not collectives of the
# code under test and are left alone.
COLLECTIVE_NAMES: tuple[str, ...] = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_object",
    "_all_gather_base",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "broadcast",
    "broadcast_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)

# Grace period after the first rank fails before the others (probably blocked in a
# collective that the failed rank never reached) are killed.
_FAIL_GRACE_S = 5.0
# The fork server the ranks are forked from imports _rank_preload.py (this directory) once:
# ~2 s for torch.distributed and ~7 s for Megatron-Core on a 2-core box, per rank otherwise.
_HERE = os.path.dirname(os.path.abspath(__file__))


# ---- collective counter --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    """One recorded collective call.

    Attributes:
        name: function name, e.g. ``"all_reduce"``.
        group: the ``group`` argument as passed (None = default/WORLD group).
        nbytes: payload size, sum of ``numel * element_size`` over the tensor arguments.
        dtypes: dtype of each tensor argument, in order.
        shapes: shape of each tensor argument, in order.
        op: the reduce op as a string (``"RedOpType.SUM"``...) or None if not a reduction.
    """

    name: str
    group: Any
    nbytes: int
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]
    op: str | None

    @property
    def group_size(self) -> int:
        """World size of the group the call ran on (needs an initialized process group)."""
        return dist.get_world_size(self.group)


@dataclasses.dataclass
class CollectiveCounter:
    """Calls recorded inside one :func:`count_collectives` block, in call order."""

    calls: list[CollectiveCall] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.calls)

    def names(self) -> list[str]:
        """Names of the recorded calls, in order."""
        return [c.name for c in self.calls]

    def count(self, name: str | None = None) -> int:
        """Number of calls, all of them or only those called ``name``."""
        return sum(1 for c in self.calls if name is None or c.name == name)


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


_depth = threading.local()


def _wrap(name: str, original: Callable, counter: CollectiveCounter) -> Callable:
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        signature = None

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        outermost = getattr(_depth, "value", 0) == 0
        if outermost:
            bound = None
            if signature is not None:
                with contextlib.suppress(TypeError):
                    binding = signature.bind(*args, **kwargs)
                    binding.apply_defaults()  # so a default op=SUM is recorded too
                    bound = binding.arguments
            bound = bound if bound is not None else dict(kwargs)
            tensors = _tensors_in(list(args) + list(kwargs.values()))
            op = bound.get("op")
            counter.calls.append(
                CollectiveCall(
                    name=name,
                    group=bound.get("group"),
                    nbytes=sum(t.numel() * t.element_size() for t in tensors),
                    dtypes=tuple(t.dtype for t in tensors),
                    shapes=tuple(tuple(t.shape) for t in tensors),
                    op=None if op is None else str(op),
                )
            )
        _depth.value = getattr(_depth, "value", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.value -= 1

    wrapper.__wrapped_collective__ = original  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def count_collectives(module_prefixes: Sequence[str] = ("nemo_ais",)) -> Iterator[CollectiveCounter]:
    """Count every ``torch.distributed`` collective called inside the block.

    Patches the collectives in ``torch.distributed``, ``torch.distributed.distributed_c10d``
    and in every already-imported module whose name starts with one of ``module_prefixes``
    (so ``from torch.distributed import all_reduce`` is caught too), and restores them on
    exit. Works without an initialized process group (then any call fails as usual, but
    is still recorded).

    Args:
        module_prefixes: module-name prefixes whose module-level names bound to a
            collective are patched as well.

    Yields:
        A :class:`CollectiveCounter`, filled while the block runs.
    """
    import torch.distributed.distributed_c10d as c10d

    counter = CollectiveCounter()
    originals = {}
    for name in COLLECTIVE_NAMES:
        fn = getattr(c10d, name, None) or getattr(dist, name, None)
        if fn is not None:
            fn = getattr(fn, "__wrapped_collective__", fn)
            originals[name] = fn
    wrappers = {name: _wrap(name, fn, counter) for name, fn in originals.items()}
    by_identity = {id(fn): name for name, fn in originals.items()}

    patched: list[tuple[Any, str, Any]] = []
    modules = [dist, c10d] + [
        m
        for mod_name, m in list(sys.modules.items())
        if m is not None and any(mod_name.startswith(p) for p in module_prefixes)
    ]
    for module in modules:
        for attr, value in list(vars(module).items()):
            name = by_identity.get(id(value))
            if name is not None:
                patched.append((module, attr, value))
                setattr(module, attr, wrappers[name])
    try:
        yield counter
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)


# ---- float bit patterns ---------------------------------------------------------------------


def float_bits(x: float | torch.Tensor) -> str:
    """IEEE-754 float64 bit pattern of ``x`` as 16 hex digits (a 0-dim tensor is converted)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.float64).item()
    return struct.pack(">d", float(x)).hex()


def assert_same_bits(per_rank: Sequence[dict[str, float]], what: str = "value") -> None:
    """Assert every key of ``per_rank[r]`` has the same float64 bit pattern on every rank.

    Raises:
        AssertionError: naming the first differing key and every rank's value and bits.
    """
    keys = list(per_rank[0])
    for r, values in enumerate(per_rank):
        assert list(values) == keys, f"rank {r} has keys {list(values)}, rank 0 has {keys}"
    for key in keys:
        bits = [float_bits(values[key]) for values in per_rank]
        if len(set(bits)) != 1:
            detail = ", ".join(
                f"rank {r}: {values[key]!r} (0x{b})" for r, (values, b) in enumerate(zip(per_rank, bits, strict=True))
            )
            raise AssertionError(f"{what} {key!r} differs across ranks: {detail}")


# ---- process launcher -----------------------------------------------------------------------


def _worker(
    rank: int, world_size: int, result_dir: str, timeout_s: float, backend: str, environ: dict[str, str], call: bytes
) -> None:
    """Body of one rank: init the group, run ``fn``, write ``rank{r}.pkl``.

    The ranks meet through a file in the run's private directory (``file://``), not a TCP
    port chosen in advance: nothing another process can take first (gloo's own sockets
    listen on ports the kernel assigns).
    """
    os.environ.clear()  # the caller's environment now, not the fork server's at its start
    os.environ.update(environ)
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size)
    )
    outcome: dict[str, Any]
    try:
        # imports fn's module under that environment; a failing import is this rank's error
        fn, args, kwargs = pickle.loads(call)
        dist.init_process_group(
            backend=backend,
            init_method="file://" + os.path.join(result_dir, "rendezvous"),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        # init_process_group can return here while a peer still finishes gloo's connectFullMesh: a rank
        # whose fn runs no collective would exit and close the pair under it ("Connection closed by peer",
        # ~2% of 2-rank runs on 2 loaded cores). One barrier before fn; fn's own collectives stay unmatched.
        dist.barrier()
        outcome = {"ok": True, "value": fn(rank, world_size, *args, **kwargs)}
    except BaseException as err:  # report everything, including assertion failures
        outcome = {"ok": False, "error": f"{type(err).__name__}: {err}\n{traceback.format_exc()}"}
    try:
        payload = pickle.dumps(outcome)
    except Exception as err:
        payload = pickle.dumps({"ok": False, "error": f"result of rank {rank} not picklable: {err}"})
    tmp = os.path.join(result_dir, f"rank{rank}.tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, os.path.join(result_dir, f"rank{rank}.pkl"))
    if outcome["ok"] and dist.is_initialized():
        dist.destroy_process_group()
    # Skip interpreter teardown: a rank whose peers died can hang in gloo's destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _start(procs: list) -> None:
    """Start the ranks. The first start launches the fork server, which imports its preload
    from its own ``PYTHONPATH`` (Python 3.11's ignores the caller's ``sys.path``): this
    directory goes first there, for that launch only (each rank resets the environment)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, saved) if p)
    try:
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved


def _read_result(result_dir: str, rank: int) -> dict[str, Any] | None:
    path = os.path.join(result_dir, f"rank{rank}.pkl")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    timeout: float = 90.0,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` gloo ranks.

    Args:
        fn: a module-level function (pickled by qualified name). It runs after
            ``torch.distributed.init_process_group`` (default group = all ranks) with one
            intra-op thread, and may return anything picklable.
        world_size: number of processes (>= 1).
        args: positional arguments after ``(rank, world_size)``; must be picklable.
        kwargs: keyword arguments; must be picklable.
        timeout: seconds for the whole run (the ranks' start included, not the fork
            server's one-time preload at the first call of a process); also the gloo
            collective timeout inside the ranks.
        backend: ``torch.distributed`` backend (``"gloo"`` on CPU).

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        RuntimeError: a rank raised (message holds every failed rank's traceback) or died
            without reporting (exit code given).
        TimeoutError: some rank did not finish in ``timeout`` seconds (all are killed).
    """
    if world_size < 1:
        raise ValueError(f"world_size: got {world_size}, expected >= 1")
    kwargs = dict(kwargs or {})
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["_rank_preload"])  # read when the server starts (first call)
    environ = dict(os.environ)
    call = pickle.dumps((fn, args, kwargs))
    with tempfile.TemporaryDirectory(prefix="nemo_ais_dist_") as result_dir:
        procs = [
            ctx.Process(
                target=_worker,
                args=(rank, world_size, result_dir, timeout, backend, environ, call),
                daemon=True,
                name=f"nemo_ais-rank{rank}",
            )
            for rank in range(world_size)
        ]
        _start(procs)
        deadline = time.monotonic() + timeout
        first_failure: float | None = None
        try:
            while any(p.is_alive() for p in procs):
                now = time.monotonic()
                if now > deadline:
                    break
                if first_failure is None:
                    for rank in range(world_size):
                        res = _read_result(result_dir, rank)
                        if (res is not None and not res["ok"]) or (
                            not procs[rank].is_alive() and procs[rank].exitcode not in (0, None)
                        ):
                            first_failure = now
                            break
                elif now - first_failure > _FAIL_GRACE_S:
                    break
                time.sleep(0.05)
        finally:
            stuck = [rank for rank, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(5)
        results = [_read_result(result_dir, rank) for rank in range(world_size)]

    errors = [
        f"--- rank {rank} ---\n{res['error']}" for rank, res in enumerate(results) if res is not None and not res["ok"]
    ]
    died = [
        f"--- rank {rank} --- exited with code {procs[rank].exitcode} without a result"
        for rank, res in enumerate(results)
        if res is None and rank not in stuck
    ]
    if errors or died:
        hung = f"\n(ranks {stuck} were still running and were killed)" if stuck else ""
        raise RuntimeError(
            f"{getattr(fn, '__name__', fn)} failed on {world_size} ranks:\n" + "\n".join(errors + died) + hung
        )
    if stuck:
        raise TimeoutError(
            f"{getattr(fn, '__name__', fn)}: ranks {stuck} of {world_size} did not finish "
            f"within {timeout:.0f} s (deadlock: a rank skipped or added a collective?); "
            f"ranks that finished: {[r for r in range(world_size) if r not in stuck]}"
        )
    return [res["value"] for res in results]
