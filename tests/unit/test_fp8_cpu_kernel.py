# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The fused CPU kernel of the blockwise FP8 quantizer gives the PyTorch path's bits.

``nemo_ais.formats.cpu_kernel`` (C++, compiled on first use) against ``_quantize_tiles`` (the
PyTorch path, itself checked against a float64 oracle in test_fp8_quant.py): every code
byte and every scale bit, for every family, eps (incl. TE's eps = 0), UE8M0 scales, fp32 /
bf16 / fp16 input, ragged 2-D and 3-D shapes, all-zero, subnormal and huge tiles, and the
E4M3 rounding ties. A NaN still raises the PyTorch path's error.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import nemo_ais.formats.cpu_kernel as cpu_kernel_mod
import nemo_ais.formats.fp8_block as quant
from nemo_ais.formats.cpu_kernel import cpu_kernel
from nemo_ais.fp8 import quantize_blockwise

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_kernel_builds_on_this_machine():
    # CI's machine has gcc and ninja: a build failure there is a failure, not a skip
    ext = cpu_kernel()
    assert ext is not None and hasattr(ext, "quantize_blockwise")


def _torch_path(x, block=(128, 128), family="reciprocal", eps=1e-4, ue8m0=False):
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    return quant._quantize_tiles(x, x3, block, family, eps, ue8m0, "x")


def _kernel(x, block=(128, 128), family="reciprocal", eps=1e-4, ue8m0=False):
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    fused = quant._quantize_fused(x3.contiguous(), block, family, eps, ue8m0)
    assert fused is not None  # the kernel ran and every tile was finite
    return fused


def _assert_same(got, want):
    (qg, sg), (qw, sw) = got, want
    diff = (qg.view(torch.uint8) != qw.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} codes differ, first at {diff[0].tolist()}"
    assert torch.equal(sg.view(torch.int32), sw.view(torch.int32))


def _wide_range(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 4, shape[-1])
    x[..., :3, :] = 0.0  # zero rows
    if shape[-2] > 128 and shape[-1] > 128:
        x[..., :128, :128] = 0.0  # an all-zero tile
    x[..., 5, :] = 1e-42  # fp32 subnormals
    return x


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize(("eps", "ue8m0"), [(1e-4, False), (0.0, False), (1e-4, True), (0.0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kernel_equals_the_torch_path(family, eps, ue8m0, dtype):
    x = _wide_range((300, 1000), seed=1).to(dtype)
    args = dict(family=family, eps=eps, ue8m0=ue8m0)
    _assert_same(_kernel(x, **args), _torch_path(x, **args))


def test_multiplier_ue8m0_keeps_a_tile_below_448_over_flt_max():
    # 448 / amax overflows to inf; TE (compute_scale_from_amax) takes FLT_MAX, then the power
    # of two: m = 2^127. frexp(inf) made it 0.5 and every code 0, while 2e-36 kept them all
    x = torch.full((128, 256), 1e-37)
    x[0, 128] = 2e-36
    args = dict(family="multiplier", eps=0.0, ue8m0=True)
    got = _kernel(x, **args)
    _assert_same(got, _torch_path(x, **args))
    q, s = got  # [1, 128, 256] codes, [1, 1, 2] scales
    assert s.reshape(-1)[0] == 2.0**-127 and bool((q.float() != 0).all())


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (128, 128), (129, 257), (3, 200, 130)])
@pytest.mark.parametrize("block", [(128, 128), (1, 128), (64, 32)])
def test_ragged_shapes_and_blocks(shape, block):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 30
    _assert_same(_kernel(x, block), _torch_path(x, block))


def test_e4m3_rounding_ties_go_to_even():
    # one tile with amax 448 (so m = 1): the midpoints between neighbouring E4M3 values
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[:-1] + codes[1:]) / 2  # exact in fp32
    x = torch.cat([mids, -mids, torch.tensor([448.0])])
    x = torch.nn.functional.pad(x, (0, 256 - x.numel())).view(2, 128)
    _assert_same(_kernel(x, family="multiplier", eps=0.0), _torch_path(x, family="multiplier", eps=0.0))


def test_public_quantizer_uses_the_kernel_and_raises_on_nan(monkeypatch):
    calls = []
    real = quant._quantize_fused
    monkeypatch.setattr(quant, "_quantize_fused", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(256, 256)
    q, s = quantize_blockwise(x)
    assert calls == [1]
    _assert_same((q, s), tuple(t[0] for t in _torch_path(x)))
    x[17, 200] = float("nan")
    with pytest.raises(ValueError, match=r"x: .*NaN"):
        quantize_blockwise(x)


def test_a_library_that_registers_nothing_falls_back(monkeypatch, caplog):
    # the namespace comes from the library cpp_extension loaded; one without the operators
    # (a renamed build, a stale file) is the PyTorch path, not an AttributeError later
    import torch.utils.cpp_extension as cpp

    monkeypatch.setattr(cpp, "load", lambda **kw: "/nowhere/nemo_ais_registers_nothing.so")
    cpu_kernel.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert cpu_kernel_mod.cpu_kernel() is None
        assert "could not be built" in caplog.text and "quantize_blockwise" in caplog.text
    finally:
        monkeypatch.undo()
        cpu_kernel.cache_clear()


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("NEMO_AIS_CPU_KERNEL", "0")
    cpu_kernel.cache_clear()
    try:
        assert cpu_kernel_mod.cpu_kernel() is None
        assert quant._quantize_fused(torch.ones(1, 4, 4), (128, 128), "reciprocal", 1e-4, False) is None
    finally:
        monkeypatch.delenv("NEMO_AIS_CPU_KERNEL")
        cpu_kernel.cache_clear()


def _mxfp8_torch_path(x, monkeypatch):
    import nemo_ais.formats.mxfp8 as mxfp8_mod

    with monkeypatch.context() as m:
        m.setattr(mxfp8_mod, "_quantize_fused", lambda *a: None)
        return mxfp8_mod.quantize_mxfp8(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(300, 1024), (3, 7, 64), (1, 32)])
def test_mxfp8_kernel_equals_the_torch_path(dtype, shape, monkeypatch):
    from nemo_ais.fp8 import quantize_mxfp8

    x = _wide_range(shape if len(shape) > 1 and shape[-2] > 5 else (8, shape[-1]), seed=3)
    x = x.reshape(shape) if x.numel() == torch.Size(shape).numel() else x
    x = x.to(dtype)
    top = 7 if dtype == torch.float16 else 43  # block maxima 448 * 2^k, finite in dtype
    planted = torch.tensor([448.0 * 2.0**k for k in range(-20, top + 1)])
    x.view(-1)[: planted.numel()] = planted.to(dtype)
    got, want = quantize_mxfp8(x), _mxfp8_torch_path(x, monkeypatch)
    assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
    assert torch.equal(got.scale, want.scale)
    assert got.data.shape == x.shape and got.scale.shape == (*x.shape[:-1], x.shape[-1] // 32)


def test_mxfp8_kernel_is_used_and_nan_still_raises(monkeypatch):
    import nemo_ais.formats.mxfp8 as mxfp8_mod

    calls = []
    real = mxfp8_mod._quantize_fused
    monkeypatch.setattr(mxfp8_mod, "_quantize_fused", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(64, 256)
    mxfp8_mod.quantize_mxfp8(x)
    assert calls == [1]
    x[3, 100] = float("inf")
    with pytest.raises(ValueError, match="refusing to quantize NaN/Inf"):
        mxfp8_mod.quantize_mxfp8(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows_per_block", [1, 16])
@pytest.mark.parametrize("amax", [None, "half", 0.0])
@pytest.mark.parametrize("shape", [(300, 1024), (3, 40, 64), (17, 32)])
def test_nvfp4_kernel_equals_the_torch_path(dtype, rows_per_block, amax, shape):
    import nemo_ais.formats.nvfp4 as nv

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(shape, generator=g) * torch.logspace(-6, 3, shape[-1])).to(dtype)
    x.view(-1)[:16] = 0.0  # an all-zero block
    x.view(-1)[-1] = -0.0  # -0.0 -> code 0, not 8
    if amax == "half":  # a static amax below the tensor's: saturation
        amax = float(x.float().abs().max()) * 0.5
    got = nv._quantize_fused(x, amax, rows_per_block, "x")
    want = nv.NVFP4Tensor(*nv._quantize_bands(x, amax, rows_per_block, "x", fake=False))
    assert torch.equal(got.data, want.data)
    assert torch.equal(got.block_scale.view(torch.uint8), want.block_scale.view(torch.uint8))
    assert torch.equal(got.global_scale, want.global_scale)


def test_nvfp4_kernel_is_used_and_nan_still_raises(monkeypatch):
    import nemo_ais.formats.nvfp4 as nv

    calls = []
    real = nv._quantize_fused
    monkeypatch.setattr(nv, "_quantize_fused", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(64, 256)
    nv.quantize_nvfp4(x)
    assert calls == [1]
    x[3, 100] = float("nan")
    with pytest.raises(ValueError, match="refusing to quantize NaN/Inf"):
        nv.quantize_nvfp4(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ties_toward_zero", [False, True])
@pytest.mark.parametrize("shape", [(300, 1024), (3, 7, 64), (1, 32)])
def test_mxfp4_kernel_equals_the_torch_path(dtype, ties_toward_zero, shape, monkeypatch):
    import nemo_ais.formats.mxfp4 as mx4

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(shape, generator=g) * torch.logspace(-30, 4, shape[-1])).to(dtype)
    # block maxima 6 * 2^k and the E2M1 ties (0.25, 0.75, ..., 5) times them
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -3.5, -0.0, 0.0])
    x.view(-1)[: ties.numel()] = (ties * 4.0).to(dtype)
    got = mx4.quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero)
    with monkeypatch.context() as m:
        m.setattr(mx4, "_quantize_fused", lambda *a: None)
        want = mx4.quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero)
    assert torch.equal(got.data, want.data) and torch.equal(got.scale, want.scale)


