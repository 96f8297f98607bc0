// anatomy's few-row products on 5-bit weights (an int5 format: GGUF Q5_0 / Q5_1 / Q5_K carried as
// w = q * d + m, q in 0..31), with x quantized to int8 per group of 32 as q4_linear's (gemv.cpp), or
// with x as it is as q4f_linear's (exact.cpp).
//
//   q5 layout (pack_q5), per row, per 64 inputs (two groups A, B): [dA, mA, dB, mB] float16 (8 bytes),
//   the codes' fifth bits (8 bytes, bit i that of input i: A's 32 then B's), then 32 bytes whose byte j
//   holds qA[j] & 15 in its low nibble and qB[j] & 15 in its high one: 48 bytes per 64 weights
//       sum_j w_j x_j = d * sx * sum_j q_j qx_j + m * sx * sum_j qx_j
//   q5_linear(x [M, K] float, weight [N, K/64 * 48]) -> [M, N]     (M any; in the input's dtype)
//   q5f_linear(x, weight) -> [M, N]    the same with x as it is: each weight decoded to float32 in
//                                      registers (q * d + m) and summed in float32, as exact.cpp's q4f
//
// The q4 layout plus the fifth bits, and the same arithmetic: on AVX-512 VNNI the 64 codes of a block
// are its nibbles with 16 added where a 64-bit mask (the fifth bits as they are stored) says so
// (vpaddb under a mask), then gemv.cpp's units of 128 weights (a lane of vpdpbusd, 4 * 31 * 127, still
// packs to int16); AVX2 runs gemv_avx2.cpp's int8 loops on a q5 block; any other CPU the portable loop.
// The float loop: AVX-512 (the same masked add, 32 codes at a time) or gemv_avx2.cpp's q4f loop on q5
// blocks. Rows of x are taken 16 (float: 8) at a time for each tile of output rows, so that a tile's
// weights stay in the cache across them.

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
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
using anatomy::Isa;
using anatomy::PAIR;
using anatomy::Q5_BLOCK;
using anatomy::Quantized;
using anatomy::Units;

constexpr int64_t G = 32;        // inputs per group
constexpr int MAX_ROWS = 16;     // rows of x per pass over a tile of output rows
constexpr int64_t TILE = 16;     // output rows per tile
constexpr int FLOAT_ROWS = 8;    // rows of x per pass of the float loop (two accumulators a row)

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

inline uint16_t float_to_half(float f) { return c10::Half(f).x; }

// -- portable: the arithmetic, for checking ---------------------------------------------------------

void q5_rows_portable(const Quantized& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                      int64_t N) {
  const int64_t pairs = K / PAIR, groups = K / G;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = w + (n * pairs + p) * Q5_BLOCK;
        uint16_t h[4];
        uint64_t fifth;
        std::memcpy(h, block, 8);
        std::memcpy(&fifth, block + 8, 8);
        for (int half = 0; half < 2; ++half) {
          const int64_t g = 2 * p + half;
          const int8_t* qx = a.q.data() + m * K + g * G;
          int32_t dot = 0;
          for (int64_t j = 0; j < G; ++j) {
            const int q = ((half ? block[16 + j] >> 4 : block[16 + j]) & 0x0F) | ((fifth >> (half * G + j)) & 1) << 4;
            dot += q * qx[j];
          }
          const float sx = a.scale[m * groups + g];
          total += half_to_float(h[2 * half]) * sx * dot + half_to_float(h[2 * half + 1]) * sx * a.sum[m * groups + g];
        }
      }
      y[m * N + n] = total;
    }
}

#if ANATOMY_X86

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

// One unit of a weight row (blocks P, Q): its 128 codes as two vectors, [dPA mPA dPB mPB dQA mQA dQB mQB],
// and the scales d spread over the dot's lanes (Units' order)
struct Unit {
  __m512i p, q;
  __m256 dm;
  __m512 d;
};

// a block's 64 codes, byte i that of input i: its nibbles, plus 16 where its fifth bit is set
AVX512_VNNI inline __m512i codes_of(const uint8_t* block) {
  const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
  const __m512i nibbles = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(k), _mm256_srli_epi16(k, 4), 1),
                                           _mm512_set1_epi8(0x0F));
  uint64_t fifth;
  std::memcpy(&fifth, block + 8, 8);
  return _mm512_mask_add_epi8(nibbles, _cvtu64_mask64(fifth), nibbles, _mm512_set1_epi8(16));
}

