// Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
//
// Fused CPU kernels of the four weight quantizers (FP8 blockwise, MXFP8, NVFP4, MXFP4) and
// of the twin's FP8 activation fake quantization: each rule in one loop per row, bit-equal to the PyTorch paths of
// nemo_ais/formats/ (tests/unit/test_fp8_cpu_kernel.py). Built on first use by
// nemo_ais/formats/cpu_kernel.py (torch.utils.cpp_extension.load) and registered as
// PyTorch operators (TORCH_LIBRARY, namespace = the build's name): ATen headers only, no
// <torch/extension.h> and no Python bindings (a first build of ~20 s instead of ~50 s).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// E4M3 (fn) code of v, |v| <= 448 and finite, round to nearest even. Normal range (|v| >=
// 2^-6): add half an E4M3 ulp minus one plus the kept LSB to the fp32 bits, shift, rebias
// the exponent (127 - 7). Subnormal range: |v| * 2^9 rounded to an integer in the FPU's
// round-to-nearest-even mode (the 2^23 trick; the code 8 it can reach is 2^-6, the
// smallest normal, so the two ranges join). No branch: a select.
inline uint8_t e4m3(float v) {
  const uint32_t b = bits_of(v);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & 0x7FFFFFFFu;
  const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
  const uint32_t normal = (rounded >> 20) - (120u << 3);
  // (t + 2^23) - 2^23 is not folded: the build has no -ffast-math (IEEE semantics)
  const float t = (float_of(a) * 512.0f + 8388608.0f) - 8388608.0f;
  const uint32_t sub = static_cast<uint32_t>(static_cast<int32_t>(t));
  return static_cast<uint8_t>(sign | (a < 0x3C800000u ? sub : normal));
}

template <typename T> inline float to_f(T v) { return static_cast<float>(v); }

// 2^e for an integer e in [-127, 127], exactly (2^-127 is the subnormal 2^22 * 2^-149).
inline float pow2(int e) {
  return e >= -126 ? float_of(static_cast<uint32_t>(e + 127) << 23) : float_of(1u << 22);
}

inline float floor_pow2(float v) { int e; std::frexp(v, &e); return std::ldexp(1.0f, e - 1); }
inline float ceil_pow2(float v) {
  int e; const float m = std::frexp(v, &e); return std::ldexp(1.0f, e - (m == 0.5f ? 1 : 0));
}

// The per-tile (s, m) of nemo_ais.formats.fp8_block._scales, operation for operation.
inline void scales(float amax, int family, float eps, bool ue8m0, float* s, float* m) {
  if (eps > 0.0f) amax = std::max(amax, eps);
  const bool zero = amax == 0.0f;
  if (family == 2) {
    float mm = std::min(448.0f / amax, FLT_MAX);  // inf -> FLT_MAX first, as TE: 2^127
    if (ue8m0) mm = floor_pow2(mm);
    mm = zero ? 1.0f : mm;  // <= FLT_MAX: clamped above, and a power of two <= mm
    *m = mm; *s = 1.0f / mm;
    return;
  }
  float ss = amax / 448.0f;
  if (ue8m0) ss = ceil_pow2(ss);
  ss = zero ? 1.0f : ss;
  ss = ss < FLT_MIN ? FLT_MIN : ss;  // subnormal or 0 (eps = 0): 1 / ss would overflow
  *s = ss; *m = std::min(1.0f / ss, FLT_MAX);
}

// out[c] = e4m3(clamp(x[c] / f or x[c] * f, +-448)): pointers by value and __restrict__, so
// gcc vectorises the loop without a runtime alias check (a uint8_t store through an
// unrestricted pointer may alias x; gcc then versions the loop, no measured speed-up).
template <typename T>
void encode_e4m3(const T* __restrict__ x, int64_t n, float f, bool divide,
                 uint8_t* __restrict__ out) {
  if (divide) {
    for (int64_t c = 0; c < n; ++c) out[c] = e4m3(std::min(std::max(to_f(x[c]) / f, -448.0f), 448.0f));
  } else {
    for (int64_t c = 0; c < n; ++c) out[c] = e4m3(std::min(std::max(to_f(x[c]) * f, -448.0f), 448.0f));
  }
}

