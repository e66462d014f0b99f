# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Triton kernels of :mod:`nemo_ais.kernels.triton_quant` (imports Triton at module load).

Loaded compiled (CUDA) and under Triton's interpreter (CPU, the CI path); every rounding is written out so both give the
PyTorch references' bits: ``tl.math.div_rn`` divisions, E4M3 encoded from the fp32 bits with integer arithmetic (the
interpreter's float8 cast rounds ties up and turns 470 into NaN), powers of two from exponent bits. Each program adds
its count of non-finite inputs to one int32 (an atomic add, only where it is non-zero: the common case costs no atomic);
the wrappers hand such input to PyTorch, which raises.
"""

import triton
import triton.language as tl

# Globals a kernel reads must be constexpr (Triton refuses plain module globals)
E4M3_MAX = tl.constexpr(448.0)
FP32_MAX = tl.constexpr(3.4028234663852886e38)
SMALLEST_NORMAL = tl.constexpr(1.1754943508222875e-38)  # 2^-126
INF = tl.constexpr(float("inf"))


@triton.jit
def _max(x, axis: tl.constexpr):
    """``tl.max`` as the core reduction (the interpreter runs it without Triton's stdlib)."""
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@triton.jit
def _sum(x, axis: tl.constexpr):
    """``tl.sum`` as the core reduction (integers only here: no promotion needed)."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _e4m3_code(q):
    """int32 E4M3 code (sign in bit 7) of fp32 ``q``, |q| <= 448: RNE, as torch's cast."""
    b = q.to(tl.int32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    # normal E4M3 (|q| >= 2^-6): significand rounded to 3 bits, ties to even; bias 127 -> 7
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal E4M3 (|q| < 2^-6): |q| * 2^9 rounded to an integer 0..8, ties to even
    sig = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(141 - (a >> 23), 25)  # 14 - unbiased exponent; >= 21 here
    low = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    sub = sig >> shift
    sub += ((low > half) | ((low == half) & ((sub & 1) == 1))).to(tl.int32)
    return tl.where(a >= 0x3C800000, normal, sub) | sign


@triton.jit
def _e4m3_byte(q, HW_CAST: tl.constexpr):
    """uint8 E4M3 byte of fp32 ``q``, |q| <= 448, rounded to nearest even.

    ``HW_CAST``: the GPU's conversion (sm_89+: ``cvt.rn.satfinite.e4m3x2.f32``, torch's bits); else :func:`_e4m3_code`.
    """
    if HW_CAST:
        return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return _e4m3_code(q).to(tl.uint8)


@triton.jit
def _e4m3_value(code):
    """fp32 value of a positive E4M3 code 0..126 (int32)."""
    expo = code >> 3
    mant = code & 7
    normal = (((expo + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    return tl.where(expo == 0, mant.to(tl.float32) * 0.001953125, normal)


@triton.jit
def _e2m1_code(a, TIES_TO_ZERO: tl.constexpr):
    """int32 E2M1 magnitude code 0..7 of fp32 ``a >= 0`` by the seven thresholds, saturating."""
    code = (a > 0.25).to(tl.int32) + (a > 1.25).to(tl.int32) + (a > 2.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    if TIES_TO_ZERO:  # the thresholds a tie passes upward (the upper code is even) unless ties go toward zero
        return code + (a > 0.75).to(tl.int32) + (a > 1.75).to(tl.int32) + (a > 3.5).to(tl.int32)
    return code + (a >= 0.75).to(tl.int32) + (a >= 1.75).to(tl.int32) + (a >= 3.5).to(tl.int32)


@triton.jit
def _exp2(e):
    """fp32 ``2^e`` for int32 ``e`` in [-127, 127], exactly (2^-127 is subnormal)."""
    normal = (tl.maximum(e, -126) + 127) << 23
    sub = 0x800000 >> tl.maximum(-126 - e, 0)
    return tl.where(e >= -126, normal, sub).to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_exponent(amax, ELEM_P: tl.constexpr, ELEM_C: tl.constexpr):
    """MX exponent ``ceil(log2(amax / (2^ELEM_P c)))`` (``ELEM_C``: c's mantissa bits), as ``e8m0_block_exponent``."""
    b = amax.to(tl.int32, bitcast=True)
    field = b >> 23
    expo = field - 127 - ELEM_P + ((b & 0x7FFFFF) > ELEM_C).to(tl.int32)
    expo = tl.where(field > 0, expo, -127)
    return tl.minimum(tl.maximum(expo, -127), 127)


@triton.jit
def _ceil_pow2(s):
    """Smallest power of two >= fp32 ``s >= 0`` (``frexp``'s rule; 0 gives 1, as torch)."""
    b = s.to(tl.int32, bitcast=True)
    field = b >> 23
    mant = b & 0x7FFFFF
    normal = tl.where(mant == 0, b, (field + 1) << 23)
    # subnormal s: the next power of two of its integer significand, as a bit pattern
    mb = mant.to(tl.float32).to(tl.int32, bitcast=True)
    p = (mb >> 23) - 127 + ((mb & 0x7FFFFF) != 0).to(tl.int32)
    sub = 1 << tl.minimum(tl.maximum(p, 0), 23)
    bits = tl.where(field > 0, normal, sub)
    return tl.where(b == 0, 1.0, bits.to(tl.float32, bitcast=True))


@triton.jit
def _floor_pow2(m):
    """Largest power of two <= fp32 ``m > 0`` (normal); inf gives 0.5 (torch's frexp)."""
    b = m.to(tl.int32, bitcast=True)
    p = (b & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(m == INF, 0.5, p)


@triton.jit
def _store_e2m1_pairs(q_ptr, y, xb, rows64, rmask, pk, k, BR: tl.constexpr, BK: tl.constexpr, TIES: tl.constexpr):
    """Signed E2M1 codes of ``y`` (sign of ``xb``), two a byte, into block ``pk`` of ``q``."""
    code = _e2m1_code(tl.abs(y), TIES) | tl.where(xb < 0, 8, 0)
    pairs = tl.reshape(code, (BR, BK // 2, 2)) << (tl.arange(0, 2) * 4)[None, None, :]
    packed = _sum(pairs, 2)
    pcols = pk * (BK // 2) + tl.arange(0, BK // 2)
    pmask = rmask[:, None] & (pcols < k // 2)[None, :]
    tl.store(q_ptr + rows64[:, None] * (k // 2) + pcols[None, :], packed.to(tl.uint8), pmask)


@triton.jit
def _count_bad(x):
    """Number of NaN / inf entries of fp32 ``x`` (NaN fails every comparison)."""
    return _sum(_sum((~(tl.abs(x) <= FP32_MAX)).to(tl.int32), 1), 0)


@triton.jit
def _flag_bad(bad_ptr, count):
    """Add a program's non-finite ``count`` to the call's one int32 counter (zeroed by the caller)."""
    tl.atomic_add(bad_ptr, count, mask=count > 0)


@triton.jit
def fp8_blockwise_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    bad_ptr,
    n,
    k,
    nb,
    kb,
    eps,
    BN: tl.constexpr,
    BK: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_K: tl.constexpr,
    FAMILY: tl.constexpr,
    UE8M0: tl.constexpr,
    HW_CAST: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One ``BN x BK`` tile of expert ``program_id(1)`` of ``x [E, n, k]`` per program.

    The tile is walked in ``CHUNK``-row slices twice (amax, then quantize), so it never sits in registers whole. FAMILY
    0/1/2 = reciprocal / divide / multiplier. Writes codes, the tile's fp32 scale and its non-finite count.
    """
    tile = tl.program_id(0)
    e = tl.program_id(1).to(tl.int64)
    tn = tile // kb
    tk = tile % kb
    j = tl.arange(0, TILE_K)
    cols = tk * BK + j
    cmask = ((j < BK) & (cols < k))[None, :]
    base = x_ptr + e * n * k + cols[None, :]
    acc = tl.full((CHUNK, TILE_K), 0.0, tl.float32)  # (tl.zeros: stdlib, see _max)
    bad = tl.full((CHUNK, TILE_K), 0, tl.int32)
    for r0 in range(0, TILE_N, CHUNK):  # pass 1: amax (and non-finite count) of the tile
        i = r0 + tl.arange(0, CHUNK)
        rows = tn * BN + i
        mask = ((i < BN) & (rows < n))[:, None] & cmask
        x = tl.load(base + rows.to(tl.int64)[:, None] * k, mask=mask, other=0.0)
        x = tl.abs(x.to(tl.float32))
        acc = tl.maximum(acc, x)
        bad += (~(x <= FP32_MAX)).to(tl.int32)
    amax = _max(_max(acc, 1), 0)
    amax = tl.maximum(amax, eps)  # eps = 0: unchanged
    zero = amax == 0
    if FAMILY == 2:
        # one correctly rounded division, as the reference's tensor / tensor
        # inf (amax < 448 / FLT_MAX) -> FLT_MAX before the power of two, as TE: 2^127
        m = tl.minimum(tl.math.div_rn(tl.full(amax.shape, E4M3_MAX, tl.float32), amax), FP32_MAX)
        if UE8M0:
            m = _floor_pow2(m)
        m = tl.where(zero, 1.0, m)  # <= FLT_MAX: clamped above, and a power of two <= m
        s = tl.math.div_rn(tl.full(m.shape, 1.0, tl.float32), m)
    else:
        s = tl.math.div_rn(amax, tl.full(amax.shape, E4M3_MAX, tl.float32))
        if UE8M0:
            s = _ceil_pow2(s)
        s = tl.where(zero, 1.0, s)
        s = tl.where(s < SMALLEST_NORMAL, SMALLEST_NORMAL, s)  # subnormal or 0: 1 / s would overflow
        m = tl.minimum(tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s), FP32_MAX)
    qbase = q_ptr + e * n * k + cols[None, :]
    for r0 in range(0, TILE_N, CHUNK):  # pass 2: scale, saturate, encode, store
        i = r0 + tl.arange(0, CHUNK)
        rows = tn * BN + i
        mask = ((i < BN) & (rows < n))[:, None] & cmask
        roffs = rows.to(tl.int64)[:, None] * k
        x = tl.load(base + roffs, mask=mask, other=0.0).to(tl.float32)
        if FAMILY == 1:
            y = tl.math.div_rn(x, tl.broadcast_to(s, x.shape))
        else:
            y = x * m
        y = tl.minimum(tl.maximum(y, -E4M3_MAX), E4M3_MAX)
        tl.store(qbase + roffs, _e4m3_byte(y, HW_CAST), mask=mask)
    tl.store(s_ptr + e * nb * kb + tile, s)
    _flag_bad(bad_ptr, _sum(_sum(bad, 1), 0))


@triton.jit
def mx_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    bad_ptr,
    r,
    k,
    BR: tl.constexpr,
    BK: tl.constexpr,
    FP4: tl.constexpr,
    TIES_TO_ZERO: tl.constexpr,
    HW_CAST: tl.constexpr,
):
    """MXFP8 (``FP4`` False) or MXFP4 of a ``BR x BK`` block: codes, UE8M0 bytes, bad count."""
    pr = tl.program_id(0)
    pk = tl.program_id(1)
    rows = pr * BR + tl.arange(0, BR)
    cols = pk * BK + tl.arange(0, BK)
    rmask = rows < r
    mask = rmask[:, None] & (cols < k)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * k + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    xb = tl.reshape(x, (BR, BK // 32, 32))
    amax = _max(tl.abs(xb), 2)
    if FP4:
        expo = _e8m0_exponent(amax, 2, 0x400000)  # 6 = 2^2 x 1.5
    else:
        expo = _e8m0_exponent(amax, 8, 0x600000)  # 448 = 2^8 x 1.75
    y = xb * _exp2(-expo)[:, :, None]  # exact unless the product is subnormal (RNE)
    if FP4:
        _store_e2m1_pairs(q_ptr, y, xb, rows64, rmask, pk, k, BR, BK, TIES_TO_ZERO)
    else:
        y = tl.minimum(tl.maximum(y, -E4M3_MAX), E4M3_MAX)
        code = tl.reshape(_e4m3_byte(y, HW_CAST), (BR, BK))
        tl.store(q_ptr + rows64[:, None] * k + cols[None, :], code, mask)
    scols = pk * (BK // 32) + tl.arange(0, BK // 32)
    smask = rmask[:, None] & (scols < k // 32)[None, :]
    sbytes = (expo + 127).to(tl.uint8)
    tl.store(s_ptr + rows64[:, None] * (k // 32) + scols[None, :], sbytes, smask)
    _flag_bad(bad_ptr, _count_bad(x))


@triton.jit
def absmax_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """Max |x| of ``BLOCK`` elements of matrix ``program_id(1)``, a partial a program (inf: NaN)."""
    pid = tl.program_id(0)
    mat = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + mat * numel + offs, mask=offs < numel, other=0.0).to(tl.float32)
    ax = tl.abs(x)
    bad = _sum((~(ax <= FP32_MAX)).to(tl.int32), 0)
    tl.store(out_ptr + mat * tl.num_programs(0) + pid, tl.where(bad > 0, INF, _max(ax, 0)))


@triton.jit
def nvfp4_kernel(
    x_ptr, sg_ptr, q_ptr, s_ptr, bad_ptr, n, k, sg_stride, BR: tl.constexpr, BK: tl.constexpr, TILE_ROWS: tl.constexpr
):
    """NVFP4 (:mod:`nemo_ais.formats.nvfp4` steps 2-5) of a ``BR x BK`` block of matrix ``e``.

    ``s_g`` at ``sg_ptr + e * sg_stride`` (stride 0: one for the tensor); ``TILE_ROWS`` 16:
    one amax per 16x16 tile. Writes packed E2M1 pairs, E4M3 scale bytes and the bad count.
    """
    pr = tl.program_id(0)
    pk = tl.program_id(1)
    e = tl.program_id(2).to(tl.int64)
    rows = pr * BR + tl.arange(0, BR)
    cols = pk * BK + tl.arange(0, BK)
    rmask = rows < n
    mask = rmask[:, None] & (cols < k)[None, :]
    rows64 = e * n + rows.to(tl.int64)  # row of the flattened [E * n, k]
    x = tl.load(x_ptr + rows64[:, None] * k + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    xb = tl.reshape(x, (BR, BK // 16, 16))
    amax = _max(tl.abs(xb), 2)
    if TILE_ROWS > 1:
        tiles = _max(tl.reshape(amax, (BR // TILE_ROWS, TILE_ROWS, BK // 16)), 1)
        amax = tl.reshape(tl.broadcast_to(tiles[:, None, :], (BR // TILE_ROWS, TILE_ROWS, BK // 16)), (BR, BK // 16))
    s_g = tl.load(sg_ptr + e * sg_stride)
    ratio = tl.math.div_rn(amax, tl.broadcast_to(s_g * 6.0, amax.shape))
    ratio = tl.where(ratio == 0, 1.0, ratio)
    ratio = tl.minimum(tl.maximum(ratio, 0.001953125), E4M3_MAX)  # [2^-9, 448]
    scale_code = _e4m3_code(ratio)
    d = _e4m3_value(scale_code) * s_g
    d = tl.where(d == 0, INF, d)
    y = tl.math.div_rn(xb, tl.broadcast_to(d[:, :, None], xb.shape))
    _store_e2m1_pairs(q_ptr, y, xb, rows64, rmask, pk, k, BR, BK, False)
    scols = pk * (BK // 16) + tl.arange(0, BK // 16)
    smask = rmask[:, None] & (scols < k // 16)[None, :]
    sbytes = scale_code.to(tl.uint8)
    tl.store(s_ptr + rows64[:, None] * (k // 16) + scols[None, :], sbytes, smask)
    _flag_bad(bad_ptr, _count_bad(x))
