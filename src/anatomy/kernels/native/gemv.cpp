// anatomy's own few-row products on quantized weights: y [M, N] = x [M, K] @ W^T for M <= 16 rows,
// with W in GGUF-style groups of 32 and x quantized to int8 per group of 32 on the fly, the products
// summed as integers by AVX-512 VNNI (vpdpbusd: 64 unsigned x signed byte products per instruction).
//
//   q4 layout (from an int4 format: Q4_0 / Q4_1 / Q4_K carried as w = q * d + m, q in 0..15), per row,
//   per 64 inputs (two groups A, B): [dA, mA, dB, mB] float16 (8 bytes), then 32 bytes whose byte j
//   holds qA[j] in its low nibble and qB[j] in its high one: 40 bytes per 64 weights (5 bits a weight)
//       sum_j w_j x_j = d * sx * sum_j q_j qx_j + m * sx * sum_j qx_j
//   q8 layout (from int8g: GGUF Q8_0, w = q * d, q in -128..127), per row, per 64 inputs: [dA, dB]
//   float16, [sumA, sumB] int16 (the groups' sums of q), then the 64 codes: 72 bytes per 64 weights;
//   x is shifted to unsigned (qx + 128) and the shift taken out again with the sums:
//       sum_j w_j x_j = d * sx * (sum_j q_j (qx_j + 128) - 128 * sum_j q_j)
//
// This is what llama.cpp's Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products compute; here it is a PyTorch
// operator (so a captured decode step holds it), threaded over output rows with at::parallel_for,
// and chosen only where the kernel plan measures it faster and accurate enough on this machine.
// The AVX-512 code is compiled for that target only and run only where the CPU has it (native.h's
// isa()); a CPU with AVX2 but not VNNI runs gemv_avx2.cpp's loops, any other the portable one (tests
// compare each against float64 and the vector paths against the portable one).

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemv_avx2.h"
#include "native.h"

#if ANATOMY_X86
#include <immintrin.h>
#endif

namespace {

using anatomy::AHEAD;
using anatomy::PAIR;
using anatomy::Q4_BLOCK;
using anatomy::Q8_BLOCK;
using anatomy::Quantized;
using anatomy::Isa;
using anatomy::Units;

constexpr int64_t G = 32;        // inputs per group
constexpr int MAX_ROWS = 16;

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

inline uint16_t float_to_half(float f) { return c10::Half(f).x; }

// -- activations: x [M, K] float -> int8 per group of 32 ------------------------------------------

// one row's K values into out (codes q [K], scale and sum [K/32]); AVX2 where it runs, the same numbers
void quantize_row(const float* v, int64_t K, int8_t* q, float* scale, int32_t* sum) {
  anatomy::quantize_groups(v, K, 127.f, q, scale, sum);
}

// what gemv_avx2.cpp's loops read of x where they run (AVX2, or AVX-512 without VNNI), else nothing
anatomy::avx2::Activations avx2_activations(Isa level, const Quantized& a, int64_t M, int64_t K) {
#if ANATOMY_X86
  return level == Isa::Avx2 || level == Isa::Avx512 ? anatomy::avx2::activations(a, M, K)
                                                    : anatomy::avx2::Activations{};
#else
  return anatomy::avx2::Activations{};
#endif
}

// -- the q4 product ---------------------------------------------------------------------------------

void q4_rows_portable(const Quantized& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                      int64_t N) {
  const int64_t pairs = K / PAIR, groups = K / G;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q4_BLOCK;
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = row + p * Q4_BLOCK;
        uint16_t h[4];
        std::memcpy(h, block, 8);
        const uint8_t* codes = block + 8;
        for (int half = 0; half < 2; ++half) {
          const int64_t g = 2 * p + half;
          const int8_t* qx = a.q.data() + m * K + g * G;
          int32_t dot = 0;
          for (int64_t j = 0; j < G; ++j) dot += ((half ? codes[j] >> 4 : codes[j]) & 0x0F) * qx[j];
          const float sx = a.scale[m * groups + g];
          total += half_to_float(h[2 * half]) * sx * dot + half_to_float(h[2 * half + 1]) * sx * a.sum[m * groups + g];
        }
      }
      y[m * N + n] = total;
    }
  }
}

// Per row m and pair p of the activations, what the q8 loop reads beside the pair's 64 int8 codes:
// [s_A x8 | s_B x8]
struct Lanes {
  std::vector<float> scale;  // [M, pairs, 16]
};

