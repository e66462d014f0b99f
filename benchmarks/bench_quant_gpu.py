# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Fused GPU quantizers: Triton kernels and Inductor against the current code and copy_.

Per format (FP8 128x128, MXFP8, NVFP4, MXFP4), weight shape (4096², 14336x4096 and a
Qwen3-30B-A3B TP-2 expert stack [128, 384, 2048]) and dtype (bf16, fp32), timed side by
side in one process on one GPU (CUDA events, L2 flushed by a 256 MiB write before each
call, median of ``--repeats`` after a warm-up):

* ``triton``: :mod:`nemo_ais.kernels.triton_quant` (one launch; experts on the grid);
* ``compiled``: ``torch.compile`` (Inductor) of the short vectorised reference
  (:data:`COMPILABLE`: DeepGEMM's ``per_block_cast_to_fp8`` formulation for FP8);
* ``current``: the public quantizer of :mod:`nemo_ais.fp8` on the GPU as it was, the banded
  PyTorch path (``without_triton``: on CUDA it now dispatches to the Triton kernels);
* ``reference``: the same short reference, eager;
* ``copy_``: ``y.copy_(x)`` of the same tensor (the bandwidth bound);
* ``triton graph`` / ``copy_ graph``: the same launches captured once in a CUDA graph and
  replayed (the Triton wrapper without its counter read-back, ``_launches_only``): the GPU's
  work alone, without the host's Python, allocation and launch overhead or the
  synchronization, which ``triton`` includes.

Every Triton output is checked bit-equal to ``current`` first (from a mismatch on, the
run records nothing more); Inductor's bits are reported. First-call times (Triton JIT,
Inductor compile) are stated.

    python -m benchmarks.bench_quant_gpu --repeats 20
"""

from __future__ import annotations

import argparse
import time

import torch

import nemo_ais.kernels.triton_quant as tq
from benchmarks._record import record_section
from benchmarks._timing import cpu_timer, cuda_timer, interleaved_medians
from benchmarks.bench_quant import _L2_FLUSH_BYTES, _hbm_peak
from nemo_ais.formats.dispatch import without_triton
from nemo_ais.formats.grids import (
    E2M1_MAX,
    E4M3_MAX,
    E8M0_BIAS,
    e2m1_codes_reference,
    e8m0_block_exponent,
    pack_nibbles,
)
from nemo_ais.formats.nvfp4 import nvfp4_global_scale
from nemo_ais.fp8 import (
    MXFP4Tensor,
    MXFP8Tensor,
    NVFP4Tensor,
    quantize_blockwise,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
)
from nemo_ais.kernels.triton_quant import (
    _launches_only,
    quantize_blockwise_triton,
    quantize_mxfp4_triton,
    quantize_mxfp8_triton,
    quantize_nvfp4_triton,
)

E4M3_CODES = ("fp8 128x128", "mxfp8")  # formats whose codes are E4M3
SHAPES = [(4096, 4096), (14336, 4096), (128, 384, 2048)]
SMOKE_SHAPES = [(256, 256), (2, 128, 256)]
DTYPES = [torch.bfloat16, torch.float32]
_SIGN = 8


def fp8_compilable(x: torch.Tensor, block: int = 128, eps: float = 1e-4):
    """FP8 128x128, family "reciprocal": DeepGEMM's ``per_block_cast_to_fp8`` formulation.

    ``[..., N, K]`` (N, K multiples of 128) viewed as tiles, amax per tile, ``s = amax /
    448``, ``q = x * (1 / s)`` clamped and cast; the leading dims (experts) vectorised.
    """
    *lead, n, k = x.shape
    tiles = x.float().reshape(*lead, n // block, block, k // block, block)
    amax = tiles.abs().amax(dim=(-3, -1), keepdim=True).clamp_min(eps)
    scale = amax / torch.full_like(amax, E4M3_MAX)  # one rounding (tensor / tensor)
    q = (tiles * torch.reciprocal(scale)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), scale.reshape(*lead, n // block, k // block)


def _pow2(expo: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(expo, dtype=torch.float32), expo)


def mxfp8_compilable(x: torch.Tensor) -> MXFP8Tensor:
    """``quantize_mxfp8_reference`` without its input checks (no host sync to break a graph)."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    expo = e8m0_block_exponent(blocks.abs().amax(-1), E4M3_MAX)
    scaled = blocks * _pow2(-expo).unsqueeze(-1)
    data = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(x.shape)
    return MXFP8Tensor(data, (expo + E8M0_BIAS).to(torch.uint8))


