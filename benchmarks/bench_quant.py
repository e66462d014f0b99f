# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Throughput of every quantizer on CPU vs a vectorised reference and a copy.

Formats: FP8 blockwise (128x128, :func:`nemo_ais.fp8.quantize_blockwise`, family "reciprocal"),
NVFP4 (:func:`nemo_ais.fp8.quantize_nvfp4`), MXFP8 (:func:`nemo_ais.fp8.quantize_mxfp8`)
and MXFP4 (:func:`nemo_ais.fp8.quantize_mxfp4`). For each weight shape and input dtype it
times, interleaved within every repeat (the machine is shared), median of ``--repeats``
after one warm-up:

* ``ours``: the public quantizer (on CPU: the fused C++ kernel of
  :mod:`nemo_ais.formats.cpu_kernel`; on a GPU: the banded PyTorch path);
* ``reference``: the straightforward vectorised formulation of the same rule (FP8:
  ``reference_quantize`` below, the shape of DeepGEMM's and NeMo-RL's per-block casts;
  the block-scaled formats: the ``quantize_*_reference`` kept next to each fast path),
  checked bit-equal to ours (first mismatch reported);
* ``copy_``: ``y.copy_(x)`` into a preallocated buffer: the memory-bandwidth bound.

Throughput is input bytes / time; the fraction of copy bandwidth is t_copy_ / t_ours
(1.0 = the quantizer runs as fast as one copy of its input).

``--device cuda`` times the same calls on the GPU: CUDA events around each call, a
synchronize before it and a 256 MiB write in between to flush L2; it adds the bytes the
quantizer moves (input read + outputs written) per second against the card's nominal HBM
bandwidth (``HBM_GBPS``, by device name; ``copy_`` gives the achievable bound). It records
section ``quant_cuda`` instead of ``quant``.

    THP_MEM_ALLOC_ENABLE=1 python -m benchmarks.bench_quant [--threads 1] [--repeats 3] [--formats fp8 nvfp4 ...] [--no-record]
    python -m benchmarks.bench_quant --device cuda --repeats 20
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks._record import record_section
from benchmarks._timing import cpu_timer, cuda_timer, interleaved_medians
from nemo_ais.formats.mxfp4 import quantize_mxfp4_reference
from nemo_ais.formats.mxfp8 import quantize_mxfp8_reference
from nemo_ais.formats.nvfp4 import quantize_nvfp4_reference
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4

SHAPES = [(4096, 4096), (14336, 4096)]  # Llama/Qwen attention; Llama-3-8B MLP
DTYPES = [torch.float32, torch.bfloat16]


def reference_quantize(x: torch.Tensor, block: int = 128, eps: float = 1e-4):
    """Vectorised reference, family "reciprocal": per 128x128 tile s = amax / 448, q = x * (1/s).

    The straightforward formulation: view ``[N, K]`` as ``[N/b, b, K/b, b]`` tiles, amax
    over each tile, scale, clamp to the E4M3 range, cast. N and K must be multiples of b.
    """
    n, k = x.shape
    if n % block or k % block:
        raise ValueError(f"reference_quantize: shape {list(x.shape)} is not a multiple of {block}")
    tiles = x.float().reshape(n // block, block, k // block, block)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True).clamp_min(eps)
    # a tensor divisor: CUDA divides by a Python scalar as a multiply by its fp32
    # reciprocal (two roundings); the quantizers divide once on every device
    scale = amax / torch.full_like(amax, 448.0)
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


# Nominal HBM bandwidth (GB/s) by device-name substring (vendor data sheets, SXM parts).
HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "GB200": 8000.0, "A100": 2039.0}
_L2_FLUSH_BYTES = 256 << 20


def _hbm_peak(device: torch.device) -> tuple[str, float | None]:
    """Device name and its nominal HBM GB/s (None: not in ``HBM_GBPS``)."""
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in sorted(HBM_GBPS.items(), key=lambda kv: -len(kv[0])) if k in name), None)
    return name, peak