def test_mxfp4_kernel_nan_still_raises():
    from nemo_ais.fp8 import quantize_mxfp4

    x = torch.randn(8, 64)
    x[1, 2] = float("-inf")
    with pytest.raises(ValueError, match="refusing to quantize NaN/Inf"):
        quantize_mxfp4(x)


@pytest.mark.parametrize(("fmt", "tiny"), [("mxfp8", 2.0**-149), ("mxfp8", 224 * 2.0**-149), ("mxfp4", 3 * 2.0**-149)])
def test_mx_block_whose_ratio_underflows_gets_scale_byte_0(fmt, tiny, monkeypatch):
    # amax / element_max rounds to 0 in fp32: the block is below 2^-127, so E = -127 (the
    # float64 oracle's answer), in the kernel and in the PyTorch path alike
    from block_format_oracles import mx_exponent

    import nemo_ais.formats.mxfp4 as mx4
    import nemo_ais.formats.mxfp8 as mx8

    x = torch.zeros(2, 64)
    x[0, 5], x[1, 40] = tiny, -tiny
    element_max = 448.0 if fmt == "mxfp8" else 6.0
    assert float(torch.tensor(tiny) / element_max) == 0.0 and mx_exponent(tiny, element_max) == -127
    quantize = mx8.quantize_mxfp8 if fmt == "mxfp8" else mx4.quantize_mxfp4
    got = quantize(x)
    with monkeypatch.context() as m:
        m.setattr(mx8, "_quantize_fused", lambda *a: None)
        m.setattr(mx4, "_quantize_fused", lambda *a: None)
        want = quantize(x)
    assert got.scale.tolist() == want.scale.tolist() == [[0, 0], [0, 0]]
    assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))