Lanes lanes_of(const Quantized& a, int64_t M, int64_t K) {
  const int64_t pairs = K / PAIR, groups = K / G;
  Lanes out{std::vector<float>(M * pairs * 16)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t lane = 0; lane < 8; ++lane)
        out.scale[(m * pairs + g / 2) * 16 + (g % 2) * 8 + lane] = a.scale[m * groups + g];
  return out;
}

#if ANATOMY_X86

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

// One unit of a weight row (blocks P, Q): its 128 codes as two vectors, [dPA mPA dPB mPB dQA mQA dQB mQB],
// and the scales d spread over the dot's lanes
struct Unit {
  __m512i p, q;
  __m256 dm;
  __m512 d;
};

AVX512_VNNI inline Unit unit_at(const uint8_t* row, int64_t u, int64_t pairs) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i pick = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 2, 2, 6, 6, 2, 2, 6, 6);
  const uint8_t* bp = row + 2 * u * Q4_BLOCK;
  const uint8_t* bq = 2 * u + 1 < pairs ? bp + Q4_BLOCK : bp;  // a phantom block meets zero codes of x
  const __m256i kp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 8));
  const __m256i kq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq + 8));
  const __m128i halves = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bp)),
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bq)));
  Unit out;
  out.p = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(kp), _mm256_srli_epi16(kp, 4), 1), low);
  out.q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(kq), _mm256_srli_epi16(kq, 4), 1), low);
  out.dm = _mm256_cvtph_ps(halves);
  out.d = _mm512_permutexvar_ps(pick, _mm512_castps256_ps512(out.dm));
  return out;
}

// the unit's dot with one row of x's codes (xp, xq): 16 lanes, 4 a group, each 8 products
AVX512_VNNI inline __m512 unit_dot(const Unit& w, __m512i xp, __m512i xq) {
  const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.p, xp);  // |lane| <= 4 * 15 * 127
  const __m512i dq = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q, xq);
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_packs_epi32(dp, dq), _mm512_set1_epi16(1)));
}

AVX512_VNNI inline float unit_total(__m512 acc, __m256 mins) {
  return _mm512_reduce_add_ps(_mm512_add_ps(acc, _mm512_zextps256_ps512(mins)));
}

template <int M>
AVX512_VNNI void q4_rows_avx512(const Units& x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                                int64_t N) {
  const int64_t pairs = K / PAIR, units = x.units;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q4_BLOCK;
    __m512 acc[M];
    __m256 mins[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps(), mins[m] = _mm256_setzero_ps();
    for (int64_t u = 0; u < units; ++u) {
      const Unit b = unit_at(row, u, pairs);
      for (int m = 0; m < M; ++m) {
        const int64_t at = m * units + u;
        const int8_t* xq = x.q.data() + at * 128;
        const __m512 dot = unit_dot(b, _mm512_loadu_si512(xq), _mm512_loadu_si512(xq + 64));
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(b.d, _mm512_loadu_ps(x.scale.data() + at * 16)), dot, acc[m]);
        mins[m] = _mm256_fmadd_ps(b.dm, _mm256_loadu_ps(x.minimum.data() + at * 8), mins[m]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * N + n] = unit_total(acc[m], mins[m]);
  }
}

// One row of x (a decode step): UNROLL output rows at a time, so that x's codes and lanes, loaded once,
// serve them all and 2 * UNROLL independent FMA chains hide the FMA latency
constexpr int UNROLL = 4;

AVX512_VNNI void q4_row_avx512(const Units& x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t pairs = K / PAIR, units = x.units;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m512 acc[UNROLL];
    __m256 mins[UNROLL];
    for (int r = 0; r < UNROLL; ++r) acc[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (int64_t u = 0; u < units; ++u) {
      const __m512i xp = _mm512_loadu_si512(x.q.data() + u * 128);
      const __m512i xq = _mm512_loadu_si512(x.q.data() + u * 128 + 64);
      const __m512 sx = _mm512_loadu_ps(x.scale.data() + u * 16);
      const __m256 sm = _mm256_loadu_ps(x.minimum.data() + u * 8);
      for (int r = 0; r < UNROLL; ++r) {
        const uint8_t* row = w + (n + r) * pairs * Q4_BLOCK;
        _mm_prefetch(reinterpret_cast<const char*>(row + 2 * u * Q4_BLOCK) + AHEAD, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + 2 * u * Q4_BLOCK) + AHEAD + 64, _MM_HINT_T0);
        const Unit b = unit_at(row, u, pairs);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(b.d, sx), unit_dot(b, xp, xq), acc[r]);
        mins[r] = _mm256_fmadd_ps(b.dm, sm, mins[r]);
      }
    }
    for (int r = 0; r < UNROLL; ++r) y[n + r] = unit_total(acc[r], mins[r]);
  }
  if (n < n1) q4_rows_avx512<1>(x, K, w, n, n1, y, 1);
}