AVX512_VNNI inline Unit unit_at(const uint8_t* row, int64_t u, int64_t pairs) {
  const __m512i pick = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 2, 2, 6, 6, 2, 2, 6, 6);
  const uint8_t* bp = row + 2 * u * Q5_BLOCK;
  const uint8_t* bq = 2 * u + 1 < pairs ? bp + Q5_BLOCK : bp;  // a phantom block meets zero codes of x
  const __m128i halves = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bp)),
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bq)));
  Unit out;
  out.p = codes_of(bp);
  out.q = codes_of(bq);
  out.dm = _mm256_cvtph_ps(halves);
  out.d = _mm512_permutexvar_ps(pick, _mm512_castps256_ps512(out.dm));
  return out;
}

// the unit's dot with one row of x's codes (xp, xq): 16 lanes, 4 a group, each 8 products
AVX512_VNNI inline __m512 unit_dot(const Unit& w, __m512i xp, __m512i xq) {
  const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.p, xp);  // |lane| <= 4 * 31 * 127
  const __m512i dq = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q, xq);
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_packs_epi32(dp, dq), _mm512_set1_epi16(1)));
}

// R rows of x from row m0 (of the Units' rows) times output rows [n0, n1); y[r * N + n] for row m0 + r
template <int R>
AVX512_VNNI void q5_rows_avx512(const Units& x, int64_t m0, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
                                float* y, int64_t N) {
  const int64_t pairs = K / PAIR, units = x.units;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q5_BLOCK;
    __m512 acc[R];
    __m256 mins[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (int64_t u = 0; u < units; ++u) {
      const Unit b = unit_at(row, u, pairs);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * units + u;
        const int8_t* xq = x.q.data() + at * 128;
        const __m512 dot = unit_dot(b, _mm512_loadu_si512(xq), _mm512_loadu_si512(xq + 64));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(b.d, _mm512_loadu_ps(x.scale.data() + at * 16)), dot, acc[r]);
        mins[r] = _mm256_fmadd_ps(b.dm, _mm256_loadu_ps(x.minimum.data() + at * 8), mins[r]);
      }
    }
    for (int r = 0; r < R; ++r)
      y[r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], _mm512_zextps256_ps512(mins[r])));
  }
}

// One row of x (a decode step): UNROLL output rows at a time, so that x's codes and lanes, loaded once,
// serve them all and 2 * UNROLL independent FMA chains hide the FMA latency; each row's weights are asked
// for AHEAD bytes early (the weights are all it reads from memory)
constexpr int UNROLL = 4;

AVX512_VNNI void q5_row_avx512(const Units& x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
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
        const uint8_t* row = w + (n + r) * pairs * Q5_BLOCK;
        _mm_prefetch(reinterpret_cast<const char*>(row + 2 * u * Q5_BLOCK) + AHEAD, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + 2 * u * Q5_BLOCK) + AHEAD + 64, _MM_HINT_T0);
        const Unit b = unit_at(row, u, pairs);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(b.d, sx), unit_dot(b, xp, xq), acc[r]);
        mins[r] = _mm256_fmadd_ps(b.dm, sm, mins[r]);
      }
    }
    for (int r = 0; r < UNROLL; ++r)
      y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], _mm512_zextps256_ps512(mins[r])));
  }
  if (n < n1) q5_rows_avx512<1>(x, 0, K, w, n, n1, y, 1);
}

template <int R>
void q5_dispatch(const Units& x, int64_t m0, int64_t rows, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
                 float* y, int64_t N) {
  if constexpr (R > 1) {
    if (rows < R) return q5_dispatch<R - 1>(x, m0, rows, K, w, n0, n1, y, N);
  }
  q5_rows_avx512<R>(x, m0, K, w, n0, n1, y, N);
}

// every row of x times output rows [n0, n1): a tile of output rows at a time, all rows of x over it
void q5_avx512(const Units& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  if (M == 1) return q5_row_avx512(x, K, w, n0, n1, y);
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t1 = std::min(n1, t0 + TILE);
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS)
      q5_dispatch<MAX_ROWS>(x, m0, std::min<int64_t>(MAX_ROWS, M - m0), K, w, t0, t1, y + m0 * N, N);
  }
}

