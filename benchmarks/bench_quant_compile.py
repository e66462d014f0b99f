# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""CPU quantizers: ``torch.compile`` of the short references against the C++ kernel and PyTorch.

Per format (FP8 128x128, MXFP8, NVFP4, MXFP4), shape and dtype, timed side by side in one
process (median of ``--repeats`` after a warm-up):

* ``compiled``: ``torch.compile`` (Inductor, C++/OpenMP codegen) of the short vectorised
  reference of :data:`benchmarks.bench_quant_gpu.COMPILABLE` (FP8: DeepGEMM's
  ``per_block_cast_to_fp8`` formulation);
* ``c++``: the public quantizer, i.e. the hand C++ kernel of :mod:`nemo_ais.formats.cpu_kernel`;
* ``pytorch``: the same public quantizer with the kernel switched off (banded PyTorch ops);
* ``copy_``: ``y.copy_(x)`` (the memory-bandwidth bound).

Compiled outputs are compared bit for bit with the C++ kernel's (reported in the table);
the first call's time (the compile) is stated.

    THP_MEM_ALLOC_ENABLE=1 python -m benchmarks.bench_quant_compile --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from unittest import mock

import torch

import nemo_ais.formats.fp8_block
import nemo_ais.formats.mxfp4
import nemo_ais.formats.mxfp8
import nemo_ais.formats.nvfp4
from benchmarks._record import record_section
from benchmarks._timing import cpu_timer, interleaved_medians
from benchmarks.bench_quant_gpu import COMPILABLE, mismatch

SHAPES = [(4096, 4096), (14336, 4096)]
DTYPES = [torch.float32, torch.bfloat16]
_KERNEL_USERS = (nemo_ais.formats.fp8_block, nemo_ais.formats.mxfp8, nemo_ais.formats.nvfp4, nemo_ais.formats.mxfp4)


@contextlib.contextmanager
def pytorch_path():
    """The public quantizers with the C++ kernel switched off (their PyTorch path)."""
    with contextlib.ExitStack() as stack:
        for module in _KERNEL_USERS:
            stack.enter_context(mock.patch.object(module, "kernel_for", lambda *_: None))
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=list(COMPILABLE), choices=COMPILABLE)
    parser.add_argument("--shapes", nargs="+", default=["4096x4096", "14336x4096"])
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes]
    head = (
        "| format | shape | dtype | compiled ms | c++ ms | pytorch ms | copy_ ms | "
        "compiled / copy_ bandwidth | c++ / copy_ | pytorch / copy_ | compiled / c++ time | "
        "first call s | compiled bits = c++ |"
    )
    rows = [head, "|---|---|---|" + "---:|" * (head.count("|") - 5) + "---|"]
    load = [os.getloadavg()[0]]
    for fmt in args.formats:
        _, current, short = COMPILABLE[fmt]
        compiled = torch.compile(short)
        for shape in shapes:
            for dtype in DTYPES:
                x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
                t0 = time.perf_counter()
                got = compiled(x)
                t_first = time.perf_counter() - t0
                bad = mismatch(got, current(x))
                y = torch.empty_like(x)

                def torch_path(x=x, f=current):
                    with pytorch_path():
                        return f(x)

                t = interleaved_medians(
                    {
                        "compiled": lambda x=x, f=compiled: f(x),
                        "c++": lambda x=x, f=current: f(x),
                        "pytorch": torch_path,
                        "copy_": lambda x=x, y=y: y.copy_(x),
                    },
                    args.repeats,
                    cpu_timer,
                )
                load.append(os.getloadavg()[0])
                c = t["copy_"]
                rows.append(
                    f"| {fmt} | {shape[0]}x{shape[1]} | {str(dtype).removeprefix('torch.')} | "
                    f"{t['compiled'] * 1e3:.1f} | {t['c++'] * 1e3:.1f} | "
                    f"{t['pytorch'] * 1e3:.1f} | {c * 1e3:.1f} | **{c / t['compiled']:.2f}** | "
                    f"**{c / t['c++']:.2f}** | {c / t['pytorch']:.2f} | "
                    f"{t['compiled'] / t['c++']:.2f} | {t_first:.1f} | "
                    f"{'yes' if bad is None else 'NO: ' + bad} |"
                )
                print(rows[-1], flush=True)
    body = "\n".join(rows) + (
        f"\n\n{args.threads} torch thread(s); compiled, c++, pytorch and `y.copy_(x)` timed in "
        f"turn within each of {args.repeats} repeats after a warm-up (median). `compiled`: "
        "torch.compile (Inductor's C++ codegen) of the short vectorised reference (FP8: "
        "DeepGEMM's per_block_cast_to_fp8 formulation, family reciprocal; NVFP4 / MXFP8 / MXFP4: the "
        "module references without their input checks); `c++`: the public quantizer, which "
        "runs the hand C++ kernel; `pytorch`: the same with the kernel switched off. "
        "X / copy_ = t(copy_) / t(X). First call: the compiled function's first call for "
        "that shape and dtype (Inductor compile; a second shape may recompile once with "
        "dynamic shapes). Load average (1 min): "
        f"{min(load):.1f} to {max(load):.1f} on {os.cpu_count()} cores (shared machine: the "
        "ratios, measured side by side, are the meaningful numbers). "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}."
    )
    print(body)
    if not args.no_record:
        record_section(
            "quant_compiled_cpu", "Compiled references against the C++ kernel (CPU): FP8, NVFP4, MXFP8, MXFP4", body
        )


if __name__ == "__main__":
    main()
