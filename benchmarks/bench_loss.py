# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Our loss against NeMo-RL's own ``ClippedPGLossFn``: forward + backward per call (CPU, fp32).

One process, the same micro-batch, every variant timed in turn within each repeat
(interleaved), median after warm-up:

* ``upstream``: NeMo-RL v0.7.0's real ``ClippedPGLossFn`` (the vendored source, imported
  as the tests import it: ``NEMO_RL_DIR`` or ``../shared/vendor/nemo-rl-v0.7.0``, with the
  Python 3.11 ``TypedDict`` shim of ``tests/_nemo_rl_env/sitecustomize.py``);
* ``ours none`` / ``ours tis`` / ``ours ais``: :class:`AISClippedPGLossFn` as NeMo-RL calls it
  (``next_token_logprobs``, NeMo-RL's data dict, ``global_valid_seqs`` /
  ``global_valid_toks``), the global batch prepared by the seam (mode ais uses the
  prepared diagnostics; mode none is ``ClippedPGLossFn`` plus our telemetry);
* ``core ais``: :func:`nemo_ais.core.clipped_pg_loss` on the mapped tensors.

Loss config: NeMo-RL's GRPO defaults (clip 0.2 / 0.2, KL penalty 0.01 k3, token level).
Data: ``[B, T]`` fp32 log-probs, int64 ``token_mask`` (first position and ~10% of the
rest 0), fp32 ``sample_mask``; ``next_token_logprobs`` is ``[B, T - 1]``.

The prepare step (statistics of the global batch + ONE all-reduce, here over a 1-process
gloo group, + alpha) runs once per global batch; it is reported as a fraction of the
loss calls of one train step on that global batch (``--micro-batches`` calls of B x T).

The script sets ``OMP_WAIT_POLICY=PASSIVE`` unless given (see the comment at the top).

Usage: ``python -m benchmarks.bench_loss [--threads 1 2] [--repeats 15] [--no-record]``
"""

from __future__ import annotations

import os

# Before torch starts OpenMP: idle intra-op threads sleep instead of spinning. On a shared
# machine a spinning team waits at every op for a descheduled peer (2-thread calls then
# take up to ~100x their 1-thread time, for both implementations alike).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._record import record_section

REPO_ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(8, 1024), (64, 1024), (64, 4096)]
OURS = ("none", "tis", "ais")
VARIANTS = ("upstream", *(f"ours {m}" for m in OURS), "core ais")


def import_nemo_rl() -> Path:
    """Put the vendored NeMo-RL on ``sys.path`` as ``tests/conftest.py`` does; its directory.

    Applies the test harness's Python 3.11 ``TypedDict`` shim (loaded from its file, not
    copied) before the first ``nemo_rl`` import.
    """
    vendored = REPO_ROOT.parent / "shared" / "vendor" / "nemo-rl-v0.7.0"
    nemo_rl_dir = Path(os.environ.get("NEMO_RL_DIR") or vendored).resolve()
    shim = REPO_ROOT / "tests" / "_nemo_rl_env" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("_nemo_ais_bench_shim", shim)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    sys.path.insert(0, str(nemo_rl_dir))
    import nemo_rl  # noqa: F401  (fails here, with the path, if the checkout is missing)

    return nemo_rl_dir


def make_data(batch: int, length: int, seed: int = 0):
    """NeMo-RL's training data for one micro-batch and ``next_token_logprobs`` ``[B, T - 1]``."""
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    g = torch.Generator().manual_seed(seed)
    gen = -3 * torch.rand(batch, length, generator=g)
    prev = gen + 0.02 * torch.randn(batch, length, generator=g)  # FP8-like mismatch
    token_mask = (torch.rand(batch, length, generator=g) > 0.1).long()
    token_mask[:, 0] = 0
    data = BatchedDataDict(
        {
            "input_ids": torch.zeros(batch, length, dtype=torch.long),
            "token_mask": token_mask,
            "sample_mask": torch.ones(batch),
            "advantages": torch.randn(batch, 1, generator=g).expand(batch, length).clone(),
            "prev_logprobs": prev,
            "generation_logprobs": gen,
            "reference_policy_logprobs": prev + 0.01 * torch.randn(batch, length, generator=g),
        }
    )
    curr = prev[:, 1:] + 0.05 * torch.randn(batch, length - 1, generator=g)
    return data, curr