#endif  // ANATOMY_X86

// -- float activations -------------------------------------------------------------------------------

void q5f_portable(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                  int64_t N) {
  const int64_t pairs = K / PAIR;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = w + (n * pairs + p) * Q5_BLOCK;
        uint16_t h[4];
        uint64_t fifth;
        std::memcpy(h, block, 8);
        std::memcpy(&fifth, block + 8, 8);
        for (int64_t j = 0; j < PAIR; ++j) {
          const int half = j / G;
          const uint8_t byte = block[16 + j % G];
          const float q = static_cast<float>(((half ? byte >> 4 : byte) & 0x0F) | ((fifth >> j) & 1) << 4);
          total += (q * half_to_float(h[2 * half]) + half_to_float(h[2 * half + 1])) * x[m * K + p * PAIR + j];
        }
      }
      y[m * N + n] = total;
    }
}

#if ANATOMY_X86

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

AVX512 inline __m512 widen(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)); }

// R rows of x (row stride K) times output rows [n0, n1), each block's 64 weights decoded as 4 x 16 floats
template <int R>
AVX512 void q5f_rows(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  const __m256i low = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q5_BLOCK;
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * Q5_BLOCK;
      _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
      const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block)));
      const __m512 dA = _mm512_set1_ps(_mm_cvtss_f32(dm)), mA = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)));
      const __m512 dB = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 2)));
      const __m512 mB = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 3)));
      uint32_t fifth[2];
      std::memcpy(fifth, block + 8, 8);
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
      __m256i a = _mm256_and_si256(packed, low), b = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
      a = _mm256_mask_add_epi8(a, fifth[0], a, sixteen);
      b = _mm256_mask_add_epi8(b, fifth[1], b, sixteen);
      const __m512 w0 = _mm512_fmadd_ps(widen(_mm256_castsi256_si128(a)), dA, mA);       // inputs 0..15
      const __m512 w1 = _mm512_fmadd_ps(widen(_mm256_extracti128_si256(a, 1)), dA, mA);  // 16..31
      const __m512 w2 = _mm512_fmadd_ps(widen(_mm256_castsi256_si128(b)), dB, mB);       // 32..47
      const __m512 w3 = _mm512_fmadd_ps(widen(_mm256_extracti128_si256(b, 1)), dB, mB);  // 48..63
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * K + p * PAIR;
        acc[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r][1]);
        acc[r][0] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xr + 32), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xr + 48), acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
  }
}

template <int R>
void q5f_dispatch(const float* x, int64_t rows, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                  int64_t N) {
  if constexpr (R > 1) {
    if (rows < R) return q5f_dispatch<R - 1>(x, rows, K, w, n0, n1, y, N);
  }
  q5f_rows<R>(x, K, w, n0, n1, y, N);
}

// every row of x: FLOAT_ROWS at a time (2 accumulators each) over a tile of output rows
void q5f_avx512(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t1 = std::min(n1, t0 + TILE);
    for (int64_t m0 = 0; m0 < M; m0 += FLOAT_ROWS)
      q5f_dispatch<FLOAT_ROWS>(x + m0 * K, std::min<int64_t>(FLOAT_ROWS, M - m0), K, w, t0, t1, y + m0 * N, N);
  }
}

#endif  // ANATOMY_X86

void check(const at::Tensor& x, const at::Tensor& w, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, what, ": x must be a float matrix [M, K] "
              "with rows");
  TORCH_CHECK(x.size(1) % PAIR == 0, what, ": K = ", x.size(1), " must be a multiple of ", PAIR);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(), what, ": weight must be uint8 "
              "[N, bytes]");
  TORCH_CHECK(w.size(1) == x.size(1) / PAIR * Q5_BLOCK, what, ": weight has ", w.size(1), " bytes a row, K = ",
              x.size(1), " needs ", x.size(1) / PAIR * Q5_BLOCK);
}

}  // namespace

