# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Throughput of every quantizer on CPU vs a vectorised reference and a copy.

Formats: FP8 blockwise (128x128, :func:`nemo_ais.fp8.quantize_blockwise`, family "a"),
NVFP4 (:func:`nemo_ais.fp8.quantize_nvfp4`), MXFP8 (:func:`nemo_ais.fp8.quantize_mxfp8`)
and MXFP4 (:func:`nemo_ais.fp8.quantize_mxfp4`). For each weight shape and input dtype it
times, interleaved within every repeat (the machine is shared), median of ``--repeats``
after one warm-up:

* ``ours``: the public quantizer (the banded fast path);
* ``reference``: the straightforward vectorised formulation of the same rule (FP8:
  ``reference_quantize`` below, the shape of DeepGEMM's and NeMo-RL's per-block casts;
  the block-scaled formats: the ``quantize_*_reference`` kept next to each fast path),
  checked bit-equal to ours (first mismatch reported);
* ``copy_``: ``y.copy_(x)`` into a preallocated buffer: the memory-bandwidth bound.

Throughput is input bytes / time; the fraction of copy bandwidth is t_copy_ / t_ours
(1.0 = the quantizer runs as fast as one copy of its input).

    python -m benchmarks.bench_quant [--threads 1] [--repeats 3] [--formats fp8 nvfp4 ...] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks._record import record_section
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4
from nemo_ais.fp8.mxfp4 import quantize_mxfp4_reference
from nemo_ais.fp8.mxfp8 import quantize_mxfp8_reference
from nemo_ais.fp8.nvfp4 import quantize_nvfp4_reference

SHAPES = [(4096, 4096), (14336, 4096)]  # Llama/Qwen attention; Llama-3-8B MLP
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


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def _fields(q) -> list[torch.Tensor]:
    """The output tensors of a quantizer, as comparable byte / bit views."""
    parts = q if isinstance(q, tuple) else tuple(vars(q).values())
    return [_as_bytes(p.contiguous()) for p in parts]


# format -> (ours, reference)
FORMATS = {
    "fp8 128x128": (quantize_blockwise, reference_quantize),
    "nvfp4": (quantize_nvfp4, quantize_nvfp4_reference),
    "mxfp8": (quantize_mxfp8, quantize_mxfp8_reference),
    "mxfp4": (quantize_mxfp4, quantize_mxfp4_reference),
}


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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    rows = [
        "| format | shape | dtype | ours ms | ours GB/s | reference ms | ours / reference "
        "| copy_ ms | copy_ GB/s | fraction of copy_ bandwidth | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for fmt in args.formats:
        ours, reference = FORMATS[fmt]
        for shape in SHAPES:
            for dtype in DTYPES:
                x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
                for a, b in zip(_fields(ours(x)), _fields(reference(x)), strict=True):
                    assert torch.equal(a, b), f"{fmt}: " + _first_mismatch(a, b)
                y = torch.empty_like(x)
                t = _interleaved_medians(
                    {
                        "ours": lambda x=x, f=ours: f(x),
                        "reference": lambda x=x, f=reference: f(x),
                        "copy_": lambda x=x, y=y: y.copy_(x),
                    },
                    args.repeats,
                )
                del y
                load.append(os.getloadavg()[0])
                gb = x.numel() * x.element_size() / 1e9
                rows.append(
                    f"| {fmt} | {shape[0]}x{shape[1]} | {str(dtype).removeprefix('torch.')} "
                    f"| {t['ours'] * 1e3:.1f} | {gb / t['ours']:.2f} "
                    f"| {t['reference'] * 1e3:.1f} | **{t['ours'] / t['reference']:.2f}** "
                    f"| {t['copy_'] * 1e3:.1f} | {gb / t['copy_']:.2f} "
                    f"| **{t['copy_'] / t['ours']:.2f}** | {load[-1]:.1f} |"
                )
                print(rows[-1], flush=True)
    body = "\n".join(rows) + (
        f"\n\n{args.threads} torch thread(s); ours, the reference and `y.copy_(x)` timed in "
        f"turn within each of {args.repeats} repeats after a warm-up (median). GB/s = input "
        "bytes / time. References: FP8, the straightforward vectorised formulation (reshape "
        "into 128x128 tiles, amax, scale = amax / 448, multiply by 1/scale, clamp, cast to "
        "E4M3); NVFP4 / MXFP8 / MXFP4, the short `quantize_*_reference` of each module (whole "
        "tensor at once, E2M1 by seven threshold comparisons); every output checked bit-equal "
        "to ours first. Fraction of copy_ bandwidth = t(y.copy_(x)) / t(ours): 1.0 would be "
        "a quantizer as fast as one copy of its input into a preallocated buffer (the "
        "memory-bandwidth bound). No GPU was lent to this task: no GB/s against HBM "
        "bandwidth. Load average (1 min): "
        f"{min(load):.1f} to {max(load):.1f} on {os.cpu_count()} cores (shared machine: the "
        "ratios, measured side by side, are the meaningful numbers)."
    )
    print(body)
    if not args.no_record:
        record_section("quant", "Quantizer throughput (CPU): FP8, NVFP4, MXFP8, MXFP4", body)


if __name__ == "__main__":
    main()