def global_counts(data) -> tuple[torch.Tensor, torch.Tensor]:
    """(global_valid_seqs, global_valid_toks) as NeMo-RL's worker forms them (one rank)."""
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    return data["sample_mask"].sum(), mask.sum()


def host_reads(fn) -> int:
    """Device-to-host reads (``item`` / ``tolist`` / ``float`` / ...) of one call of ``fn``."""
    calls = []
    originals = {n: getattr(torch.Tensor, n) for n in ("item", "tolist", "__float__", "__int__")}
    originals["__bool__"] = torch.Tensor.__bool__

    def counting(name):
        def wrapper(self, *a, **k):
            calls.append(name)
            return originals[name](self, *a, **k)

        return wrapper

    try:
        for name in originals:
            setattr(torch.Tensor, name, counting(name))
        fn()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return len(calls)


def build_variants(data, curr):
    """Name -> zero-argument callable doing one forward + backward."""
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn

    from nemo_ais.core import clipped_pg_loss
    from nemo_ais.nemo_rl import AISClippedPGLossFn
    from nemo_ais.nemo_rl.seam import core_inputs, prepare_global_batches

    gvs, gvt = global_counts(data)
    rows = data.size
    upstream = ClippedPGLossFn(ClippedPGLossConfig())
    ours = {m: AISClippedPGLossFn({"ais": {"mode": m}}) for m in OURS}
    for loss_fn in ours.values():
        prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=rows, group=None)
    x = core_inputs(data)
    ais = ours["ais"]

    def nemo_rl_call(loss_fn):
        def call():
            lp = curr.clone().requires_grad_(True)
            loss, _ = loss_fn(lp, data, gvs, gvt)
            loss.backward()

        return call

    def core_call():
        lp = curr.clone().requires_grad_(True)
        out = clipped_pg_loss(
            lp, x.logp_old, x.logp_rollout, x.adv, x.mask, ais.ais, pg=ais.pg,
            reference_logprobs=x.logp_ref, diagnostics=ais._diagnostics[0],
            global_valid_tokens=gvt, global_valid_seqs=gvs,
        )  # fmt: skip
        out.loss.backward()

    calls = {"upstream": nemo_rl_call(upstream)}
    calls.update({f"ours {m}": nemo_rl_call(fn) for m, fn in ours.items()})
    calls["core ais"] = core_call
    return calls


def time_interleaved(calls: dict, repeats: int, warmup: int):
    """Median wall and process-CPU seconds per call of each variant (interleaved repeats)."""
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(warmup + repeats):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            if i >= warmup:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    median = statistics.median
    return {n: median(v) for n, v in wall.items()}, {n: median(v) for n, v in cpu.items()}


def time_prepare(batch: int, length: int, micro_batches: int, repeats: int, loss_call):
    """Median seconds of the prepare step on a global batch of ``micro_batches`` x B rows,
    and of ``micro_batches`` loss calls (``loss_call``, one micro-batch each), interleaved.

    The prepare step: statistics, the ONE all-reduce (over a 1-process gloo group: the real
    collective call, without the network) and alpha, then the row tags, as the AIS worker
    runs it once per global batch.
    """
    from nemo_ais.nemo_rl import AISClippedPGLossFn
    from nemo_ais.nemo_rl.seam import prepare_global_batches

    data, _ = make_data(batch * micro_batches, length, seed=1)
    loss_fn = AISClippedPGLossFn({"ais": {"mode": "ais"}})
    group = torch.distributed.group.WORLD
    rows = batch * micro_batches
    prepare, step = [], []
    for i in range(repeats + 1):
        start = time.perf_counter()
        prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=rows, group=group)
        middle = time.perf_counter()
        for _ in range(micro_batches):
            loss_call()
        if i > 0:
            prepare.append(middle - start)
            step.append(time.perf_counter() - middle)
    return statistics.median(prepare), statistics.median(step)