def _guard_dir(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory("nemo_ais_lock_probe", verbose=False)


def test_a_lock_left_by_a_killed_build_is_removed_at_once(tmp_path, monkeypatch, caplog):
    """PyTorch's ``lock`` is removed as soon as no live nemo_ais process holds the guard."""
    build_dir = _guard_dir(tmp_path, monkeypatch)
    lock = os.path.join(build_dir, "lock")
    open(lock, "w").close()  # fresh: a 10-minute age rule would have kept it
    with caplog.at_level("WARNING"), cpu_kernel_mod._build_guard(build_dir, wait_s=0.0):
        assert not os.path.exists(lock)
    assert "left by an interrupted build" in caplog.text


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_a_live_build_is_waited_for_with_a_bound_and_a_message(tmp_path, monkeypatch, caplog):
    build_dir = _guard_dir(tmp_path, monkeypatch)
    os.makedirs(build_dir, exist_ok=True)
    guard = os.path.join(build_dir, cpu_kernel_mod._GUARD_FILE)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, guard], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = os.path.join(build_dir, "lock")
        open(lock, "w").close()  # the live build's own lock: must stay
        t0 = time.monotonic()
        with (
            caplog.at_level("WARNING"),
            pytest.raises(TimeoutError, match="NEMO_AIS_CPU_KERNEL_WAIT_S"),
            cpu_kernel_mod._build_guard(build_dir, wait_s=1.0),
        ):
            pass
        assert time.monotonic() - t0 < 30
        assert "waiting (at most 1 s) for another process" in caplog.text
        assert os.path.exists(lock)
    finally:
        holder.kill()
        holder.wait()
    with cpu_kernel_mod._build_guard(build_dir, wait_s=5.0):  # the holder died: free at once
        assert not os.path.exists(lock)


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_malformed_wait_bound_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("NEMO_AIS_CPU_KERNEL_WAIT_S", raw)
    with pytest.raises(ValueError, match="NEMO_AIS_CPU_KERNEL_WAIT_S: expected a number"):
        cpu_kernel_mod._build_wait_s()