template <typename T>
void quantize_rows(const T* x, int64_t n, int64_t k, int64_t bn, int64_t bk, int family,
                   float eps, bool ue8m0, uint8_t* q, float* s_out, float* amax_out,
                   int64_t tile_row) {
  const int64_t kb = (k + bk - 1) / bk;
  const int64_t r0 = tile_row * bn, r1 = std::min(r0 + bn, n);
  // pass 1: amax of each tile of this tile row, as the max of |x|'s bit patterns (ordered
  // like the values for non-negative floats; an integer max vectorises and keeps NaN / inf,
  // whose patterns are the largest, visible to the finiteness check)
  std::vector<uint32_t> amax_bits(kb, 0u);
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * k;
    for (int64_t j = 0; j < kb; ++j) {
      const int64_t c0 = j * bk, c1 = std::min(c0 + bk, k);
      uint32_t a = amax_bits[j];
      for (int64_t c = c0; c < c1; ++c) a = std::max(a, bits_of(to_f(row[c])) & 0x7FFFFFFFu);
      amax_bits[j] = a;
    }
  }
  std::vector<float> amax(kb);
  for (int64_t j = 0; j < kb; ++j) amax[j] = float_of(amax_bits[j]);
  std::vector<float> s(kb), m(kb);
  for (int64_t j = 0; j < kb; ++j) {
    scales(amax[j], family, eps, ue8m0, &s[j], &m[j]);
    s_out[tile_row * kb + j] = s[j];
    amax_out[tile_row * kb + j] = amax[j];
  }
  for (int64_t r = r0; r < r1; ++r) {  // pass 2: scale, clamp, encode (the rows are cached)
    for (int64_t j = 0; j < kb; ++j) {
      const int64_t c0 = j * bk, n_c = std::min(c0 + bk, k) - c0;
      encode_e4m3(x + r * k + c0, n_c, family == 1 ? s[j] : m[j], family == 1, q + r * k + c0);
    }
  }
}

}  // namespace

// x [E, N, K] contiguous CPU fp32 / bf16 / fp16 -> (q uint8 [E, N, K], s fp32 [E, nb, kb],
// finite: 0-dim bool). A non-finite value shows up as a non-finite tile amax.
std::vector<at::Tensor> quantize_blockwise(at::Tensor x, int64_t bn, int64_t bk,
                                           int64_t family, double eps, bool ue8m0) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.device().is_cpu(), "x: [E, N, K] CPU");
  const int64_t e = x.size(0), n = x.size(1), k = x.size(2);
  const int64_t nb = (n + bn - 1) / bn, kb = (k + bk - 1) / bk;
  auto q = at::empty({e, n, k}, x.options().dtype(at::kByte));
  auto s = at::empty({e, nb, kb}, x.options().dtype(at::kFloat));
  auto amax = at::empty({e, nb, kb}, x.options().dtype(at::kFloat));
  const float epsf = static_cast<float>(eps);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    uint8_t* qp = q.data_ptr<uint8_t>();
    float* sp = s.data_ptr<float>();
    float* ap = amax.data_ptr<float>();
    at::parallel_for(0, e * nb, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t ei = t / nb, row = t % nb;
        quantize_rows<scalar_t>(xp + ei * n * k, n, k, bn, bk, static_cast<int>(family), epsf,
                                ue8m0, qp + ei * n * k, sp + ei * nb * kb, ap + ei * nb * kb,
                                row);
      }
    });
  });
  return {q, s, amax.isfinite().all()};
}

// The row loops below take their pointers by value and __restrict__: inside a lambda that
// captures them by reference, a uint8_t store may alias anything, and gcc then vectorises
// nothing.

// E2M1 magnitude code of a >= 0, saturating at 6 (code 7): the seven thresholds of
// nemo_ais.formats.grids; at 0.75, 1.75 and 3.5 a tie goes up (to the even code) by ``up`` = 1,
// toward zero by ``up`` = 0.
inline uint32_t e2m1_magnitude(float a, uint32_t up) {
  return (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) +
         (a > 5.0f) + up * ((a == 0.75f) + (a == 1.75f) + (a == 3.5f));
}

inline uint8_t e2m1_code(float y, uint32_t up) {
  const uint32_t yb = bits_of(y);
  return static_cast<uint8_t>(e2m1_magnitude(float_of(yb & 0x7FFFFFFFu), up) |
                              ((yb >> 28) & 8u));
}

