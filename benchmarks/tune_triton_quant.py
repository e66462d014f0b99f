# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Launch-parameter sweep of the fused Triton quantizers on one GPU (bf16 weights).

The per-weight benchmark (``bench_quant_gpu``, section ``quant_fused_cuda``) found the
kernels' GPU work at 0.31-0.49 of ``copy_`` bandwidth on bf16 weights (0.44-0.91 on fp32):
with half the input bytes they take about the fp32 time, so they are not bandwidth-bound.
This sweep times each kernel's launch parameters (rows per program, columns, warps; FP8:
rows per slice of the 128x128 tile, warps) on 4096² and 14336x4096 bf16 weights, each
configuration captured in a CUDA graph (``_launches_only``: no read-back) and replayed
with L2 flushed, against ``copy_`` likewise, median of ``--repeats``. Every configuration's
bits are compared with the shipped configuration's; a mismatch is reported, not ranked.
The shipped constants are changed by hand from its table (no autotuning at run time: one
compile per weight shape and dtype, stated first-call times).

    python -m benchmarks.tune_triton_quant          # a GPU; writes section triton_tuning
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

import nemo_ais.kernels.triton_quant as tq
from benchmarks._record import record_section
from benchmarks.bench_quant import _L2_FLUSH_BYTES
from benchmarks.bench_quant_gpu import fields, graphed

SHAPES = [(4096, 4096), (14336, 4096)]
# format -> (wrapper, {constant: values}); NVFP4 16x16 tiles need _ROWS % 16 == 0, and the
# shipped default of each constant comes first
SWEEPS = {
    "fp8 128x128": (tq.quantize_blockwise_triton, {"_FP8_CHUNK": (16, 8, 32, 64), "_FP8_WARPS": (8, 4, 16)}),
    "mxfp8": (tq.quantize_mxfp8_triton, {"_ROWS": (16, 32, 64), "_COLS": (256, 512), "_WARPS": (8, 4, 16)}),
    "nvfp4": (tq.quantize_nvfp4_triton, {"_ROWS": (16, 32, 64), "_COLS": (256, 512), "_WARPS": (8, 4, 16)}),
    "mxfp4": (tq.quantize_mxfp4_triton, {"_ROWS": (16, 32, 64), "_COLS": (256, 512), "_WARPS": (8, 4, 16)}),
}


def _time(replay, flush: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        flush.fill_(1)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--formats", nargs="+", default=list(SWEEPS), choices=SWEEPS)
    parser.add_argument("--budget-s", type=float, default=120.0, help="stop sweeping after")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    rows = [
        "| format | shape | configuration | ms | copy_ ms | / copy_ bandwidth | first call s | bits = shipped |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    best: dict[tuple[str, str], tuple[float, str]] = {}

    def write() -> None:
        summary = "\n".join(
            f"- {fmt} {shape}: best {cfg} at **{ratio:.2f}** of copy_" for (fmt, shape), (ratio, cfg) in best.items()
        )
        body = "\n".join(rows) + (
            f"\n\n{torch.cuda.get_device_name()}; bf16 weights; each configuration's launches "
            "captured in a CUDA graph (no read-back) and replayed with L2 flushed (256 MiB "
            f"write), median of {args.repeats}, beside copy_ captured likewise. The shipped "
            "configuration is each format's first row.\n\n" + summary
        )
        if not args.no_record:
            record_section("triton_tuning", "Triton quantizers: launch-parameter sweep", body)

    for fmt in args.formats:
        fn, grid = SWEEPS[fmt]
        shipped = {name: getattr(tq, name) for name in grid}
        for shape in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = (torch.randn(shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
            y = torch.empty_like(x)
            t_copy = _time(graphed(lambda x, y=y: y.copy_(x), x), flush, args.repeats)
            want = fields(fn(x))
            shape_s = "x".join(map(str, shape))
            for values in itertools.product(*grid.values()):
                if time.perf_counter() - t0 > args.budget_s:
                    print("budget spent: stopping", flush=True)
                    write()
                    return
                config = dict(zip(grid, values, strict=True))
                label = ", ".join(f"{k.strip('_').lower()}={v}" for k, v in config.items())
                try:
                    for name, value in config.items():
                        setattr(tq, name, value)
                    tc = time.perf_counter()
                    got = fn(x)
                    torch.cuda.synchronize()
                    first = time.perf_counter() - tc
                    bad = _mismatch(got, want)
                    replay = graphed(fn, x)
                    t = float("nan") if replay is None else _time(replay, flush, args.repeats)
                except Exception as err:  # a configuration Triton cannot compile: reported
                    rows.append(f"| {fmt} | {shape_s} | {label} | failed: {type(err).__name__} |")
                    print(rows[-1], flush=True)
                    continue
                finally:
                    for name, value in shipped.items():
                        setattr(tq, name, value)
                ratio = t_copy / t
                rows.append(
                    f"| {fmt} | {shape_s} | {label} | {t * 1e3:.3f} | {t_copy * 1e3:.3f} | "
                    f"**{ratio:.2f}** | {first:.2f} | {'yes' if bad is None else 'NO: ' + bad} |"
                )
                print(rows[-1], flush=True)
                if bad is None and ratio > best.get((fmt, shape_s), (0.0, ""))[0]:
                    best[(fmt, shape_s)] = (ratio, label)
            write()
            del x, y
    write()


def _mismatch(got, want: list[torch.Tensor]) -> str | None:
    for i, (a, b) in enumerate(zip(fields(got), want, strict=True)):
        if a.shape != b.shape or not torch.equal(a, b):
            return f"output {i} differs"
    return None


if __name__ == "__main__":
    main()
