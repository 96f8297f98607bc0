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

// What the AVX-512 VNNI int4/int5 loops (gemv.cpp's q4, q5.cpp's) read of x, made once per call. They
// take two blocks (128 weights) a step, a "unit": the two 16-lane dots (8 lanes a group) are narrowed to
// one (packed to int16, then neighbouring lanes summed by vpmaddwd: 4 lanes a group, each a sum of 8
// products), so the scaling (convert, multiply, FMA) runs once per 128 weights instead of once per 64,
// and the minimum terms are summed on the side, one 8-lane FMA a unit. Per row of x and unit: its 128
// codes (a phantom second block, where K / 64 is odd, has zero codes), the scales [lane 4i + j: group A
// for i < 2, else B; block P for j < 2, else Q] and the minimum terms [0, cPA, 0, cPB, 0, cQA, 0, cQB]
// (c = s * sum(q)) beside the blocks' [d, m] pairs.
struct Units {
  int64_t units;
  std::vector<int8_t> q;       // [M, units, 128]
  std::vector<float> scale;    // [M, units, 16]
  std::vector<float> minimum;  // [M, units, 8]
};

Units units_of(const Quantized& a, int64_t M, int64_t K);

namespace avx2 {

#if ANATOMY_X86  // (x86-64 only, as every function below: elsewhere a call left unguarded fails to compile)
// one row x [K] to int8 per group of 32: codes q [K], scale s = max|x| / 127 and sum of q [K/32] per group
// (the same numbers as gemv.cpp's portable loop: round to nearest even of x * (1 / s))
void quantize_row(const float* x, int64_t K, int8_t* q, float* scale, int32_t* sum);
// and to int16 (s = max|x| / 32767), with the codes also as the int16 tile loops take them: per 4 inputs
// the order 0, 2, 1, 3 (tiles.cpp's pairs)
void quantize_row16(const float* x, int64_t K, int16_t* q, int16_t* pairs, float* scale, int32_t* sum);
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
// int5 weights (q5.cpp's q5 layout) x int8 activations, any M
void q5_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N);

// the same layouts x float32 activations x [M, K] as they are, M <= 8
void q4f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N);
void q8f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N);
void q5f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N);

#endif  // ANATOMY_X86

}  // namespace avx2
}  // namespace anatomy