// two codes per byte, the even element in the low nibble
inline void pack_pairs(const uint8_t* __restrict__ codes, int64_t k, uint8_t* __restrict__ out) {
  for (int64_t i = 0; i < k / 2; ++i)
    out[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
}

template <typename T>
inline uint32_t amax_bits_of(const T* __restrict__ v, int64_t n) {
  uint32_t a = 0u;
  for (int64_t c = 0; c < n; ++c) a = std::max(a, bits_of(to_f(v[c])) & 0x7FFFFFFFu);
  return a;
}

// The MX scale exponent of nemo_ais.formats.grids.e8m0_block_exponent: ceil(log2(amax /
// element_max)) exactly from amax's bits (amax = 2^q (1 + m 2^-23), element_max = 2^p c:
// q - p + [1 + m 2^-23 > c]); -127 for a zero or subnormal amax; clamped to [-127, 127].
inline int mx_exponent(float amax, float element_max) {
  int p;
  const float c = 2.0f * std::frexp(element_max, &p);  // element_max = c 2^(p - 1)
  const uint32_t b = bits_of(amax), ef = b >> 23, c_bits = bits_of(c) & 0x7FFFFFu;
  const int expo = ef == 0 ? -127 : static_cast<int>(ef) - 127 - (p - 1) + ((b & 0x7FFFFFu) > c_bits ? 1 : 0);
  return std::min(std::max(expo, -127), 127);
}

template <typename T>
int32_t mxfp8_row(const T* __restrict__ row, int64_t k, uint8_t* __restrict__ out,
                  uint8_t* __restrict__ scale) {
  int32_t nonfinite = 0;
  for (int64_t j = 0; j < k / 32; ++j) {
    const uint32_t bits = amax_bits_of(row + j * 32, 32);
    nonfinite |= bits >= 0x7F800000u;
    const int expo = mx_exponent(float_of(bits), 448.0f);
    const float mult = pow2(-expo);
    for (int64_t c = j * 32; c < j * 32 + 32; ++c)
      out[c] = e4m3(std::min(std::max(to_f(row[c]) * mult, -448.0f), 448.0f));
    scale[j] = static_cast<uint8_t>(expo + 127);
  }
  return nonfinite;
}

// MXFP8 of x [R, K] (K % 32 == 0) contiguous CPU fp32 / bf16 / fp16 -> (codes uint8 [R, K],
// scale bytes uint8 [R, K / 32], finite: 0-dim bool): nemo_ais.formats.mxfp8's rule per block of
// 32, E = ceil(log2(amax / 448)) from the fp32 bits (-127 for an all-zero block), clamped
// to [-127, 127]; codes e4m3(clamp(x * 2^-E, +-448)) (the product is exact); byte E + 127.
std::vector<at::Tensor> quantize_mxfp8(at::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x: [R, K] CPU");
  const int64_t rows = x.size(0), k = x.size(1), kb = k / 32;
  TORCH_CHECK(k % 32 == 0, "x: K % 32 != 0");
  auto q = at::empty({rows, k}, x.options().dtype(at::kByte));
  auto scale = at::empty({rows, kb}, x.options().dtype(at::kByte));
  auto bad = at::zeros({at::get_num_threads()}, x.options().dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "mxfp8", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    uint8_t* qp = q.data_ptr<uint8_t>();
    uint8_t* sp = scale.data_ptr<uint8_t>();
    int32_t* badp = bad.data_ptr<int32_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      int32_t nonfinite = 0;
      for (int64_t r = begin; r < end; ++r)
        nonfinite |= mxfp8_row(xp + r * k, k, qp + r * k, sp + r * kb);
      badp[at::get_thread_num()] |= nonfinite;
    });
  });
  return {q, scale, bad.eq(0).all()};
}

// fp32 max |x| per block of 16 of x [R, K] (K % 16 == 0), as nemo_ais.formats.nvfp4's pass 1.
at::Tensor nvfp4_block_amax(at::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x: [R, K] CPU");
  const int64_t rows = x.size(0), k = x.size(1), kb = k / 16;
  auto amax = at::empty({rows, kb}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "amax16", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    float* ap = amax.data_ptr<float>();
    at::parallel_for(0, rows * kb, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) ap[b] = float_of(amax_bits_of(xp + b * 16, 16));
    });
  });
  return amax;
}

// fp32 value of an E4M3 code (no NaN code reaches here), exactly.
inline float e4m3_value(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const float v = e == 0 ? static_cast<float>(m) * 0.001953125f  // m * 2^-9
                         : static_cast<float>(8 + m) * pow2(e - 10);
  return (c & 0x80) ? -v : v;
}