namespace anatomy {

at::Tensor q5f_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  check(x, w, "anatomy::q5f_linear");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = xf.new_empty({M, N});
  const float* xs = xf.data_ptr<float>();
  const uint8_t* weights = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const Isa level = anatomy::isa(portable);
  at::parallel_for(0, N, TILE, [&](int64_t n0, int64_t n1) {
#if ANATOMY_X86
    if (level == Isa::Avx2) return avx2::q5f_rows(xs, M, K, weights, n0, n1, out, N);
    if (level >= Isa::Avx512) return q5f_avx512(xs, M, K, weights, n0, n1, out, N);
#endif
    q5f_portable(xs, M, K, weights, n0, n1, out, N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor q5_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  check(x, w, "anatomy::q5_linear");
  const Isa level = anatomy::isa(portable);
  const Quantized a = quantize_rows(x, level);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const uint8_t* weights = w.data_ptr<uint8_t>();
  const Units u = level >= Isa::Avx512Vnni ? units_of(a, M, K) : Units{};
#if ANATOMY_X86
  const bool avx2 = level == Isa::Avx2 || level == Isa::Avx512;
  const avx2::Activations x8 = avx2 ? avx2::activations(a, M, K) : avx2::Activations{};
#endif
  at::Tensor y = x.new_empty({M, N}, at::kFloat);
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, TILE, [&](int64_t n0, int64_t n1) {
#if ANATOMY_X86
    if (level >= Isa::Avx512Vnni) return q5_avx512(u, M, K, weights, n0, n1, out, N);
    if (avx2) return avx2::q5_rows(x8, M, K, weights, n0, n1, out, N);
#endif
    q5_rows_portable(a, M, K, weights, n0, n1, out, N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace anatomy

namespace {

// codes [N, K/2] uint8 (low 4 bits, ggml's order: per 32 values byte j = q[j] | q[j + 16] << 4), high
// [N, K/8] uint8 (fifth bits, per 32 values 4 bytes, bit j that of value j), scale and offset [N, K/32]
// float -> the q5 layout [N, K/64 * 48]
at::Tensor pack_q5(const at::Tensor& codes, const at::Tensor& high, const at::Tensor& scale,
                   const at::Tensor& offset) {
  const int64_t N = codes.size(0), K = codes.size(1) * 2, pairs = K / PAIR;
  TORCH_CHECK(codes.scalar_type() == at::kByte && high.scalar_type() == at::kByte, "anatomy::pack_q5: uint8 codes");
  TORCH_CHECK(K % PAIR == 0 && high.size(0) == N && high.size(1) == K / 8 && scale.size(0) == N &&
              scale.size(1) == K / G && offset.sizes() == scale.sizes(), "anatomy::pack_q5: shapes");
  at::Tensor c = codes.contiguous(), hi = high.contiguous();
  at::Tensor s = scale.to(at::kFloat).contiguous(), o = offset.to(at::kFloat).contiguous();
  at::Tensor out = codes.new_empty({N, pairs * Q5_BLOCK}, at::kByte);
  const uint8_t* src = c.data_ptr<uint8_t>();
  const uint8_t* bits = hi.data_ptr<uint8_t>();
  const float* sc = s.data_ptr<float>();
  const float* of = o.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < pairs; ++p) {
      uint8_t* block = dst + (n * pairs + p) * Q5_BLOCK;
      const int64_t g = n * (K / G) + 2 * p;
      uint16_t h[4] = {float_to_half(sc[g]), float_to_half(of[g]), float_to_half(sc[g + 1]), float_to_half(of[g + 1])};
      std::memcpy(block, h, 8);
      std::memcpy(block + 8, bits + n * (K / 8) + p * 8, 8);  // group A's 4 bytes, then B's: bit i of input i
      for (int64_t j = 0; j < G; ++j) {
        const uint8_t* a = src + n * (K / 2) + 2 * p * (G / 2);  // 16 bytes a group: q[j] | q[j+16] << 4
        const uint8_t* b = a + G / 2;
        const uint8_t qa = j < 16 ? (a[j] & 0x0F) : (a[j - 16] >> 4), qb = j < 16 ? (b[j] & 0x0F) : (b[j - 16] >> 4);
        block[16 + j] = static_cast<uint8_t>(qa | (qb << 4));
      }
    }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q5_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("q5f_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("pack_q5(Tensor codes, Tensor high, Tensor scale, Tensor offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q5_linear", anatomy::q5_linear);
  m.impl("q5f_linear", anatomy::q5f_linear);
  m.impl("pack_q5", pack_q5);
}
