# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Throughput of the blockwise FP8 quantizer on CPU vs a naive per-tile reference.

For each weight shape and input dtype it times (median of ``--repeats`` after one warm-up):

* ``ours``: :func:`nemo_ais.fp8.quantize_blockwise` (family "a", 128x128, eps 1e-4);
* ``reference``: a straightforward per-tile Python loop written here (same formula);
* ``clone``: ``x.clone()`` of the same tensor, the memory-bandwidth yardstick (it
  allocates its output, as the quantizer does);
* ``copy_``: ``y.copy_(x)`` into a preallocated buffer: the bandwidth bound without
  page-fault cost of a fresh allocation.

Throughput is input bytes / time. ``clone fraction`` = t_clone / t_ours and ``copy_
fraction`` = t_copy_ / t_ours: 1.0 means the quantizer runs as fast as one copy of its
input (a copy reads and writes the input size; the quantizer reads the input and writes
1 byte per element plus scales, but does far more arithmetic per byte). The
reference's output is checked bit-for-bit against ours once per configuration.

    python -m benchmarks.bench_quant [--threads 1] [--repeats 5] [--no-record]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks._record import record_section
from nemo_ais.fp8 import quantize_blockwise

SHAPES = [(4096, 4096), (14336, 4096)]
DTYPES = [torch.float32, torch.bfloat16]


def reference_quantize(x: torch.Tensor, block: int = 128, eps: float = 1e-4):
    """Naive per-tile loop, family "a": s = amax/448, q = x * (1/s), clamp, cast."""
    n, k = x.shape
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(-(-n // block), -(-k // block), dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            tile = x[rows, cols].float()
            scale = tile.abs().amax().clamp_min(eps) / 448.0
            q[rows, cols] = (tile * torch.reciprocal(scale)).clamp(-448.0, 448.0).to(q.dtype)
            s[i, j] = scale
    return q, s


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        "| shape | dtype | ours ms | ours GB/s | reference ms | speed-up vs reference "
        "| clone ms | clone fraction | copy_ GB/s | copy_ fraction |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in SHAPES:
        for dtype in DTYPES:
            x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
            q_ours, s_ours = quantize_blockwise(x)
            q_ref, s_ref = reference_quantize(x)
            assert torch.equal(q_ours.view(torch.uint8), q_ref.view(torch.uint8))
            assert torch.equal(s_ours, s_ref)
            del q_ours, s_ours, q_ref, s_ref
            gb = x.numel() * x.element_size() / 1e9
            t_ours = _median_time(lambda x=x: quantize_blockwise(x), args.repeats)
            t_ref = _median_time(lambda x=x: reference_quantize(x), max(1, args.repeats // 2))
            t_clone = _median_time(lambda x=x: x.clone(), args.repeats)
            y = torch.empty_like(x)
            t_copy = _median_time(lambda x=x, y=y: y.copy_(x), args.repeats)
            del y
            rows.append(
                f"| {shape[0]}x{shape[1]} | {str(dtype).removeprefix('torch.')} "
                f"| {t_ours * 1e3:.1f} | {gb / t_ours:.2f} | {t_ref * 1e3:.1f} "
                f"| {t_ref / t_ours:.2f}x | {t_clone * 1e3:.1f} | {t_clone / t_ours:.2f} "
                f"| {gb / t_copy:.2f} | {t_copy / t_ours:.2f} |"
            )
            print(rows[-1], flush=True)
    body = "\n".join(rows) + (
        f"\n\n{args.threads} torch thread(s), median of {args.repeats} runs after a warm-up "
        "(reference: median of half as many). GB/s = input bytes / time. clone / copy_ "
        "fraction = t(x.clone()) / t(ours) and t(y.copy_(x)) / t(ours): 1.0 = as fast as "
        "one copy of the input (clone allocates its output like the quantizer does; copy_ "
        "writes into a preallocated buffer: the pure bandwidth bound). The reference is "
        "a per-128x128-tile Python loop with the same formula (outputs checked bit-equal). "
        "The CI machine is shared: absolute numbers are noisy, ratios less so."
    )
    print(body)
    if not args.no_record:
        record_section("quant", "Blockwise FP8 quantizer throughput (CPU)", body)


if __name__ == "__main__":
    main()