def _bytes(t: torch.Tensor | list[torch.Tensor]) -> int:
    parts = t if isinstance(t, list) else [t]
    return sum(p.numel() * p.element_size() for p in parts)


def _row(fmt, shape, dtype, t, gb, load, moved_gb=None, peak=None) -> str:
    """One table row; CUDA rows add the bytes moved per second against the HBM peak."""
    cells = [
        fmt,
        f"{shape[0]}x{shape[1]}",
        str(dtype).removeprefix("torch."),
        f"{t['ours'] * 1e3:.2f}",
        f"{gb / t['ours']:.2f}",
        f"{t['reference'] * 1e3:.2f}",
        f"**{t['ours'] / t['reference']:.2f}**",
        f"{t['copy_'] * 1e3:.2f}",
        f"{gb / t['copy_']:.2f}",
        f"**{t['copy_'] / t['ours']:.2f}**",
    ]
    if moved_gb is None:
        cells.append(f"{load:.1f}")
    else:
        moved = moved_gb / t["ours"]
        cells += [f"{moved:.0f}", "-" if peak is None else f"**{moved / peak:.2f}**"]
    return "| " + " | ".join(cells) + " |"


def cpu_limits(repeats: int, timer, device: torch.device) -> tuple[str, list[dict[str, float]]]:
    """What bounds a CPU quantizer's fraction of copy_ bandwidth, measured side by side.

    * ``cast``: ``q8.copy_(x)``, PyTorch's fp32 -> float8_e4m3fn conversion into a
      preallocated output: one pass of it is what an eager composition pays for the codes;
    * ``fresh output``: ``torch.empty(shape, uint8).fill_(1)``: allocating and first
      touching the 1-byte output every quantizer returns (page faults for a block glibc
      maps fresh: above its 32 MiB mmap threshold, unless PyTorch's
      ``THP_MEM_ALLOC_ENABLE=1`` backs it with huge pages).
    """
    rows = ["| shape | copy_ ms | fp32 -> E4M3 cast ms | copy_ / cast | fresh 1-byte output ms |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    times = []
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)
        y, q8 = torch.empty_like(x), torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        t = interleaved_medians(
            {
                "copy_": lambda x=x, y=y: y.copy_(x),
                "cast": lambda x=x, q=q8: q.copy_(x),
                "fresh": lambda s=shape: torch.empty(s, dtype=torch.uint8).fill_(1),
            },
            repeats,
            timer,
        )
        rows.append(
            f"| {shape[0]}x{shape[1]} | {t['copy_'] * 1e3:.2f} | {t['cast'] * 1e3:.2f} | "
            f"**{t['copy_'] / t['cast']:.2f}** | {t['fresh'] * 1e3:.2f} |"
        )
        times.append(t)
    return "\n".join(rows), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    device = torch.device(args.device)
    timer = cpu_timer
    gpu_name, peak = "", None
    if cuda:
        timer = cuda_timer(torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=device))
        gpu_name, peak = _hbm_peak(device)
    load = [os.getloadavg()[0]]
    head = (
        "| format | shape | dtype | ours ms | ours GB/s | reference ms | ours / reference "
        "| copy_ ms | copy_ GB/s | fraction of copy_ bandwidth |"
    )
    head += " moved GB/s | fraction of HBM peak |" if cuda else " load |"
    rows = [head, "|---|---|---|" + "---:|" * (head.count("|") - 4)]
    mismatches: list[str] = []
    for fmt in args.formats:
        ours, reference = FORMATS[fmt]
        for shape in SHAPES:
            for dtype in DTYPES:
                x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
                x = x.to(device)
                out = _fields(ours(x))
                for a, b in zip(out, _fields(reference(x)), strict=True):
                    if not torch.equal(a, b):  # reported, not timed: a wrong result has no speed
                        print(f"{fmt} {list(shape)} {dtype}: " + _first_mismatch(a, b), flush=True)
                        mismatches.append(f"{fmt} {list(shape)} {dtype}")
                y = torch.empty_like(x)
                t = interleaved_medians(
                    {
                        "ours": lambda x=x, f=ours: f(x),
                        "reference": lambda x=x, f=reference: f(x),
                        "copy_": lambda x=x, y=y: y.copy_(x),
                    },
                    args.repeats,
                    timer,
                )
                del y
                load.append(os.getloadavg()[0])
                gb = _bytes(x) / 1e9
                moved = (_bytes(x) + _bytes(out)) / 1e9 if cuda else None
                rows.append(_row(fmt, shape, dtype, t, gb, load[-1], moved, peak))
                print(rows[-1], flush=True)
    common = (
        f"turn within each of {args.repeats} repeats after a warm-up (median). GB/s = input "
        "bytes / time. References: FP8, the straightforward vectorised formulation (reshape "
        "into 128x128 tiles, amax, scale = amax / 448, multiply by 1/scale, clamp, cast to "
        "E4M3); NVFP4 / MXFP8 / MXFP4, the short `quantize_*_reference` of each module (whole "
        "tensor at once, E2M1 by seven threshold comparisons); every output checked bit-equal "
        "to ours first. Fraction of copy_ bandwidth = t(y.copy_(x)) / t(ours): 1.0 would be "
        "a quantizer as fast as one copy of its input into a preallocated buffer (the "
        "memory-bandwidth bound)."
    )
    if cuda:
        nominal = "not in HBM_GBPS" if peak is None else f"{peak:.0f} GB/s nominal"
        body = "\n".join(rows) + (
            f"\n\n{gpu_name} ({nominal}); ours, the reference and `y.copy_(x)` timed with "
            "CUDA events (synchronized, L2 flushed by a 256 MiB write before each call) in "
            + common
            + " Moved GB/s = (input bytes + output bytes) / t(ours); fraction of HBM peak = "
            "that / the nominal bandwidth."
        )
    else:
        body = "\n".join(rows) + (
            f"\n\n{args.threads} torch thread(s); ours, the reference and `y.copy_(x)` timed "
            "in " + common + " The GPU numbers (GB/s against HBM bandwidth) are section `quant_cuda`. "
            "Load average (1 min): "
            f"{min(load):.1f} to {max(load):.1f} on {os.cpu_count()} cores (shared machine: "
            "the ratios, measured side by side, are the meaningful numbers)."
        )
    limits = None if cuda else cpu_limits(args.repeats, timer, device)
    if limits is not None:
        bound, times = limits
        print(bound)
        cast = sorted({f"{t['cast'] / t['copy_']:.1f}" for t in times}, key=float)
        fresh = times[-1]["fresh"] / times[-1]["copy_"]  # the largest shape
        body += (
            "\n\nOn CPU every format is a fused C++ kernel (`nemo_ais/formats/cpu_kernel.py`, "
            "compiled on first use, bit-equal to the PyTorch path: "
            "tests/unit/test_fp8_cpu_kernel.py). What bounds the fractions, measured in the same "
            f"run (below): PyTorch's fp32 -> E4M3 conversion alone takes {'-'.join(cast[:: len(cast) - 1 or 1])}x a copy, "
            "which an eager composition (the PyTorch paths, where no kernel can be built) pays on top "
            "of its own passes; the kernels are compute-bound (bf16 input, whose copy_ moves half the bytes, "
            "reaches about half the fp32 fraction; the 4-bit formats pay a division or multiply "
            "and seven comparisons per element and the nibble packing); and every "
            "quantizer returns a freshly allocated output, whose first touch (page faults) costs "
            f"{fresh:.2f}x the copy_ of the {SHAPES[-1][0]}x{SHAPES[-1][1]} weight here. "
            f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')} in this "
            "run (PyTorch's switch for huge-page CPU allocations of 2 MiB and more).\n\n" + bound
        )
    if mismatches:
        raise SystemExit("not bit-equal to the reference (nothing recorded): " + ", ".join(mismatches))
    print(body)
    if not args.no_record:
        name, title = ("quant_cuda", "GPU") if cuda else ("quant", "CPU")
        record_section(name, f"Quantizer throughput ({title}): FP8, NVFP4, MXFP8, MXFP4", body)


if __name__ == "__main__":
    main()