_BUILD = """
import logging, sys, torch
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
from nemo_ais.formats import cpu_kernel as ck
from nemo_ais.fp8 import quantize_blockwise
ext = ck.cpu_kernel()
print("FROM", ck.__file__, flush=True)
print("LOADED", ext is not None and [p for p in torch.ops.loaded_libraries if ext.name in p][0], flush=True)
x = torch.randn(256, 384, generator=torch.Generator().manual_seed(0))
q, s = quantize_blockwise(x)
print("QSUM", float(q.float().sum()), float(s.sum()), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_after_a_build_killed_midway_builds_and_finishes(tmp_path):
    """Issue 27.1: kill a first build mid-way (as Ctrl-C would); the next run must finish."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "NEMO_AIS_CPU_KERNEL": "1"}
    first = subprocess.Popen(
        [sys.executable, "-c", _BUILD], env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "ext").glob("*/lock")):  # PyTorch's lock: the build began
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the first build never took its lock"
            time.sleep(0.1)
        time.sleep(2.0)  # mid-way through the compile
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the build's ninja and compiler too
        first.wait()
    assert list((tmp_path / "ext").glob("*/lock")), "the killed build must leave its lock"
    second = subprocess.run([sys.executable, "-c", _BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "left by an interrupted build" in second.stdout
    loaded = next(ln for ln in second.stdout.splitlines() if ln.startswith("LOADED"))
    assert loaded.endswith(".so"), second.stdout
    # the same bits as this process (kernel or PyTorch path: bit-equal, tested above)
    x = torch.randn(256, 384, generator=torch.Generator().manual_seed(0))
    q, s = quantize_blockwise(x)
    qsum = next(ln for ln in second.stdout.splitlines() if ln.startswith("QSUM"))
    assert qsum == f"QSUM {float(q.float().sum())} {float(s.sum())}"
    assert not list((tmp_path / "ext").glob("*/lock"))
    # another install of the same source (a wheel beside this checkout) shares the build
    other = tmp_path / "other"
    shutil.copytree(REPO_ROOT / "nemo_ais", other / "nemo_ais", ignore=shutil.ignore_patterns("__pycache__"))
    so = next((tmp_path / "ext").glob("*/*.so"))
    built = so.stat().st_mtime_ns
    third = subprocess.run(
        [sys.executable, "-c", _BUILD], env={**env, "PYTHONPATH": str(other)}, cwd=other,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert third.returncode == 0, third.stdout + third.stderr
    assert str(other) in third.stdout and "building" not in third.stdout, third.stdout
    assert so.stat().st_mtime_ns == built and qsum in third.stdout


def test_the_build_name_depends_on_the_cpu(monkeypatch):
    import platform

    here = cpu_kernel_mod._cpu_fingerprint()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert cpu_kernel_mod._cpu_fingerprint() != here


def _fake_activation_both(x, group, eps, monkeypatch):
    """(fused kernel, PyTorch path) of ``_fake_quant_groups_divide(x)``; the kernel must run."""
    calls = []
    real = quant.kernel_for
    monkeypatch.setattr(quant, "kernel_for", lambda t: calls.append(t.shape) or real(t))
    fused = quant._fake_quant_groups_divide(x, group, eps, "x")
    assert calls == [x.shape] and fused.dtype == torch.float32
    monkeypatch.setattr(quant, "kernel_for", lambda t: None)
    want = quant._fake_quant_groups_divide(x, group, eps, "x")
    monkeypatch.setattr(quant, "kernel_for", real)
    return fused, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("shape", "group", "eps"), [((300, 1024), 128, 1e-10), ((2, 7, 256), 128, 1e-4), ((5, 64), 32, 1e-10)]
)
def test_activation_fake_quant_kernel_equals_the_torch_path(dtype, shape, group, eps, monkeypatch):
    # the twin's per-token FP8 activations: dequant(quant(x)) per 1 x group, "divide" family;
    # zero rows, fp32 subnormals, 34 decades of magnitude, an exact 448 and a -0.0
    x = _wide_range((300, 1024), seed=4).flatten()[: torch.Size(shape).numel()].reshape(shape)
    x.view(-1)[:3] = torch.tensor([448.0, 0.5, -0.0])
    x = x.to(dtype)
    fused, want = _fake_activation_both(x, group, eps, monkeypatch)
    assert torch.equal(fused.view(torch.int32), want.view(torch.int32))  # every bit, -0.0 too


def test_activation_fake_quant_kernel_rounds_ties_as_the_torch_path(monkeypatch):
    # a group whose amax is 448 (s = 1): every midpoint between neighbouring E4M3 codes
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = torch.cat([(codes[:-1] + codes[1:]) / 2, torch.tensor([448.0, 448.0])])  # 128
    x = torch.stack([mids, -mids])
    fused, want = _fake_activation_both(x, 128, 1e-10, monkeypatch)
    assert torch.equal(fused.view(torch.int32), want.view(torch.int32))
    assert torch.equal(fused[0, :2], torch.tensor([0.0, 0.00390625]))  # ties to even codes


def test_activation_fake_quant_kernel_leaves_nan_to_the_torch_paths_error(monkeypatch):
    ran = []
    real = quant.kernel_for
    monkeypatch.setattr(quant, "kernel_for", lambda t: ran.append(real(t)) or ran[-1])
    x = torch.randn(4, 256)
    x[2, 130] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        quant._fake_quant_groups_divide(x, 128, 1e-10, "layer 0 input")
    assert ran and ran[0] is not None  # the kernel ran, found the NaN, the PyTorch path raised