// fp32 value of e4m3(v), |v| <= 448 and finite: e4m3_value(e4m3(v)) without the code, so the
// loop over a group vectorises (the rounding of e4m3(); its bits masked, not shifted).
inline float e4m3_round(float v) {
  const uint32_t b = bits_of(v);
  const uint32_t sign = b & 0x80000000u;
  const uint32_t a = b & 0x7FFFFFFFu;
  const uint32_t normal = (a + 0x7FFFFu + ((a >> 20) & 1u)) & 0xFFF00000u;
  const float t = ((float_of(a) * 512.0f + 8388608.0f) - 8388608.0f) * 0.001953125f;
  return float_of(sign | (a < 0x3C800000u ? bits_of(t) : normal));
}

// y[c] = fp32(e4m3(clamp(x[c] / s, +-448))) * s for one group (pointers by value, __restrict__).
template <typename T>
void fake_fp8_group(const T* __restrict__ x, int64_t g, float s, float* __restrict__ y) {
  for (int64_t c = 0; c < g; ++c)
    y[c] = e4m3_round(std::min(std::max(to_f(x[c]) / s, -448.0f), 448.0f)) * s;
}

template <typename T>
void nvfp4_row(const T* __restrict__ row, int64_t k, const float* __restrict__ amax, float s_g,
               uint8_t* __restrict__ packed, uint8_t* __restrict__ scale,
               float* __restrict__ d, float* __restrict__ y, uint8_t* __restrict__ codes) {
  const int64_t kb = k / 16;
  const float s_g6 = s_g * 6.0f;
  for (int64_t j = 0; j < kb; ++j) {  // block scales and divisors of the row
    float ratio = amax[j] / s_g6;
    ratio = ratio == 0.0f ? 1.0f : ratio;
    ratio = std::min(std::max(ratio, 0.001953125f), 448.0f);
    const uint8_t bs = e4m3(ratio);
    scale[j] = bs;
    const float dj = e4m3_value(bs) * s_g;
    d[j] = dj == 0.0f ? INFINITY : dj;
  }
  for (int64_t j = 0; j < kb; ++j) {  // y = (x + 0) / d: 16 lanes with one divisor
    const float dj = d[j];
    for (int64_t i = 0; i < 16; ++i) y[j * 16 + i] = (to_f(row[j * 16 + i]) + 0.0f) / dj;
  }
  for (int64_t c = 0; c < k; ++c) codes[c] = e2m1_code(y[c], 1u);  // one flat loop
  pack_pairs(codes, k, packed);
}

// NVFP4 codes of x [R, K] from the (tile-maxed) block amax [R, K/16] and the global scale:
// block scale e4m3(clamp(amax / (s_g * 6) or 1 if 0, 2^-9, 448)); d = fp32(scale) * s_g;
// y = (x + 0) / d (d = 0: / inf); code = e2m1(|y|) | 8 * signbit(y) (ties to even,
// saturating at 6); two codes per byte. Returns (packed uint8 [R, K/2], scales uint8
// [R, K/16]).
std::vector<at::Tensor> nvfp4_encode(at::Tensor x, at::Tensor block_amax, double s_g_d) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x: [R, K] CPU");
  const int64_t rows = x.size(0), k = x.size(1), kb = k / 16;
  TORCH_CHECK(block_amax.dim() == 2 && block_amax.size(0) == rows && block_amax.size(1) == kb &&
                  block_amax.is_contiguous() && block_amax.scalar_type() == at::kFloat,
              "block_amax: expected contiguous fp32 [R, K / 16]");
  auto packed = at::empty({rows, k / 2}, x.options().dtype(at::kByte));
  auto scales = at::empty({rows, kb}, x.options().dtype(at::kByte));
  const float s_g = static_cast<float>(s_g_d);
  const float* ap = block_amax.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "nvfp4", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    uint8_t* pp = packed.data_ptr<uint8_t>();
    uint8_t* sp = scales.data_ptr<uint8_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> d(kb), y(k);
      std::vector<uint8_t> codes(k);
      for (int64_t r = begin; r < end; ++r)
        nvfp4_row(xp + r * k, k, ap + r * kb, s_g, pp + r * (k / 2), sp + r * kb, d.data(),
                  y.data(), codes.data());
    });
  });
  return {packed, scales};
}

