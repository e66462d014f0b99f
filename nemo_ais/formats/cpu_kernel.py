# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Fused CPU kernels for the four weight quantizers, compiled on first use.

The PyTorch paths of :mod:`nemo_ais.formats` (FP8 blockwise, MXFP8, NVFP4, MXFP4) are a handful
of ops per band of rows; PyTorch's own fp32 -> E4M3 conversion alone takes 2-2.5x a
same-size copy on CPU (docs/benchmarks.md "quant"), so no composition of eager ops reaches
half of copy_ bandwidth. These kernels run each format's whole rule in one C++ loop per row
(amax, the scale rule, multiply or divide, clamp, rounding, nibble packing), with
branchless round-to-nearest-even E4M3 / E2M1 encoders the compiler vectorises, and are
bit-equal to the PyTorch paths (tests/unit/test_fp8_cpu_kernel.py: every family, eps, UE8M0,
tile shape, tie rule, static amax, fp32 / bf16 / fp16, zero, subnormal and tie values).

The C++ source is ``csrc/quantize_cpu.cpp`` (package data, shipped in the wheel). It is
compiled with ``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ninja) the first time a CPU tensor is quantized, into PyTorch's extension cache, and used
only for contiguous fp32 / bf16 / fp16 CPU input. Where they cannot be built (no compiler)
or are switched off (``NEMO_AIS_CPU_KERNEL=0``) the PyTorch paths run, with the same bits.
A block with NaN / inf makes a kernel report it; the PyTorch path then raises its error.
The kernels run on one thread: the build does not link OpenMP (a second OpenMP runtime
beside PyTorch's is not worth the risk), so ``at::parallel_for`` runs serially.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from pathlib import Path

import torch

__all__ = ["cpu_kernel", "kernel_for"]

logger = logging.getLogger(__name__)

_SOURCE_FILE = Path(__file__).with_name("csrc") / "quantize_cpu.cpp"
_FUNCTIONS = [
    "quantize_blockwise",
    "quantize_mxfp8",
    "nvfp4_block_amax",
    "nvfp4_encode",
    "quantize_mxfp4",
]


_CPUINFO_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU part")
_GUARD_FILE = "nemo_ais.flock"  # beside PyTorch's own ``lock`` in the build directory


def _build_wait_s() -> float:
    """Seconds to wait for another live process's build (``NEMO_AIS_CPU_KERNEL_WAIT_S``)."""
    raw = os.environ.get("NEMO_AIS_CPU_KERNEL_WAIT_S", "300")
    try:
        wait = float(raw)
    except ValueError:
        wait = float("nan")
    if not wait >= 0:  # NaN too
        raise ValueError(
            f"NEMO_AIS_CPU_KERNEL_WAIT_S: expected a number of seconds >= 0, got {raw!r}"
        )
    return wait


def _cpu_fingerprint() -> str:
    """12 hex digits of the CPU (model and ISA features, x86 or Arm) and the kernel source.

    The build is tuned for the CPU it runs on (``-march=native`` on x86-64), so its name
    carries them: a cache shared between different machines never loads a foreign build.
    """
    import platform

    info = {platform.machine(), platform.processor()}
    try:
        with open("/proc/cpuinfo") as f:
            info |= {ln.strip() for ln in f if ln.startswith(_CPUINFO_KEYS)}
    except OSError:
        pass
    text = "\n".join(sorted(info)) + _SOURCE_FILE.read_text() + torch.__version__
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _build_guard(build_dir: str, wait_s: float):
    """Hold the build directory exclusively for the duration of one build or load.

    PyTorch's ``load_inline`` serialises builds with a ``lock`` file that a killed build
    leaves behind, and every later process then sleeps on it forever, silently. Every
    nemo_ais process takes an ``flock`` on ``nemo_ais.flock`` first: the kernel drops an
    flock when its holder dies, so holding it proves that no live nemo_ais process is
    building here, and any ``lock`` file present was left by an interrupted build and is
    removed. A live build elsewhere is waited for at most ``wait_s`` seconds, with a message;
    past that :class:`TimeoutError` is raised (the caller falls back to the PyTorch path).
    """
    import fcntl
    import time

    os.makedirs(build_dir, exist_ok=True)
    fd = os.open(os.path.join(build_dir, _GUARD_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another process has been building the CPU quantizer in {build_dir} "
                        f"for over {wait_s:g} s (NEMO_AIS_CPU_KERNEL_WAIT_S)"
                    ) from None
                if not told:
                    logger.warning(
                        "nemo_ais.formats: waiting (at most %g s) for another process that is "
                        "building the fused CPU quantizer in %s",
                        wait_s,
                        build_dir,
                    )
                    told = True
                time.sleep(0.25)
        stale = os.path.join(build_dir, "lock")
        if os.path.exists(stale):
            os.remove(stale)
            logger.warning(
                "nemo_ais.formats: removed the build lock %s left by an interrupted build", stale
            )
        yield
    finally:
        os.close(fd)  # releases the flock


@functools.cache
def cpu_kernel():
    """The compiled extension, or None (switched off, or it could not be built: logged once)."""
    if os.environ.get("NEMO_AIS_CPU_KERNEL", "1") == "0":
        return None
    wait_s = _build_wait_s()  # a malformed value is the user's error, raised as such
    try:
        import platform

        from torch.utils.cpp_extension import _get_build_directory, load_inline

        name = f"nemo_ais_fp8_cpu_{_cpu_fingerprint()}"
        build_dir = _get_build_directory(name, verbose=False)
        native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
        with _build_guard(build_dir, wait_s):
            if not os.path.exists(os.path.join(build_dir, f"{name}.so")):
                logger.warning(
                    "nemo_ais.formats: building the fused CPU quantizer in %s (first use on this "
                    "machine, about a minute on 2 cores; later runs load it)",
                    build_dir,
                )
            return load_inline(
                name=name,
                cpp_sources=_SOURCE_FILE.read_text(),
                functions=_FUNCTIONS,
                extra_cflags=["-O3", *native, "-fno-fast-math"],
                verbose=False,
            )
    except Exception as err:  # no compiler / ninja / headers / fcntl, or a build still
        # running elsewhere past the bound: the PyTorch path is exact too
        logger.warning(
            "nemo_ais.formats: the fused CPU quantizer could not be built (%s); using the PyTorch "
            "path (same bits, slower). Set NEMO_AIS_CPU_KERNEL=0 to skip the attempt.",
            err,
        )
        return None


def kernel_for(x: torch.Tensor):
    """The extension if its kernels apply to ``x``, else None.

    They apply to a non-empty, contiguous fp32 / bf16 / fp16 CPU tensor, when the
    extension is built (:func:`cpu_kernel`).
    """
    if (
        x.device.type != "cpu"
        or x.dtype not in (torch.float32, torch.bfloat16, torch.float16)
        or not x.is_contiguous()
        or x.numel() == 0
    ):
        return None
    return cpu_kernel()