def mxfp4_compilable(x: torch.Tensor) -> MXFP4Tensor:
    """``quantize_mxfp4_reference`` (ties to even) without its input checks."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    expo = e8m0_block_exponent(blocks.abs().amax(-1), E2M1_MAX)
    y = blocks * _pow2(-expo).unsqueeze(-1)
    code = e2m1_codes_reference(y.abs()) | ((blocks < 0).to(torch.uint8) * _SIGN)
    return MXFP4Tensor(pack_nibbles(code.reshape(x.shape)), (expo + E8M0_BIAS).to(torch.uint8))


def nvfp4_compilable(x: torch.Tensor) -> NVFP4Tensor:
    """``quantize_nvfp4_reference`` (1x16, amax = max |x|) without its input checks."""
    xf = x.float()
    s_g = nvfp4_global_scale(xf.abs().amax())
    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    r = blocks.abs().amax(-1) / (s_g * E2M1_MAX)
    r = torch.where(r == 0, torch.ones_like(r), r).clamp(2.0**-9, E4M3_MAX)
    block_scale = r.to(torch.float8_e4m3fn)
    d = (block_scale.float() * s_g).unsqueeze(-1)
    y = blocks / torch.where(d == 0, torch.full_like(d, float("inf")), d)
    code = e2m1_codes_reference(y.abs()) | ((blocks < 0).to(torch.uint8) * _SIGN)
    return NVFP4Tensor(pack_nibbles(code.reshape(x.shape)), block_scale, s_g)


def pytorch_path(quantize):
    """``quantize`` with the Triton dispatch off: the banded PyTorch path on the GPU."""

    def run(x):
        with without_triton():
            return quantize(x)

    return run


# format -> (triton, current, short reference)
COMPILABLE = {
    "fp8 128x128": (quantize_blockwise_triton, pytorch_path(quantize_blockwise), fp8_compilable),
    "mxfp8": (quantize_mxfp8_triton, pytorch_path(quantize_mxfp8), mxfp8_compilable),
    "nvfp4": (quantize_nvfp4_triton, pytorch_path(quantize_nvfp4), nvfp4_compilable),
    "mxfp4": (quantize_mxfp4_triton, pytorch_path(quantize_mxfp4), mxfp4_compilable),
}


def fields(q) -> list[torch.Tensor]:
    """The output tensors of a quantizer, as comparable byte / bit views."""
    parts = q if isinstance(q, tuple) else tuple(vars(q).values())
    return [p.contiguous().view(torch.uint8 if p.element_size() == 1 else torch.int32) for p in parts]


def mismatch(got, want) -> str | None:
    """None if every output is bit-equal, else the first differing index and both values."""
    for i, (a, b) in enumerate(zip(fields(got), fields(want), strict=True)):
        if a.shape != b.shape:
            return f"output {i}: shape {list(a.shape)} vs {list(b.shape)}"
        diff = (a != b).nonzero()
        if diff.numel():
            idx = tuple(diff[0].tolist())
            return f"output {i}: {diff.shape[0]} differ, first at {idx}: {a[idx]} vs {b[idx]}"
    return None


def first_call(fn, x, sync) -> float:
    """Seconds of the first call (JIT / compile included)."""
    sync()
    t0 = time.perf_counter()
    fn(x)
    sync()
    return time.perf_counter() - t0


def graphed(fn, x):
    """``fn(x)``'s launches captured once in a CUDA graph: its replay (None: capture failed)."""
    try:
        with _launches_only():
            fn(x)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(x)
    except RuntimeError as err:
        print(f"CUDA graph capture failed: {type(err).__name__}: {err}", flush=True)
        return None
    return graph.replay