template <int M>
void q4_dispatch(const Units& x, int64_t rows, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                 int64_t N) {
  if constexpr (M > 1) {
    if (rows < M) return q4_dispatch<M - 1>(x, rows, K, w, n0, n1, y, N);
  } else {
    return q4_row_avx512(x, K, w, n0, n1, y);
  }
  q4_rows_avx512<M>(x, K, w, n0, n1, y, N);
}

#endif  // ANATOMY_X86

// -- the q8 product ---------------------------------------------------------------------------------

void q8_rows_portable(const Quantized& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                      int64_t N) {
  const int64_t pairs = K / PAIR, groups = K / G;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q8_BLOCK;
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = row + p * Q8_BLOCK;
        uint16_t h[2];
        std::memcpy(h, block, 4);
        const int8_t* codes = reinterpret_cast<const int8_t*>(block + 8);
        for (int half = 0; half < 2; ++half) {
          const int64_t g = 2 * p + half;
          const int8_t* qx = a.q.data() + m * K + g * G;
          int32_t dot = 0;
          for (int64_t j = 0; j < G; ++j) dot += codes[half * G + j] * qx[j];
          total += half_to_float(h[half]) * a.scale[m * groups + g] * dot;
        }
      }
      y[m * N + n] = total;
    }
  }
}

#if ANATOMY_X86

template <int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
void q8_rows_avx512(const Lanes& l, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N,
                    const uint8_t* shifted) {
  const int64_t pairs = K / PAIR;
  const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q8_BLOCK;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * Q8_BLOCK;
      const __m512i codes = _mm512_loadu_si512(block + 8);
      const __m512 dd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(block))));
      const __m512 d = _mm512_permutexvar_ps(pick, dd);  // [dA x8 | dB x8]
      // 128 * sum(q) of each group, spread over its 8 lanes (each lane's dot has 4 of the 32 products)
      const __m512i sums = _mm512_cvtepi16_epi32(_mm256_castsi128_si256(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(block + 4))));
      const __m512i shift = _mm512_slli_epi32(_mm512_permutexvar_epi32(pick, sums), 4);
      for (int m = 0; m < M; ++m) {
        const int64_t at = m * pairs + p;
        const __m512i x = _mm512_loadu_si512(shifted + at * PAIR);
        const __m512i dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x, codes), shift);
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(l.scale.data() + at * 16)), _mm512_cvtepi32_ps(dot),
                                 acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * N + n] = _mm512_reduce_add_ps(acc[m]);
  }
}

template <int M>
void q8_dispatch(const Lanes& l, int64_t rows, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N,
                 const uint8_t* shifted) {
  if constexpr (M > 1) {
    if (rows < M) return q8_dispatch<M - 1>(l, rows, K, w, n0, n1, y, N, shifted);
  }
  q8_rows_avx512<M>(l, K, w, n0, n1, y, N, shifted);
}

#endif  // ANATOMY_X86

// -- the operators ----------------------------------------------------------------------------------

void check(const at::Tensor& x, const at::Tensor& w, int64_t block, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point(), what, ": x must be a float matrix [M, K]");
  TORCH_CHECK(x.size(0) >= 1, what, ": x has no rows");
  TORCH_CHECK(x.size(1) % PAIR == 0, what, ": K = ", x.size(1), " must be a multiple of ", PAIR);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(), what, ": weight must be uint8 [N, bytes]");
  TORCH_CHECK(w.size(1) == x.size(1) / PAIR * block, what, ": weight has ", w.size(1), " bytes a row, K = ",
              x.size(1), " needs ", x.size(1) / PAIR * block);
}

template <typename Rows>
at::Tensor product(const at::Tensor& x, const at::Tensor& w, Rows rows) {
  const int64_t M = x.size(0), N = w.size(0);
  at::Tensor y = x.new_empty({M, N}, at::kFloat);
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { rows(n0, n1, out); });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// More rows than MAX_ROWS: in chunks of MAX_ROWS (each reads the weights again; these kernels are for
// decode and small batches, a plan serves longer passes with a GEMM)
template <typename Op>
at::Tensor in_chunks(const at::Tensor& x, const at::Tensor& w, bool portable, Op op) {
  at::Tensor y = x.new_empty({x.size(0), w.size(0)});  // the products' dtype: x's
  for (int64_t m0 = 0; m0 < x.size(0); m0 += MAX_ROWS) {
    const int64_t rows = std::min<int64_t>(MAX_ROWS, x.size(0) - m0);
    y.narrow(0, m0, rows).copy_(op(x.narrow(0, m0, rows), w, portable));
  }
  return y;
}

}  // namespace