template <typename T>
int32_t mxfp4_row(const T* __restrict__ row, int64_t k, uint32_t up,
                  uint8_t* __restrict__ packed, uint8_t* __restrict__ scale,
                  uint8_t* __restrict__ codes) {
  int32_t nonfinite = 0;
  for (int64_t j = 0; j < k / 32; ++j) {
    const uint32_t bits = amax_bits_of(row + j * 32, 32);
    nonfinite |= bits >= 0x7F800000u;
    const int expo = mx_exponent(float_of(bits), 6.0f);
    scale[j] = static_cast<uint8_t>(expo + 127);
    const float mult = pow2(-expo);
    for (int64_t c = j * 32; c < j * 32 + 32; ++c)
      codes[c] = e2m1_code((to_f(row[c]) + 0.0f) * mult, up);
  }
  pack_pairs(codes, k, packed);
  return nonfinite;
}

// MXFP4 of x [R, K] (K % 32 == 0): nemo_ais.formats.mxfp4's rule per block of 32: E =
// ceil(log2(amax / 6)) (-127 for an all-zero block), clamped to [-127, 127]; y = (x + 0) *
// 2^-E; code = e2m1(|y|) | 8 * signbit(y), ties to even or (ties_toward_zero) toward zero;
// two codes per byte. Returns (packed uint8 [R, K/2], scale bytes uint8 [R, K/32], finite).
std::vector<at::Tensor> quantize_mxfp4(at::Tensor x, bool ties_toward_zero) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x: [R, K] CPU");
  const int64_t rows = x.size(0), k = x.size(1), kb = k / 32;
  auto packed = at::empty({rows, k / 2}, x.options().dtype(at::kByte));
  auto scale = at::empty({rows, kb}, x.options().dtype(at::kByte));
  auto bad = at::zeros({at::get_num_threads()}, x.options().dtype(at::kInt));
  const uint32_t up = ties_toward_zero ? 0u : 1u;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "mxfp4", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    uint8_t* pp = packed.data_ptr<uint8_t>();
    uint8_t* sp = scale.data_ptr<uint8_t>();
    int32_t* badp = bad.data_ptr<int32_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(k);
      int32_t nonfinite = 0;
      for (int64_t r = begin; r < end; ++r)
        nonfinite |= mxfp4_row(xp + r * k, k, up, pp + r * (k / 2), sp + r * kb, codes.data());
      badp[at::get_thread_num()] |= nonfinite;
    });
  });
  return {packed, scale, bad.eq(0).all()};
}

// dequant(quant(x)) of FP8 activations per 1 x g group, "divide" family, in one pass:
// s = max(amax, eps) / 448; y = fp32(e4m3(clamp(x / s, +-448))) * s, operation for operation
// nemo_ais.formats.fp8_block._fake_quant_groups_divide (eps > 0). x [R, K] contiguous CPU
// fp32 / bf16 / fp16, K % g == 0 -> (y fp32 [R, K], finite: 0-dim bool; a group with NaN
// or inf is left unwritten and reported).
std::vector<at::Tensor> fake_quant_groups_divide(at::Tensor x, int64_t g, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x: [R, K] CPU");
  TORCH_CHECK(g > 0 && x.size(1) % g == 0 && eps > 0.0, "g divides K, eps > 0");
  const int64_t groups = x.numel() / g;
  auto y = at::empty({x.size(0), x.size(1)}, x.options().dtype(at::kFloat));
  const float epsf = static_cast<float>(eps);
  std::atomic<bool> finite{true};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fake_fp8", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, groups, 256, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const float amax = float_of(amax_bits_of(xp + b * g, g));
        if (!std::isfinite(amax)) {
          finite = false;
          continue;
        }
        const float s = std::max(amax, epsf) / 448.0f;
        fake_fp8_group(xp + b * g, g, s, yp + b * g);
      }
    });
  });
  return {y, at::scalar_tensor(finite.load(), x.options().dtype(at::kBool))};
}

// Operator schemas: int = int64_t, float = double, Tensor[] = std::vector<at::Tensor>.
TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("quantize_blockwise(Tensor x, int bn, int bk, int family, float eps, bool ue8m0)"
        " -> Tensor[]", &quantize_blockwise);
  m.def("quantize_mxfp8(Tensor x) -> Tensor[]", &quantize_mxfp8);
  m.def("nvfp4_block_amax(Tensor x) -> Tensor", &nvfp4_block_amax);
  m.def("nvfp4_encode(Tensor x, Tensor block_amax, float s_g_d) -> Tensor[]", &nvfp4_encode);
  m.def("quantize_mxfp4(Tensor x, bool ties_toward_zero) -> Tensor[]", &quantize_mxfp4);
  m.def("fake_quant_groups_divide(Tensor x, int g, float eps) -> Tensor[]",
        &fake_quant_groups_divide);
}