def _init_gloo() -> None:
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    nemo_rl_dir = import_nemo_rl()
    _init_gloo()
    load = [os.getloadavg()[0]]
    head = " | ".join(f"{v} (ms)" for v in VARIANTS)
    ratios = " | ".join(f"{v} / upstream" for v in VARIANTS[1:])
    lines = [
        f"| threads | B x T | {head} | {ratios} | ours ais / upstream (CPU time) | load |",
        "|" + "---|" * (3 + 2 * len(VARIANTS)),
    ]
    prepare_lines = [
        "| threads | global batch (rows x T) | prepare (ms) | "
        f"{args.micro_batches} x ours ais (ms) | prepare / loss calls |",
        "|---|---|---|---|---|",
    ]
    reads = None
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch, length in SHAPES:
            data, curr = make_data(batch, length)
            calls = build_variants(data, curr)
            if reads is None:
                reads = {name: host_reads(call) for name, call in calls.items()}
            repeats = args.repeats * min(4, max(1, (64 * 4096) // (16 * batch * length)))
            sec, cpu = time_interleaved(calls, repeats, args.warmup)
            load.append(os.getloadavg()[0])
            ms = " | ".join(f"{sec[v] * 1e3:.2f}" for v in VARIANTS)
            ratio = " | ".join(f"**{sec[v] / sec['upstream']:.2f}**" for v in VARIANTS[1:])
            cpu_ratio = cpu["ours ais"] / cpu["upstream"]
            lines.append(f"| {threads} | {batch} x {length} | {ms} | {ratio} | {cpu_ratio:.2f} | {load[-1]:.1f} |")
            print(lines[-1], flush=True)
            t_prep, step = time_prepare(batch, length, args.micro_batches, max(3, args.repeats // 3), calls["ours ais"])
            prepare_lines.append(
                f"| {threads} | {args.micro_batches * batch} x {length} | {t_prep * 1e3:.2f} | "
                f"{step * 1e3:.2f} | {t_prep / step:.3f} |"
            )
            print(prepare_lines[-1], flush=True)
    torch.distributed.destroy_process_group()
    from nemo_ais.core import NUM_SLOTS, STATS_BYTES

    reads_line = ", ".join(f"{name} {n}" for name, n in reads.items())
    body = "\n".join(
        [
            "Forward + backward of one loss call as NeMo-RL's worker makes it, fp32 on CPU: "
            "NeMo-RL v0.7.0's own `ClippedPGLossFn` (vendored source at "
            f"`{nemo_rl_dir.name}`) next to our `AISClippedPGLossFn` (modes none / tis / ais, "
            "the global batch prepared by the seam) and our core `clipped_pg_loss` (mode ais, "
            "prepared diagnostics), in one process, the variants interleaved within each of "
            f"{args.repeats} repeats (x2 at 8 x 1024) after {args.warmup} warm-up rounds; median "
            "wall time per call (the CPU-time column: `time.process_time`, less sensitive to "
            "other processes on a shared machine). NeMo-RL's GRPO loss defaults (clip 0.2 / 0.2, KL penalty 0.01 k3, token "
            "level); `B x T`: `[B, T]` log-probs, int64 `token_mask` with ~10% zeros, "
            "`next_token_logprobs` `[B, T - 1]`. Ratios < 1 mean ours is faster; `load` is "
            "the 1-minute load average after the row.",
            "",
            *lines,
            "",
            f"Load average (1 min) over the run: {min(load):.1f} to {max(load):.1f} on "
            f"{os.cpu_count()} cores; `OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}` (idle "
            "intra-op threads sleep: with other processes on the cores, spinning threads make "
            "every 2-thread op wait for a descheduled peer). On this shared machine absolute "
            "times move with the load; the interleaved ratios much less. Mode none calls "
            "`ClippedPGLossFn` itself, so it returns exactly its loss, gradient and metrics, "
            "and adds the `ais/*` telemetry: one host read of the call's counts (the prepare "
            "step counted each row's valid tokens once per `train()` call) and a scale of the "
            "global batch's values read when they were attached. Its time is upstream's plus "
            "that small constant, never below it by construction: a ratio under 1.00 in that "
            f"column is noise. Device-to-host reads per call: {reads_line}.",
            "",
            "Prepare step, once per global batch: statistics of this rank's rows, ONE "
            "`all_reduce` (1-process gloo group here) and alpha, plus the row tags; against "
            f"the {args.micro_batches} loss calls (micro-batches of B x T, mode ais) of that "
            "global batch in one train step, the two timed alternately (median):",
            "",
            *prepare_lines,
            "",
            f"The all-reduce moves {STATS_BYTES} bytes ({NUM_SLOTS} float64 sums) per global "
            "batch, independent of B x T; the prepare time is the local float64 statistics "
            "(`nemo_ais.core.stats.compute_statistics`).",
        ]
    )
    print()
    print(body)
    if not args.no_record:
        threads = " and ".join(map(str, args.threads))
        title = "Loss: ours against NeMo-RL's ClippedPGLossFn (CPU)"
        record_section("loss", title, body, threads=threads)


if __name__ == "__main__":
    main()
