# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Fused CPU kernels of the quantizers and the FP8 activation fake quant, built on first use.

PyTorch's eager fp32 -> E4M3 cast alone costs 2-2.5x a copy on CPU (docs/benchmarks.md "quant"), so each format's rule
runs in one C++ loop per row (``csrc/quantize_cpu.cpp``), bit-equal to the PyTorch paths. Built with
``torch.utils.cpp_extension.load`` as PyTorch operators (``torch.ops.<build name>.*``, ATen headers only); without a
compiler or with ``NEMO_AIS_CPU_KERNEL=0`` the PyTorch paths run (which tensors take the kernels:
:mod:`nemo_ais.formats.dispatch`). A block with NaN / inf is reported and the PyTorch path raises. One thread (no second
OpenMP runtime).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE_FILE = Path(__file__).with_name("csrc") / "quantize_cpu.cpp"
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
        raise ValueError(f"NEMO_AIS_CPU_KERNEL_WAIT_S: expected a number of seconds >= 0, got {raw!r}")
    return wait


def _cpu_fingerprint() -> str:
    """12 hex digits of CPU (model, ISA) and source: a shared cache loads no foreign build."""
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
    """Hold the build directory exclusively (``flock``) for one build or load.

    A killed ``cpp_extension`` build leaves its ``lock`` file and every later process would wait
    forever; holding our flock proves no live build, so a stale ``lock`` is removed. A live
    build elsewhere is waited for ``wait_s`` seconds, then :class:`TimeoutError`.
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
            logger.warning("nemo_ais.formats: removed the build lock %s left by an interrupted build", stale)
        yield
    finally:
        os.close(fd)  # releases the flock


@functools.cache
def cpu_kernel():
    """The built operators (``torch.ops.<build name>``); None if switched off or unbuildable."""
    if os.environ.get("NEMO_AIS_CPU_KERNEL", "1") == "0":
        return None
    wait_s = _build_wait_s()  # a malformed value is the user's error, raised as such
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        name = f"nemo_ais_fp8_cpu_{_cpu_fingerprint()}"
        build_dir = _get_build_directory(name, verbose=False)
        native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
        with _build_guard(build_dir, wait_s):
            # the build reads its copy of the source: build.ninja names one path whichever install (checkout, wheel)
            # shares this cache, so none of them rebuilds it
            source = Path(build_dir) / _SOURCE_FILE.name
            text = _SOURCE_FILE.read_text()
            if not source.is_file() or source.read_text() != text:
                source.write_text(text)
            if not list(Path(build_dir).glob(f"{name}*.so")):
                logger.warning(
                    "nemo_ais.formats: building the fused CPU quantizer in %s (first use on this "
                    "machine, about 20 s on 2 cores; later runs load it)",
                    build_dir,
                )
            # registers the operators as it loads (no duplicate namespace, which would abort: cpp_extension renames a
            # second build of one name "<name>_v1"); not traceable by torch.compile, which no quantizer goes through
            library = load(
                name=name,
                sources=[str(source)],
                extra_cflags=["-O3", *native, "-fno-fast-math"],
                is_python_module=False,
                verbose=False,
            )
        ops = getattr(torch.ops, Path(library).stem)  # the namespace is the library's name
        ops.quantize_blockwise.default  # noqa: B018 -- an empty namespace raises here
        return ops
    except Exception as err:  # no compiler / ninja / headers / fcntl, or a build still
        # running elsewhere past the bound: the PyTorch path is exact too
        logger.warning(
            "nemo_ais.formats: the fused CPU quantizer could not be built (%s); using the PyTorch "
            "path (same bits, slower). Set NEMO_AIS_CPU_KERNEL=0 to skip the attempt.",
            err,
        )
        return None
