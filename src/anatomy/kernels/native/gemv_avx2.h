// The AVX2 paths of anatomy's few-row products (gemv_avx2.cpp), for x86-64 CPUs with AVX2, FMA and F16C
// without AVX-512: the same layouts and the same arithmetic as gemv.cpp's and exact.cpp's AVX-512 loops,
// 8 lanes at a time. Each fills y[m * N + n] for output rows n in [n0, n1) and all M rows of x.
#pragma once

#include <cstdint>
#include <vector>

#include "native.h"

namespace anatomy {

// activations x [M, K] rounded to int8 per group of 32 (gemv.cpp's quantize_rows)
struct Quantized {
  std::vector<int8_t> q;     // [M, K] round(x / s), in -127..127
  std::vector<float> scale;  // [M, K/32] s = max|x| / 127
  std::vector<int32_t> sum;  // [M, K/32] sum of q over the group
};

namespace avx2 {

#if ANATOMY_X86  // (x86-64 only, as every function below: elsewhere a call left unguarded fails to compile)
// one row x [K] to int8 per group of 32: codes q [K], scale s = max|x| / 127 and sum of q [K/32] per group
// (the same numbers as gemv.cpp's portable loop: round to nearest even of x * (1 / s))
void quantize_row(const float* x, int64_t K, int8_t* q, float* scale, int32_t* sum);
#endif

// What the int8 loops read of x, made once per call: its codes with each block's two groups interleaved
// by 4-byte pieces as the loops take a block's codes ([A0 B0 A1 B1 | A4 B4 A5 B5] [A2 B2 A3 B3 | ...]),
// and per row m and block p of 64 inputs, spread over the lanes in which the loops sum each group:
// [s_A s_B s_A s_B s_A s_B s_A s_B] then the same of c / 4 with c = s * sum(q) (q4's minimum term)
struct Activations {
  std::vector<int8_t> codes;  // [M, K]
  std::vector<float> lanes;   // [M, K/64, 16]
};

#if ANATOMY_X86

Activations activations(const Quantized& a, int64_t M, int64_t K);

// int4 (q4 layout) and int8 (q8 layout) weights x int8 activations, M <= 16
void q4_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N);
void q8_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N);

// the same layouts x float32 activations x [M, K] as they are, M <= 8
void q4f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N);
void q8f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N);

#endif  // ANATOMY_X86

}  // namespace avx2
}  // namespace anatomy