namespace anatomy {

Quantized quantize_rows(const at::Tensor& x, Isa level) {
  const int64_t M = x.size(0), K = x.size(1), groups = K / G;
  Quantized out{std::vector<int8_t>(M * K), std::vector<float>(M * groups), std::vector<int32_t>(M * groups)};
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* src = xf.data_ptr<float>();
#if ANATOMY_X86
  const auto row = level >= Isa::Avx2 ? anatomy::avx2::quantize_row : quantize_row;
#else
  const auto row = quantize_row;
#endif
  for (int64_t m = 0; m < M; ++m)
    row(src + m * K, K, out.q.data() + m * K, out.scale.data() + m * groups, out.sum.data() + m * groups);
  return out;
}

Units units_of(const Quantized& a, int64_t M, int64_t K) {
  const int64_t pairs = K / PAIR, groups = K / G, units = (pairs + 1) / 2;
  Units out{units, std::vector<int8_t>(M * units * 128, 0), std::vector<float>(M * units * 16, 0.f),
            std::vector<float>(M * units * 8, 0.f)};
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(out.q.data() + m * units * 128, a.q.data() + m * K, K);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t at = m * units + p / 2, block = p % 2;
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t g = m * groups + 2 * p + half;
        float* s = out.scale.data() + at * 16 + half * 8 + block * 2;
        s[0] = s[1] = s[4] = s[5] = a.scale[g];
        out.minimum[at * 8 + block * 4 + half * 2 + 1] = a.scale[g] * a.sum[g];
      }
    }
  }
  return out;
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  if (x.dim() == 2 && x.size(0) > MAX_ROWS) return in_chunks(x, w, portable, q4_linear);
  check(x, w, Q4_BLOCK, "anatomy::q4_linear");
  const Isa level = anatomy::isa(portable);
  const Quantized a = quantize_rows(x, level);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const uint8_t* weights = w.data_ptr<uint8_t>();
  const Units u = level >= Isa::Avx512Vnni ? units_of(a, M, K) : Units{};
  const anatomy::avx2::Activations x8 = avx2_activations(level, a, M, K);
  return product(x, w, [&](int64_t n0, int64_t n1, float* y) {
#if ANATOMY_X86
    if (level >= Isa::Avx512Vnni) return q4_dispatch<MAX_ROWS>(u, M, K, weights, n0, n1, y, N);
    if (!x8.lanes.empty()) return anatomy::avx2::q4_rows(x8, M, K, weights, n0, n1, y, N);
#endif
    q4_rows_portable(a, M, K, weights, n0, n1, y, N);
  });
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  if (x.dim() == 2 && x.size(0) > MAX_ROWS) return in_chunks(x, w, portable, q8_linear);
  check(x, w, Q8_BLOCK, "anatomy::q8_linear");
  const Isa level = anatomy::isa(portable);
  const Quantized a = quantize_rows(x, level);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const uint8_t* weights = w.data_ptr<uint8_t>();
  const bool vnni = level >= Isa::Avx512Vnni;
  std::vector<uint8_t> shifted(vnni ? M * K : 0);
  for (size_t i = 0; i < shifted.size(); ++i) shifted[i] = static_cast<uint8_t>(a.q[i] + 128);
  const Lanes l = vnni ? lanes_of(a, M, K) : Lanes{};
  const anatomy::avx2::Activations x8 = avx2_activations(level, a, M, K);
  return product(x, w, [&](int64_t n0, int64_t n1, float* y) {
#if ANATOMY_X86
    if (vnni) return q8_dispatch<MAX_ROWS>(l, M, K, weights, n0, n1, y, N, shifted.data());
    if (!x8.lanes.empty()) return anatomy::avx2::q8_rows(x8, M, K, weights, n0, n1, y, N);
#endif
    q8_rows_portable(a, M, K, weights, n0, n1, y, N);
  });
}

}  // namespace anatomy

