# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Throughput of the blockwise FP8 quantizer on CPU vs a vectorised reference and a copy.

For each weight shape and input dtype it times, interleaved within every repeat (the
machine is shared), median of ``--repeats`` after one warm-up:

* ``ours``: :func:`nemo_ais.fp8.quantize_blockwise` (family "a", 128x128, eps 1e-4);
* ``reference``: the straightforward vectorised formulation written here (reshape into
  128x128 tiles, amax, scale, clamp, cast: the shape of DeepGEMM's and NeMo-RL's
  per-block casts), checked bit-equal to ours (first mismatch reported);
* ``clone``: ``x.clone()`` of the same tensor (allocates its output, as the quantizer does);
* ``copy_``: ``y.copy_(x)`` into a preallocated buffer: the memory-bandwidth bound.

Throughput is input bytes / time; the fraction of copy bandwidth is t_copy_ / t_ours
(1.0 = the quantizer runs as fast as one copy of its input).

    python -m benchmarks.bench_quant [--threads 1] [--repeats 5] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks._record import record_section
from nemo_ais.fp8 import quantize_blockwise

SHAPES = [(4096, 4096), (14336, 4096)]
DTYPES = [torch.float32, torch.bfloat16]


def reference_quantize(x: torch.Tensor, block: int = 128, eps: float = 1e-4):
    """Vectorised reference, family "a": per 128x128 tile s = amax / 448, q = x * (1/s).

    The straightforward formulation: view ``[N, K]`` as ``[N/b, b, K/b, b]`` tiles, amax
    over each tile, scale, clamp to the E4M3 range, cast. N and K must be multiples of b.
    """
    n, k = x.shape
    if n % block or k % block:
        raise ValueError(f"reference_quantize: shape {list(x.shape)} is not a multiple of {block}")
    tiles = x.float().reshape(n // block, block, k // block, block)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True).clamp_min(eps)
    scale = amax / 448.0
    q = (tiles * torch.reciprocal(scale)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(n, k), scale.reshape(n // block, k // block)


def _first_mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    """DeepGEMM-style report: first differing index and both values."""
    idx = tuple(torch.nonzero(a != b)[0].tolist())
    return f"first mismatch at {idx}: ours {a[idx].item()!r}, reference {b[idx].item()!r}"


def _interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each callable, all timed in turn within every repeat (shared machine)."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    rows = [
        "| shape | dtype | ours ms | ours GB/s | reference ms | ours / reference "
        "| clone ms | copy_ ms | copy_ GB/s | fraction of copy_ bandwidth | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in SHAPES:
        for dtype in DTYPES:
            x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
            q_ours, s_ours = quantize_blockwise(x)
            q_ref, s_ref = reference_quantize(x)
            q8_ours, q8_ref = q_ours.view(torch.uint8), q_ref.view(torch.uint8)
            assert torch.equal(q8_ours, q8_ref), _first_mismatch(q8_ours, q8_ref)
            assert torch.equal(s_ours, s_ref), _first_mismatch(s_ours, s_ref)
            del q_ours, s_ours, q_ref, s_ref
            y = torch.empty_like(x)
            t = _interleaved_medians(
                {
                    "ours": lambda x=x: quantize_blockwise(x),
                    "reference": lambda x=x: reference_quantize(x),
                    "clone": lambda x=x: x.clone(),
                    "copy_": lambda x=x, y=y: y.copy_(x),
                },
                args.repeats,
            )
            del y
            load.append(os.getloadavg()[0])
            gb = x.numel() * x.element_size() / 1e9
            rows.append(
                f"| {shape[0]}x{shape[1]} | {str(dtype).removeprefix('torch.')} "
                f"| {t['ours'] * 1e3:.1f} | {gb / t['ours']:.2f} | {t['reference'] * 1e3:.1f} "
                f"| **{t['ours'] / t['reference']:.2f}** | {t['clone'] * 1e3:.1f} "
                f"| {t['copy_'] * 1e3:.1f} | {gb / t['copy_']:.2f} "
                f"| **{t['copy_'] / t['ours']:.2f}** | {load[-1]:.1f} |"
            )
            print(rows[-1], flush=True)
    body = "\n".join(rows) + (
        f"\n\n{args.threads} torch thread(s); ours, the reference, `x.clone()` and "
        f"`y.copy_(x)` timed in turn within each of {args.repeats} repeats after a warm-up "
        "(median). GB/s = input bytes / time. The reference is the straightforward "
        "vectorised formulation (reshape into 128x128 tiles, amax, scale = amax / 448, "
        "multiply by 1/scale, clamp, cast to E4M3), outputs checked bit-equal to ours. "
        "Fraction of copy_ bandwidth = t(y.copy_(x)) / t(ours): 1.0 would be a quantizer as "
        "fast as one copy of its input into a preallocated buffer (the memory-bandwidth "
        "bound; the quantizer reads the input once more for the amax and writes 1 byte per "
        f"element plus scales). Load average (1 min): {min(load):.1f} to {max(load):.1f} on "
        f"{os.cpu_count()} cores (shared machine: ratios are the meaningful numbers)."
    )
    print(body)
    if not args.no_record:
        record_section("quant", "Blockwise FP8 quantizer throughput (CPU)", body)


if __name__ == "__main__":
    main()