def _nbytes(parts: list[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--formats", nargs="+", default=list(COMPILABLE), choices=COMPILABLE)
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check this script on CPU: tiny shapes, Triton's interpreter, eager "
        "'compiled', nothing recorded (no GPU needed)",
    )
    parser.add_argument(
        "--compile-dtypes",
        nargs="+",
        default=["bfloat16", "float32"],
        help="dtypes whose rows also time torch.compile (each shape and dtype compiles)",
    )
    parser.add_argument("--compile-shapes", nargs="+", default=None, help="e.g. 14336x4096")
    args = parser.parse_args()
    shapes = SHAPES
    if args.smoke:
        device, timer, sync = torch.device("cpu"), cpu_timer, lambda: None
        gpu_name, peak, shapes, args.no_record = "CPU (smoke)", None, SMOKE_SHAPES, True
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA device (CPU: benchmarks.bench_quant_compile, --smoke)")
        device = torch.device("cuda")
        timer = cuda_timer(torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=device))
        gpu_name, peak = _hbm_peak(device)
        sync = torch.cuda.synchronize
    head = (
        "| format | shape | dtype | triton ms | compiled ms | current ms | reference ms | "
        "copy_ ms | triton / copy_ bandwidth | compiled / copy_ | current / copy_ | "
        "triton moved GB/s | triton / HBM peak | current / triton | compiled bits = current | "
        "triton graph ms | copy_ graph ms | graph triton / copy_ bandwidth | "
        "graph, integer E4M3 ms |"
    )
    rows = [head, "|---|---|---|" + "---:|" * (head.count("|") - 4)]
    firsts, problems, notes = [], [], []

    def write() -> str:
        """The section's body so far; recorded after every row unless a row mismatched."""
        body = "\n".join(rows) + (
            f"\n\n{gpu_name}; Triton {_triton_version()}. Each column timed with CUDA events "
            f"(synchronized, L2 flushed by a 256 MiB write before each call), in turn within each "
            f"of {args.repeats} repeats after a warm-up (median). `triton`: "
            "nemo_ais.kernels.triton_quant, one launch per weight (an expert stack [128, 384, "
            "2048], Qwen3-30B-A3B's gate_proj of one layer on a TP-2 rank, is one launch); "
            "`compiled`: torch.compile (Inductor) of the short vectorised reference (FP8: "
            "DeepGEMM's per_block_cast_to_fp8 formulation, family reciprocal; the others: the module "
            "references without their input checks); `current`: the nemo_ais.fp8 quantizer on "
            "the GPU with the Triton dispatch off (its PyTorch path); `reference`: the short reference, eager; `copy_`: y.copy_(x). "
            "`triton graph` / `copy_ graph`: the same launches captured in a CUDA graph and replayed "
            "(the wrapper without its 4-byte counter read-back): the GPU's work without the host's "
            "overhead and synchronization; `graph, integer E4M3`: the FP8 and MXFP8 kernels captured "
            "with the integer E4M3 encoder instead of the GPU's cvt instruction (the interpreter's "
            "path; same bits). X / copy_ bandwidth = t(copy_) / t(X). Moved GB/s = (input + output bytes) / "
            "t(triton). Every triton output was checked bit-equal to `current` first (from a "
            "mismatch on, nothing more is recorded); the compiled outputs' comparison is the last column.\n\nFirst call, seconds (Triton JIT incl. autotune-free compile / Inductor "
            "compile; nan: not compiled):\n\n" + "\n".join(f"- {f}" for f in firsts)
        )
        if notes:
            body += "\n\nCompiled outputs that differ from `current`:\n\n" + "\n".join(f"- {n}" for n in notes)
        if not args.no_record and not problems:
            record_section("quant_fused_cuda", "Fused quantizers (GPU): Triton and Inductor against copy_", body)
        return body

    for fmt in args.formats:
        triton_fn, current, short = COMPILABLE[fmt]
        compiled = short if args.smoke else torch.compile(short, dynamic=False)
        for shape in shapes:
            for dtype in DTYPES:
                g = torch.Generator(device=device).manual_seed(0)
                x = (torch.randn(shape, generator=g, device=device) * 0.02).to(dtype)
                shape_s = "x".join(str(d) for d in shape)
                with_compile = str(dtype).removeprefix("torch.") in args.compile_dtypes and (
                    args.compile_shapes is None or shape_s in args.compile_shapes
                )
                t_jit = first_call(triton_fn, x, sync)
                t_compile = first_call(compiled, x, sync) if with_compile else float("nan")
                firsts.append(f"{fmt} {list(shape)} {dtype}: {t_jit:.2f} / {t_compile:.1f}")
                want = current(x)
                bad = mismatch(triton_fn(x), want)
                if bad:
                    problems.append(f"triton {fmt} {list(shape)} {dtype}: {bad}")
                    print(problems[-1], flush=True)
                compiled_bad = "not compiled"
                if with_compile:  # Inductor's bits: reported, not fatal
                    compiled_bad = mismatch(compiled(x), want)
                    if compiled_bad:
                        print(f"compiled {fmt} {shape_s} {dtype}: {compiled_bad}", flush=True)
                y = torch.empty_like(x)
                fns = {
                    "triton": lambda x=x, f=triton_fn: f(x),
                    "current": lambda x=x, f=current: f(x),
                    "reference": lambda x=x, f=short: f(x),
                    "copy_": lambda x=x, y=y: y.copy_(x),
                }
                if with_compile:
                    fns["compiled"] = lambda x=x, f=compiled: f(x)
                if not args.smoke:
                    replays = [
                        ("triton graph", graphed(triton_fn, x)),
                        ("copy_ graph", graphed(lambda x, y=y: y.copy_(x), x)),
                    ]
                    if fmt in E4M3_CODES:  # the same kernel with the integer E4M3 encoder
                        tq._HW_E4M3 = False
                        try:
                            replays.append(("int e4m3 graph", graphed(triton_fn, x)))
                        finally:
                            tq._HW_E4M3 = True
                    for name, replay in replays:
                        if replay is not None:
                            fns[name] = replay
                t = interleaved_medians(fns, args.repeats, timer)
                for name in ("triton graph", "copy_ graph", "int e4m3 graph"):
                    t.setdefault(name, float("nan"))
                t.setdefault("compiled", float("nan"))
                moved = (_nbytes([x]) + _nbytes(fields(want))) / 1e9 / t["triton"]
                comp = "-" if not with_compile else f"{t['copy_'] / t['compiled']:.2f}"
                bits = "-" if not with_compile else ("yes" if compiled_bad is None else "NO")
                rows.append(
                    f"| {fmt} | {shape_s} | {str(dtype).removeprefix('torch.')} | "
                    f"{t['triton'] * 1e3:.3f} | {t['compiled'] * 1e3:.3f} | "
                    f"{t['current'] * 1e3:.3f} | {t['reference'] * 1e3:.3f} | "
                    f"{t['copy_'] * 1e3:.3f} | **{t['copy_'] / t['triton']:.2f}** | "
                    f"{comp} | {t['copy_'] / t['current']:.2f} | "
                    f"{moved:.0f} | {'-' if peak is None else f'{moved / peak:.2f}'} | "
                    f"**{t['current'] / t['triton']:.1f}x** | {bits} | "
                    f"{t['triton graph'] * 1e3:.3f} | {t['copy_ graph'] * 1e3:.3f} | "
                    f"**{t['copy_ graph'] / t['triton graph']:.2f}** | "
                    f"{t['int e4m3 graph'] * 1e3:.3f} |"
                )
                if with_compile and compiled_bad:
                    notes.append(f"{fmt} {shape_s} {dtype}: compiled {compiled_bad}")
                print(rows[-1], flush=True)
                write()
                del x, y
    body = write()
    if problems:
        raise SystemExit("not bit-equal (nothing recorded):\n" + "\n".join(problems))
    print(body)


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    main()