namespace {

// -- building the layouts from a format's tensors ---------------------------------------------------

// codes [N, K/2] uint8 in ggml's order (per 32 values: byte j = q[j] | q[j + 16] << 4), scale and offset
// [N, K/32] float -> the q4 layout [N, K/64 * 40]
at::Tensor pack_q4(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset) {
  const int64_t N = codes.size(0), K = codes.size(1) * 2, pairs = K / PAIR;
  TORCH_CHECK(K % PAIR == 0 && scale.size(1) == K / G && offset.size(1) == K / G, "anatomy::pack_q4: shapes");
  at::Tensor c = codes.contiguous(), s = scale.to(at::kFloat).contiguous(), o = offset.to(at::kFloat).contiguous();
  at::Tensor out = codes.new_empty({N, pairs * Q4_BLOCK}, at::kByte);
  const uint8_t* src = c.data_ptr<uint8_t>();
  const float* sc = s.data_ptr<float>();
  const float* of = o.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {  // each row's blocks are its own
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t p = 0; p < pairs; ++p) {
        uint8_t* block = dst + (n * pairs + p) * Q4_BLOCK;
        const int64_t g = n * (K / G) + 2 * p;
        const uint16_t h[4] = {float_to_half(sc[g]), float_to_half(of[g]), float_to_half(sc[g + 1]),
                               float_to_half(of[g + 1])};
        std::memcpy(block, h, 8);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* group = src + n * (K / 2) + (2 * p + half) * (G / 2);  // 16 bytes: q[j] | q[j+16] << 4
          for (int64_t j = 0; j < G; ++j) {
            const uint8_t q = j < 16 ? (group[j] & 0x0F) : (group[j - 16] >> 4);
            block[8 + j] = static_cast<uint8_t>(half ? (block[8 + j] | (q << 4)) : q);
          }
        }
      }
    }
  });
  return out;
}

// codes [N, K] int8, scale [N, K/32] float -> the q8 layout [N, K/64 * 72]
at::Tensor pack_q8(const at::Tensor& codes, const at::Tensor& scale) {
  const int64_t N = codes.size(0), K = codes.size(1), pairs = K / PAIR;
  TORCH_CHECK(K % PAIR == 0 && scale.size(1) == K / G, "anatomy::pack_q8: shapes");
  at::Tensor c = codes.contiguous(), s = scale.to(at::kFloat).contiguous();
  at::Tensor out = codes.new_empty({N, pairs * Q8_BLOCK}, at::kByte);
  const int8_t* src = c.data_ptr<int8_t>();
  const float* sc = s.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {  // each row's blocks are its own
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t p = 0; p < pairs; ++p) {
        uint8_t* block = dst + (n * pairs + p) * Q8_BLOCK;
        const int8_t* q = src + n * K + p * PAIR;
        uint16_t h[2] = {float_to_half(sc[n * (K / G) + 2 * p]), float_to_half(sc[n * (K / G) + 2 * p + 1])};
        int16_t sums[2] = {0, 0};
        for (int64_t j = 0; j < PAIR; ++j) sums[j / G] += q[j];
        std::memcpy(block, h, 4);
        std::memcpy(block + 4, sums, 4);
        std::memcpy(block + 8, q, PAIR);
      }
    }
  });
  return out;
}

// the vector code the kernels run (native.h's Isa): 0 portable, 1 AVX2, 2 AVX-512, 3 AVX-512 with VNNI,
// 4 that and AMX
int64_t isa_level() { return static_cast<int64_t>(anatomy::isa()); }

// at most `level` from now on (the kernels never run more than the CPU has); the limit it replaces
int64_t set_isa_limit(int64_t level) {
  TORCH_CHECK(level >= 0 && level <= static_cast<int64_t>(Isa::Amx), "anatomy::set_isa_limit: level ", level,
              " is not 0 (portable) .. 4 (AMX)");
  return anatomy::isa_limit().exchange(static_cast<int>(level));
}

}  // namespace

TORCH_LIBRARY(anatomy, m) {
  m.def("q4_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("pack_q4(Tensor codes, Tensor scale, Tensor offset) -> Tensor");
  m.def("pack_q8(Tensor codes, Tensor scale) -> Tensor");
  m.def("isa() -> int");
  m.def("set_isa_limit(int level) -> int");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q4_linear", anatomy::q4_linear);
  m.impl("q8_linear", anatomy::q8_linear);
  m.impl("pack_q4", pack_q4);
  m.impl("pack_q8", pack_q8);
}

TORCH_LIBRARY_IMPL(anatomy, CompositeExplicitAutograd, m) {
  m.impl("isa", isa_level);
  m.impl("set_isa_limit", set_isa_limit);
}
