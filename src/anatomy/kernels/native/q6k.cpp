// The few-row product on GGUF Q6_K weights (weights/int6.py: w = d * sc * (q - 32), q in 0..63, one float16
// d per 256 inputs, one int8 sc per 16) with x quantized to int8 per group of 32 (anatomy::quantize_rows),
// the products summed as integers, as llama.cpp's Q6_K x Q8_K dot product does:
//
//   y[m, n] = sum over super-blocks b of d * sum over groups g of sx[m, g] * sum over the group's two
//             sub-blocks h of sc[h] * sum_j (q_j - 32) qx_j      (the inner sums integers, exact)
//
//   q6 layout (pack_q6, from the format's buffers), per row, per super-block of 256 inputs, 210 bytes (the
//   file's size): d float16, 16 int8 sub-scales, then the codes in the order the vector loops take them:
//   4 "chunks" of 64 bytes, byte t of chunk c the input 32 (t / 8) + 4 (2c + t / 4 % 2) + t % 4. Lane i
//   (4 bytes) of every chunk so holds group i / 2, chunks 0-1 its first sub-block and 2-3 its second,
//   so that the 4 chunks' products add up lane by lane, as integers, into each group's sum: one convert
//   and scale per 256 inputs and row of x. Stored as L0 (64 bytes: chunk 0's low 4 bits in the low
//   nibbles, chunk 1's in the high ones), L1 (chunks 2, 3) and H (chunk c's top 2 bits in bits 2c, 2c+1).
//
// A chunk's products: vpmaddubsw (unsigned codes 0..63 x int8 activations, pairs summed to int16: at most
// 2 * 63 * 127), the two chunks of a sub-block added (32004 < 32767), 32 * the activations' pair sums taken
// off (x's side, made once per call), the int16 sums times the sub-scales and paired by vpmaddwd into
// int32 (|.| <= 2 * 16256 * 128). AVX-512 (BW) where the CPU has it, else AVX2 (the same layout read 32
// bytes at a time), else the portable loop, which the tests hold the vector paths to.
//
// q6f_linear: the same layout times x as it is (as exact.cpp's q4f): each weight decoded to float32 in
// registers, (q - 32) * (d * sc) (d * sc exact in float32), and summed in float32, so the product is the
// float product of the weights the file holds, without q6_linear's rounding of x to int8. x is put once per
// call in the layout's order (each super-block's inputs as the chunks hold them), so that a super-block's
// codes, decoded once per output row, are widened 16 (AVX2: 8) at a time as they lie, and each 16 meets its
// two sub-scales (AVX2's 8: one) by lane.

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

#include "avx2.h"
#endif

namespace {

using anatomy::AHEAD;
using anatomy::Isa;
using anatomy::Quantized;
using anatomy::up_to;

constexpr int64_t SUPER = anatomy::Q6_SUPER;  // inputs per super-block
constexpr int64_t G = 32;          // inputs per group of x
constexpr int64_t BLOCK = anatomy::Q6_BLOCK;  // bytes per super-block of the layout
constexpr int64_t SCALES = 2;      // offset of the 16 sub-scales (after d)
constexpr int64_t L0 = anatomy::Q6_L0, L1 = anatomy::Q6_L1, H = anatomy::Q6_H;  // offsets of the code planes
constexpr int64_t TILE = 16;       // output rows whose weights stay in cache across the chunks of rows of x
constexpr int ROWS = 8;            // rows of x per pass over a tile
constexpr int UNROLL = 4;          // output rows at a time in the one-row loops

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// where input k (0..255) of a super-block sits (chunk, byte) and its code q (0..63): native.h
using anatomy::q6_byte;
using anatomy::q6_chunk;
using anatomy::q6_code;

// -- x's side, once per call ----------------------------------------------------------------------

// x's int8 codes in the layout's order, and per row and super-block: 32 * the sum of the 4 codes each int16
// lane of vpmaddubsw covers in chunks 0 and 1, then 2 and 3 (int16 [2, 32]: the -32 of the weights' codes),
// and the groups' scales, each on the two int32 lanes of its group ([sx0 sx0 sx1 sx1 ... sx7 sx7])
struct Activations {
  std::vector<int8_t> q;       // [M, K]
  std::vector<int16_t> x32;    // [M, K/256, 64]
  std::vector<float> lanes;    // [M, K/256, 16]
};

Activations activations(const Quantized& a, int64_t M, int64_t K) {
  const int64_t supers = K / SUPER;
  Activations out{std::vector<int8_t>(M * K), std::vector<int16_t>(M * supers * 64),
                  std::vector<float>(M * supers * 16)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < supers; ++b) {
      const int8_t* from = a.q.data() + m * K + b * SUPER;
      int8_t* to = out.q.data() + m * K + b * SUPER;
      for (int64_t k = 0; k < SUPER; ++k) to[64 * q6_chunk(k) + q6_byte(k)] = from[k];
      int16_t* x32 = out.x32.data() + (m * supers + b) * 64;
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t j = 0; j < 32; ++j) {
          const int8_t* c0 = to + 128 * part + 2 * j;
          x32[32 * part + j] = static_cast<int16_t>(32 * (c0[0] + c0[1] + c0[64] + c0[65]));
        }
      for (int64_t i = 0; i < 16; ++i) out.lanes[(m * supers + b) * 16 + i] = a.scale[m * (K / G) + b * 8 + i / 2];
    }
  return out;
}

// -- the portable loop ------------------------------------------------------------------------------

void q6_rows_portable(const Quantized& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                      int64_t N) {
  const int64_t supers = K / SUPER;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t b = 0; b < supers; ++b) {
        const uint8_t* block = w + (n * supers + b) * BLOCK;
        uint16_t d;
        std::memcpy(&d, block, 2);
        const int8_t* sc = reinterpret_cast<const int8_t*>(block + SCALES);
        const int8_t* qx = a.q.data() + m * K + b * SUPER;
        float part = 0.f;
        for (int64_t g = 0; g < 8; ++g) {
          int32_t dot = 0;
          for (int64_t k = 32 * g; k < 32 * g + 32; ++k) dot += sc[k / 16] * (q6_code(block, k) - 32) * qx[k];
          part += a.scale[m * (K / G) + b * 8 + g] * static_cast<float>(dot);
        }
        total += half_to_float(d) * part;
      }
      y[m * N + n] = total;
    }
}

#if ANATOMY_X86

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

// d, the block's float16 first 2 bytes, as a float (F16C: both paths' targets have it)
inline __attribute__((target("f16c"))) float d_of(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return _cvtsh_ss(d);
}

// -- AVX-512: a super-block in 4 vectors of 64 codes --------------------------------------------------

// a chunk's codes: the low 4 bits from the nibbles `low4` holds in its low bits, the top 2 from `top2`'s
// bits 4-5 (each plane shifted into place; the bits around them are masked off)
AVX512 inline __m512i codes512(__m512i low4, __m512i top2) {
  const __m512i nibble = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  return _mm512_or_si512(_mm512_and_si512(low4, nibble), _mm512_and_si512(top2, bits45));
}

struct Super512 {
  __m512i u[4];    // the chunks' codes, 0..63
  __m512i sc[2];   // int16 lane j: sc[2 (j / 4)] (chunks 0-1), sc[2 (j / 4) + 1] (chunks 2-3)
  __m512 d;
};

AVX512 inline Super512 super512(const uint8_t* block) {
  const __m512i l0 = _mm512_loadu_si512(block + L0), l1 = _mm512_loadu_si512(block + L1);
  const __m512i h = _mm512_loadu_si512(block + H);
  Super512 s;
  s.u[0] = codes512(l0, _mm512_slli_epi16(h, 4));
  s.u[1] = codes512(_mm512_srli_epi16(l0, 4), _mm512_slli_epi16(h, 2));
  s.u[2] = codes512(l1, h);
  s.u[3] = codes512(_mm512_srli_epi16(l1, 4), _mm512_srli_epi16(h, 2));
  const __m512i sc = _mm512_castsi256_si512(
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SCALES))));
  const __m512i even = _mm512_set_epi16(14, 14, 14, 14, 12, 12, 12, 12, 10, 10, 10, 10, 8, 8, 8, 8, 6, 6, 6, 6, 4, 4,
                                        4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  s.sc[0] = _mm512_permutexvar_epi16(even, sc);
  s.sc[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(even, _mm512_set1_epi16(1)), sc);
  s.d = _mm512_set1_ps(d_of(block));
  return s;
}

// acc += the super-block's products with one row's codes x [256], pair sums x32 [64], lanes [16]
AVX512 inline __m512 super512_dot(const Super512& s, const int8_t* x, const int16_t* x32, const float* lanes,
                                  __m512 acc) {
  __m512i part[2];
  for (int p = 0; p < 2; ++p) {
    const __m512i a = _mm512_maddubs_epi16(s.u[2 * p], _mm512_loadu_si512(x + 128 * p));
    const __m512i b = _mm512_maddubs_epi16(s.u[2 * p + 1], _mm512_loadu_si512(x + 128 * p + 64));
    const __m512i sums = _mm512_sub_epi16(_mm512_add_epi16(a, b), _mm512_loadu_si512(x32 + 32 * p));
    part[p] = _mm512_madd_epi16(sums, s.sc[p]);
  }
  const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(part[0], part[1]));  // lanes 2g, 2g + 1: group g
  return _mm512_fmadd_ps(_mm512_mul_ps(dot, _mm512_loadu_ps(lanes)), s.d, acc);
}

// R rows of x (from m0) times output rows [n0, n1)
template <int R>
AVX512 void rows512(const Activations& x, int64_t m0, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                    int64_t N) {
  const int64_t supers = K / SUPER;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (n * supers + b) * BLOCK;
      for (int64_t line = 0; line < BLOCK; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
      const Super512 s = super512(block);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * supers + b;
        acc[r] = super512_dot(s, x.q.data() + at * SUPER, x.x32.data() + at * 64, x.lanes.data() + at * 16, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[(m0 + r) * N + n] = _mm512_reduce_add_ps(acc[r]);
  }
}

// one row of x: UNROLL output rows at a time (independent chains), their bytes asked for AHEAD early
AVX512 void row512(const Activations& x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t supers = K / SUPER;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m512 acc[UNROLL];
    for (int u = 0; u < UNROLL; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b)
      for (int u = 0; u < UNROLL; ++u) {
        const uint8_t* block = w + ((n + u) * supers + b) * BLOCK;
        for (int64_t line = 0; line < BLOCK; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
        acc[u] = super512_dot(super512(block), x.q.data() + b * SUPER, x.x32.data() + b * 64, x.lanes.data() + b * 16,
                              acc[u]);
      }
    for (int u = 0; u < UNROLL; ++u) y[n + u] = _mm512_reduce_add_ps(acc[u]);
  }
  if (n < n1) rows512<1>(x, 0, K, w, n, n1, y, 1);
}

// -- AVX2: each chunk in two halves of 32 bytes (groups 0-3, then 4-7) --------------------------------

AVX2 inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

AVX2 inline __m256i codes256(__m256i low4, __m256i top2) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  return _mm256_or_si256(_mm256_and_si256(low4, nibble), _mm256_and_si256(top2, bits45));
}

struct Half256 {
  __m256i u[4];
  __m256i sc[2];
  __m256 d;
};

AVX2 inline Half256 half256(const uint8_t* block, int half) {
  const __m256i l0 = load256(block + L0 + 32 * half), l1 = load256(block + L1 + 32 * half);
  const __m256i h = load256(block + H + 32 * half);
  Half256 s;
  s.u[0] = codes256(l0, _mm256_slli_epi16(h, 4));
  s.u[1] = codes256(_mm256_srli_epi16(l0, 4), _mm256_slli_epi16(h, 2));
  s.u[2] = codes256(l1, h);
  s.u[3] = codes256(_mm256_srli_epi16(l1, 4), _mm256_srli_epi16(h, 2));
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SCALES));
  const char o = static_cast<char>(8 * half);
  const __m128i even = _mm_setr_epi8(o, o, o, o, o + 2, o + 2, o + 2, o + 2, o + 4, o + 4, o + 4, o + 4, o + 6, o + 6,
                                     o + 6, o + 6);
  s.sc[0] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, even));
  s.sc[1] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, _mm_add_epi8(even, _mm_set1_epi8(1))));
  s.d = _mm256_set1_ps(d_of(block));
  return s;
}

AVX2 inline __m256 half256_dot(const Half256& s, int half, const int8_t* x, const int16_t* x32, const float* lanes,
                               __m256 acc) {
  __m256i part[2];
  for (int p = 0; p < 2; ++p) {
    const __m256i a = _mm256_maddubs_epi16(s.u[2 * p], load256(x + 128 * p + 32 * half));
    const __m256i b = _mm256_maddubs_epi16(s.u[2 * p + 1], load256(x + 128 * p + 64 + 32 * half));
    const __m256i pairs = load256(x32 + 32 * p + 16 * half);
    part[p] = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_add_epi16(a, b), pairs), s.sc[p]);
  }
  const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(part[0], part[1]));
  return _mm256_fmadd_ps(_mm256_mul_ps(dot, _mm256_loadu_ps(lanes + 8 * half)), s.d, acc);
}

template <int R>
AVX2 void rows256(const Activations& x, int64_t m0, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                  int64_t N) {
  const int64_t supers = K / SUPER;
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (n * supers + b) * BLOCK;
      for (int64_t line = 0; line < BLOCK; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
      for (int half = 0; half < 2; ++half) {
        const Half256 s = half256(block, half);
        for (int r = 0; r < R; ++r) {
          const int64_t at = (m0 + r) * supers + b;
          acc[r] = half256_dot(s, half, x.q.data() + at * SUPER, x.x32.data() + at * 64, x.lanes.data() + at * 16,
                               acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) y[(m0 + r) * N + n] = anatomy::avx2::hsum8(acc[r]);
  }
}

AVX2 void row256(const Activations& x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t supers = K / SUPER;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m256 acc[UNROLL];
    for (int u = 0; u < UNROLL; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t b = 0; b < supers; ++b)
      for (int u = 0; u < UNROLL; ++u) {
        const uint8_t* block = w + ((n + u) * supers + b) * BLOCK;
        for (int64_t line = 0; line < BLOCK; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
        for (int half = 0; half < 2; ++half)
          acc[u] = half256_dot(half256(block, half), half, x.q.data() + b * SUPER, x.x32.data() + b * 64,
                               x.lanes.data() + b * 16, acc[u]);
      }
    for (int u = 0; u < UNROLL; ++u) y[n + u] = anatomy::avx2::hsum8(acc[u]);
  }
  if (n < n1) rows256<1>(x, 0, K, w, n, n1, y, 1);
}

#endif  // ANATOMY_X86

// y [M, N] for output rows [n0, n1): tiles of TILE output rows, rows of x ROWS at a time
void q6_rows(const Activations& x, const Quantized& a, Isa level, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
             int64_t n1, float* y, int64_t N) {
#if ANATOMY_X86
  if (M == 1 && level >= Isa::Avx512) return row512(x, K, w, n0, n1, y);
  if (M == 1 && level >= Isa::Avx2) return row256(x, K, w, n0, n1, y);
  if (level >= Isa::Avx2) {
    for (int64_t t0 = n0; t0 < n1; t0 += TILE)
      for (int64_t m0 = 0; m0 < M; m0 += ROWS)
        up_to<ROWS>(static_cast<int>(std::min<int64_t>(ROWS, M - m0)), [&](auto R) {
          const int64_t t1 = std::min(n1, t0 + TILE);
          if (level >= Isa::Avx512) rows512<decltype(R)::value>(x, m0, K, w, t0, t1, y, N);
          else rows256<decltype(R)::value>(x, m0, K, w, t0, t1, y, N);
        });
    return;
  }
#endif
  q6_rows_portable(a, M, K, w, n0, n1, y, N);
}

// -- float activations (q6f) --------------------------------------------------------------------------

// x [M, K] in the layout's order: input k of each super-block at 64 * chunk + byte
std::vector<float> layout_order(const float* x, int64_t M, int64_t K) {
  std::vector<float> out(M * K);
  for (int64_t s = 0; s < M * K / SUPER; ++s)
    for (int64_t k = 0; k < SUPER; ++k) out[s * SUPER + 64 * q6_chunk(k) + q6_byte(k)] = x[s * SUPER + k];
  return out;
}

// x in its own order, each weight from q6_code: the arithmetic, for checking
void q6f_portable(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                  int64_t N) {
  const int64_t supers = K / SUPER;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t b = 0; b < supers; ++b) {
        const uint8_t* block = w + (n * supers + b) * BLOCK;
        uint16_t d;
        std::memcpy(&d, block, 2);
        const int8_t* sc = reinterpret_cast<const int8_t*>(block + SCALES);
        const float* xb = x + m * K + b * SUPER;
        float part = 0.f;
        for (int64_t k = 0; k < SUPER; ++k)
          part += static_cast<float>(q6_code(block, k) - 32) * (half_to_float(d) * sc[k / 16]) * xb[k];
        total += part;
      }
      y[m * N + n] = total;
    }
}

#if ANATOMY_X86

// AVX-512: a super-block as 16 pieces of 16 weights, piece i bytes 16 (i % 4) .. of chunk i / 4 (groups
// 2 (i % 4) and 2 (i % 4) + 1: sub-blocks 4 (i % 4) + i / 8 in lanes 0-7, that + 2 in lanes 8-15)
struct Floats512 {
  alignas(64) int8_t q[SUPER];  // the codes less 32, in the layout's order
  __m512 scale[8];              // d * sc spread over piece i's lanes: scale[2 (i % 4) + i / 8]
};

AVX512 inline void floats512(const uint8_t* block, Floats512& f) {
  const __m512i l0 = _mm512_loadu_si512(block + L0), l1 = _mm512_loadu_si512(block + L1);
  const __m512i h = _mm512_loadu_si512(block + H), off = _mm512_set1_epi8(32);
  _mm512_store_si512(f.q, _mm512_sub_epi8(codes512(l0, _mm512_slli_epi16(h, 4)), off));
  _mm512_store_si512(f.q + 64, _mm512_sub_epi8(codes512(_mm512_srli_epi16(l0, 4), _mm512_slli_epi16(h, 2)), off));
  _mm512_store_si512(f.q + 128, _mm512_sub_epi8(codes512(l1, h), off));
  _mm512_store_si512(f.q + 192, _mm512_sub_epi8(codes512(_mm512_srli_epi16(l1, 4), _mm512_srli_epi16(h, 2)), off));
  const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SCALES)));
  const __m512 ds = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(d_of(block)));  // [16]
  for (int j = 0; j < 4; ++j)
    for (int c2 = 0; c2 < 2; ++c2) {
      const __m512i first = _mm512_set1_epi32(4 * j + c2), second = _mm512_set1_epi32(4 * j + c2 + 2);
      const __m512i pick = _mm512_mask_blend_epi32(0xFF00, first, second);  // lanes 8-15: second
      f.scale[2 * j + c2] = _mm512_permutexvar_ps(pick, ds);
    }
}

AVX512 inline __m512 weights512(const Floats512& f, int i) {
  const __m128i codes = _mm_load_si128(reinterpret_cast<const __m128i*>(f.q + 16 * i));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), f.scale[2 * (i % 4) + i / 8]);
}

AVX512 inline void prefetch_block(const uint8_t* block) {
  for (int64_t line = 0; line < BLOCK; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
}

// R rows of x (layout order, row stride K) times output rows [n0, n1): y[r * N + n]
template <int R>
AVX512 void float_rows512(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t supers = K / SUPER;
  Floats512 f;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (n * supers + b) * BLOCK;
      prefetch_block(block);
      floats512(block, f);
      for (int i = 0; i < 16; ++i) {
        const __m512 wi = weights512(f, i);
        for (int r = 0; r < R; ++r)
          acc[r][i % 2] = _mm512_fmadd_ps(wi, _mm512_loadu_ps(x + r * K + b * SUPER + 16 * i), acc[r][i % 2]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
  }
}

// one row of x: UNROLL output rows at a time (2 * UNROLL independent chains over the same x)
AVX512 void float_row512(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t supers = K / SUPER;
  Floats512 f;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m512 acc[UNROLL][2];
    for (int u = 0; u < UNROLL; ++u) acc[u][0] = acc[u][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b)
      for (int u = 0; u < UNROLL; ++u) {
        const uint8_t* block = w + ((n + u) * supers + b) * BLOCK;
        prefetch_block(block);
        floats512(block, f);
        for (int i = 0; i < 16; ++i)
          acc[u][i % 2] = _mm512_fmadd_ps(weights512(f, i), _mm512_loadu_ps(x + b * SUPER + 16 * i), acc[u][i % 2]);
      }
    for (int u = 0; u < UNROLL; ++u) y[n + u] = _mm512_reduce_add_ps(_mm512_add_ps(acc[u][0], acc[u][1]));
  }
  if (n < n1) float_rows512<1>(x, K, w, n, n1, y, 1);
}

// AVX2: 32 pieces of 8 weights, piece i bytes 8 (i % 8) .. of chunk i / 8: group i % 8, sub-block
// 2 (i % 8) + i / 16, one scale
struct Floats256 {
  alignas(32) int8_t q[SUPER];
  float scale[16];  // d * sc
};

AVX2 inline void floats256(const uint8_t* block, Floats256& f) {
  const __m256i off = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half) {
    const __m256i l0 = load256(block + L0 + 32 * half), l1 = load256(block + L1 + 32 * half);
    const __m256i h = load256(block + H + 32 * half);
    const __m256i u[4] = {codes256(l0, _mm256_slli_epi16(h, 4)),
                          codes256(_mm256_srli_epi16(l0, 4), _mm256_slli_epi16(h, 2)), codes256(l1, h),
                          codes256(_mm256_srli_epi16(l1, 4), _mm256_srli_epi16(h, 2))};
    for (int c = 0; c < 4; ++c)
      _mm256_store_si256(reinterpret_cast<__m256i*>(f.q + 64 * c + 32 * half), _mm256_sub_epi8(u[c], off));
  }
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SCALES));
  const __m256 d = _mm256_set1_ps(d_of(block));
  _mm256_storeu_ps(f.scale, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
  _mm256_storeu_ps(f.scale + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
}

AVX2 inline __m256 weights256(const Floats256& f, int i) {
  const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(f.q + 8 * i));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), _mm256_set1_ps(f.scale[2 * (i % 8) + i / 16]));
}

// as float_rows512; one accumulator a row from 4 rows up (16 registers)
template <int R>
AVX2 void float_rows256(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  constexpr int A = R >= 4 ? 1 : 2;
  const int64_t supers = K / SUPER;
  Floats256 f;
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[R][A];
    for (int r = 0; r < R; ++r)
      for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (n * supers + b) * BLOCK;
      prefetch_block(block);
      floats256(block, f);
      for (int i = 0; i < 32; ++i) {
        const __m256 wi = weights256(f, i);
        for (int r = 0; r < R; ++r)
          acc[r][i % A] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(x + r * K + b * SUPER + 8 * i), acc[r][i % A]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 sum = acc[r][0];
      for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, acc[r][a]);
      y[r * N + n] = anatomy::avx2::hsum8(sum);
    }
  }
}

AVX2 void float_row256(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t supers = K / SUPER;
  Floats256 f;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m256 acc[UNROLL][2];
    for (int u = 0; u < UNROLL; ++u) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < supers; ++b)
      for (int u = 0; u < UNROLL; ++u) {
        const uint8_t* block = w + ((n + u) * supers + b) * BLOCK;
        prefetch_block(block);
        floats256(block, f);
        for (int i = 0; i < 32; ++i)
          acc[u][i % 2] = _mm256_fmadd_ps(weights256(f, i), _mm256_loadu_ps(x + b * SUPER + 8 * i), acc[u][i % 2]);
      }
    for (int u = 0; u < UNROLL; ++u) y[n + u] = anatomy::avx2::hsum8(_mm256_add_ps(acc[u][0], acc[u][1]));
  }
  if (n < n1) float_rows256<1>(x, K, w, n, n1, y, 1);
}

#endif  // ANATOMY_X86

// y [M, N] for output rows [n0, n1): `ordered` is x in the layout's order (the vector paths), `x` as it is
void q6f_rows(const float* x, const float* ordered, Isa level, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
              int64_t n1, float* y, int64_t N) {
#if ANATOMY_X86
  if (M == 1 && level >= Isa::Avx512) return float_row512(ordered, K, w, n0, n1, y);
  if (M == 1 && level >= Isa::Avx2) return float_row256(ordered, K, w, n0, n1, y);
  if (level >= Isa::Avx2) {
    for (int64_t t0 = n0; t0 < n1; t0 += TILE)
      for (int64_t m0 = 0; m0 < M; m0 += ROWS)
        up_to<ROWS>(static_cast<int>(std::min<int64_t>(ROWS, M - m0)), [&](auto R) {
          const int64_t t1 = std::min(n1, t0 + TILE);
          const float* xm = ordered + m0 * K;
          if (level >= Isa::Avx512) float_rows512<decltype(R)::value>(xm, K, w, t0, t1, y + m0 * N, N);
          else float_rows256<decltype(R)::value>(xm, K, w, t0, t1, y + m0 * N, N);
        });
    return;
  }
#endif
  q6f_portable(x, M, K, w, n0, n1, y, N);
}

// -- int16 activations (q6s) ------------------------------------------------------------------------

// x [M, K] quantized to int16 per super-block (one scale for its 256 inputs), the codes in the layout's
// order, and per super-block the sums of the codes of its 16 sub-blocks (the weights' -32 taken off there)
struct Int16Activations {
  std::vector<int16_t> q;     // [M, K]
  std::vector<float> scale;   // [M, K/256]
  std::vector<int32_t> sums;  // [M, K/256, 16]
};

Int16Activations int16_activations(const float* x, int64_t M, int64_t K) {
  const int64_t supers = K / SUPER;
  Int16Activations out{std::vector<int16_t>(M * K), std::vector<float>(M * supers), std::vector<int32_t>(M * K / 16)};
  for (int64_t s = 0; s < M * supers; ++s) {
    const float* from = x + s * SUPER;
    float most = 0.f;
    for (int64_t k = 0; k < SUPER; ++k) most = std::max(most, std::abs(from[k]));
    const float scale = most / 32767.f, inverse = most > 0.f ? 32767.f / most : 0.f;
    out.scale[s] = scale;
    for (int64_t k = 0; k < SUPER; ++k) {
      const auto code = static_cast<int16_t>(anatomy::round_even(from[k] * inverse));
      out.q[s * SUPER + 64 * q6_chunk(k) + q6_byte(k)] = code;
      out.sums[s * 16 + k / 16] += code;
    }
  }
  return out;
}

// the arithmetic, for checking: per sub-block an integer dot product, scaled once
void q6s_portable(const Int16Activations& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
                  float* y, int64_t N) {
  const int64_t supers = K / SUPER;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t b = 0; b < supers; ++b) {
        const uint8_t* block = w + (n * supers + b) * BLOCK;
        uint16_t d;
        std::memcpy(&d, block, 2);
        const int8_t* sc = reinterpret_cast<const int8_t*>(block + SCALES);
        const int16_t* qx = a.q.data() + (m * supers + b) * SUPER;
        float part = 0.f;
        for (int64_t s = 0; s < 16; ++s) {
          int64_t dot = -32 * static_cast<int64_t>(a.sums[(m * supers + b) * 16 + s]);
          for (int64_t k = 16 * s; k < 16 * s + 16; ++k) dot += q6_code(block, k) * qx[64 * q6_chunk(k) + q6_byte(k)];
          part += static_cast<float>(sc[s]) * static_cast<float>(dot);
        }
        total += half_to_float(d) * part * a.scale[m * supers + b];
      }
      y[m * N + n] = total;
    }
}

#if ANATOMY_X86

// Chunk c's 64 codes in two halves of 32 (bytes 32h ..), widened to int16 and multiplied with x's codes by
// vpmaddwd: int32 lane j of half h holds 2 products of group 4h + j / 4, sub-block 2 (4h + j / 4) + c / 2.
// Per super-block and row of x the lanes of chunks 0-1 and of 2-3 are summed apart (at most 4 * 63 * 32767),
// converted once and scaled by their sub-blocks' d * sc.
AVX512 void int16_rows512(const Int16Activations& a, int64_t m0, int R, int64_t K, const uint8_t* w, int64_t n0,
                          int64_t n1, float* y, int64_t N) {
  const int64_t supers = K / SUPER;
  alignas(64) int32_t index[2][2][16];  // [h][s] lane j -> its sub-block
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 2; ++s)
      for (int j = 0; j < 16; ++j) index[h][s][j] = 8 * h + 2 * (j / 4) + s;
  __m512i pick[2][2];
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 2; ++s) pick[h][s] = _mm512_load_si512(index[h][s]);
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[ROWS];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (n * supers + b) * BLOCK;
      prefetch_block(block);
      const __m512i l0 = _mm512_loadu_si512(block + L0), l1 = _mm512_loadu_si512(block + L1);
      const __m512i h = _mm512_loadu_si512(block + H);
      const __m512i u[4] = {codes512(l0, _mm512_slli_epi16(h, 4)),
                            codes512(_mm512_srli_epi16(l0, 4), _mm512_slli_epi16(h, 2)), codes512(l1, h),
                            codes512(_mm512_srli_epi16(l1, 4), _mm512_srli_epi16(h, 2))};
      __m512i wide[4][2];
      for (int c = 0; c < 4; ++c) {
        wide[c][0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(u[c]));
        wide[c][1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(u[c], 1));
      }
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SCALES)));
      const __m512 ds = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(d_of(block)));  // [16 sub-blocks]
      __m512 lane_ds[2][2];
      for (int hh = 0; hh < 2; ++hh)
        for (int s = 0; s < 2; ++s) lane_ds[hh][s] = _mm512_permutexvar_ps(pick[hh][s], ds);
      const __m512 minus32_ds = _mm512_mul_ps(ds, _mm512_set1_ps(-32.f));
      for (int r = 0; r < R; ++r) {
        const int64_t row = (m0 + r) * supers + b;
        const int16_t* qx = a.q.data() + row * SUPER;
        __m512 f = _mm512_mul_ps(minus32_ds, _mm512_cvtepi32_ps(_mm512_loadu_si512(a.sums.data() + row * 16)));
        for (int hh = 0; hh < 2; ++hh)
          for (int s = 0; s < 2; ++s) {
            __m512i dot = _mm512_madd_epi16(wide[2 * s][hh], _mm512_loadu_si512(qx + 128 * s + 32 * hh));
            dot = _mm512_add_epi32(dot, _mm512_madd_epi16(wide[2 * s + 1][hh], _mm512_loadu_si512(qx + 128 * s + 64 + 32 * hh)));
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), lane_ds[hh][s], f);
          }
        acc[r] = _mm512_fmadd_ps(f, _mm512_set1_ps(a.scale[row]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[(m0 + r) * N + n] = _mm512_reduce_add_ps(acc[r]);
  }
}

#endif  // ANATOMY_X86

// y [M, N] for output rows [n0, n1)
void q6s_rows(const Int16Activations& a, Isa level, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
              float* y, int64_t N) {
#if ANATOMY_X86
  if (level >= Isa::Avx512) {
    for (int64_t t0 = n0; t0 < n1; t0 += TILE)
      for (int64_t m0 = 0; m0 < M; m0 += ROWS)
        int16_rows512(a, m0, static_cast<int>(std::min<int64_t>(ROWS, M - m0)), K, w, t0, std::min(n1, t0 + TILE),
                      y, N);
    return;
  }
#endif
  q6s_portable(a, M, K, w, n0, n1, y, N);
}

void check(const at::Tensor& x, const at::Tensor& w, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, what, ": x must be a float matrix [M, K]");
  TORCH_CHECK(x.size(1) % SUPER == 0, what, ": K = ", x.size(1), " must be a multiple of ", SUPER);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(), what,
              ": weight must be uint8 [N, bytes]");
  TORCH_CHECK(w.size(1) == x.size(1) / SUPER * BLOCK, what, ": weight has ", w.size(1), " bytes a row, K = ",
              x.size(1), " needs ", x.size(1) / SUPER * BLOCK);
}

// the code of each of a ggml super-block's 256 inputs (ql [128], qh [64]: weights/int6.py's order)
void ggml_codes(const uint8_t* ql, const uint8_t* qh, uint8_t* q) {
  for (int64_t half = 0; half < 2; ++half, ql += 64, qh += 32, q += 128)
    for (int64_t l = 0; l < 32; ++l) {
      q[l] = (ql[l] & 0x0F) | (qh[l] & 3) << 4;
      q[l + 32] = (ql[l + 32] & 0x0F) | (qh[l] >> 2 & 3) << 4;
      q[l + 64] = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
      q[l + 96] = (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4;
    }
}

// int6's buffers (low [N, K/2], high [N, K/4], scale int8 [N, K/16], d float16 [N, K/256]) -> the q6 layout
at::Tensor pack_q6(const at::Tensor& low, const at::Tensor& high, const at::Tensor& scale, const at::Tensor& d) {
  const int64_t N = low.size(0), K = low.size(1) * 2, supers = K / SUPER;
  TORCH_CHECK(low.dim() == 2 && low.scalar_type() == at::kByte && K % SUPER == 0 && high.scalar_type() == at::kByte &&
              high.sizes() == at::IntArrayRef({N, K / 4}) && scale.scalar_type() == at::kChar &&
              scale.sizes() == at::IntArrayRef({N, K / 16}) && d.scalar_type() == at::kHalf &&
              d.sizes() == at::IntArrayRef({N, supers}),
              "anatomy::pack_q6: low uint8 [N, K/2], high uint8 [N, K/4], scale int8 [N, K/16], d float16 [N, K/256]");
  at::Tensor ql = low.contiguous(), qh = high.contiguous(), sc = scale.contiguous(), dd = d.contiguous();
  at::Tensor out = low.new_empty({N, supers * BLOCK});  // every byte written below
  const uint8_t* lo = ql.data_ptr<uint8_t>();
  const uint8_t* hi = qh.data_ptr<uint8_t>();
  const int8_t* s = sc.data_ptr<int8_t>();
  const at::Half* ds = dd.data_ptr<at::Half>();
  uint8_t* to = out.data_ptr<uint8_t>();
  at::parallel_for(0, N * supers, 64, [&](int64_t begin, int64_t end) {
    uint8_t q[SUPER];
    for (int64_t i = begin; i < end; ++i) {  // i = n * supers + b: the same index in every buffer
      uint8_t* block = to + i * BLOCK;
      ggml_codes(lo + i * 128, hi + i * 64, q);
      std::memcpy(block, ds + i, 2);
      std::memcpy(block + SCALES, s + i * 16, 16);
      for (int64_t t = 0; t < 64; ++t) {  // byte t of each chunk c holds input k + 8 c (q6_chunk, q6_byte)
        const uint8_t* at = q + 32 * (t / 8) + 4 * (t / 4 % 2) + t % 4;
        block[L0 + t] = static_cast<uint8_t>((at[0] & 0x0F) | (at[8] & 0x0F) << 4);
        block[L1 + t] = static_cast<uint8_t>((at[16] & 0x0F) | (at[24] & 0x0F) << 4);
        block[H + t] = static_cast<uint8_t>(at[0] >> 4 | (at[8] >> 4) << 2 | (at[16] >> 4) << 4 | (at[24] >> 4) << 6);
      }
    }
  });
  return out;
}

#if ANATOMY_HAS_AMX

// -- AMX: x rounded to int16 per group of 32, 16 rows of x and 16 output rows at a time ----------------
//
// Per super-block, 16 output rows' codes minus 32 are laid out as 16 AMX B tiles, one per sub-block of 16
// inputs (byte 64 j + 4 r + i: output row r, input 4 j + i), and their scales d * sc as 16 floats each;
// per sub-block and 16 rows of x (anatomy::Planes), one tdpbssd and one tdpbusd give the high and low
// bytes' int32 sums, 256 h + l the exact sum, scaled by d * sc times x's group scale. A panel of output
// tiles is unpacked one super-block at a time and every 16 rows of x pass over it, the outputs summed in
// a buffer across the super-blocks.

constexpr int64_t SUB = 16;          // inputs per sub-block
constexpr int64_t PANEL_TILES = 8;   // output tiles unpacked together
constexpr int64_t SUPER_B = 16 * 256;  // bytes of a tile's super-block as B tiles

// super-block `s` of output rows [16 t, 16 t + 16) as B tiles [16 sub-blocks][4 x 64] and scales [16][16]:
// a row's chunk c (its codes decoded 64 at a time, minus 32) holds in 4-byte piece p the inputs
// 32 (p / 2) + 8 c + 4 (p % 2) + 0..3, that is sub-block 2 (p / 2) + c / 2, 4-input row 2 (c % 2) + p % 2
ANATOMY_AMX void unpack_super(const uint8_t* w, int64_t row_bytes, int64_t t, int64_t s, int8_t* b, float* scales) {
  const __m512i low = _mm512_set1_epi8(0x0F), three = _mm512_set1_epi8(3), bias = _mm512_set1_epi8(32);
  for (int64_t r = 0; r < TILE; ++r) {
    const uint8_t* block = w + (t * TILE + r) * row_bytes + s * BLOCK;
    uint16_t dh;
    std::memcpy(&dh, block, 2);
    const float d = half_to_float(dh);
    for (int64_t j = 0; j < SUPER / SUB; ++j) scales[j * TILE + r] = d * static_cast<float>(static_cast<int8_t>(block[SCALES + j]));
    const __m512i l0 = _mm512_loadu_si512(block + L0), l1 = _mm512_loadu_si512(block + L1), h = _mm512_loadu_si512(block + H);
    const __m512i lows[4] = {_mm512_and_si512(l0, low), _mm512_and_si512(_mm512_srli_epi16(l0, 4), low),
                             _mm512_and_si512(l1, low), _mm512_and_si512(_mm512_srli_epi16(l1, 4), low)};
    for (int c = 0; c < 4; ++c) {
      const __m512i top = _mm512_and_si512(_mm512_srli_epi16(h, 2 * c), three);
      const __m512i codes = _mm512_sub_epi8(_mm512_or_si512(lows[c], _mm512_slli_epi16(top, 4)), bias);
      alignas(64) int32_t pieces[16];
      _mm512_store_si512(pieces, codes);
      for (int p = 0; p < 16; ++p) {
        const int64_t j = 2 * (p / 2) + c / 2, row4 = 2 * (c % 2) + p % 2;
        std::memcpy(b + j * 256 + row4 * 64 + 4 * r, &pieces[p], 4);
      }
    }
  }
}

ANATOMY_AMX void q6_amx_rows(const anatomy::Planes& x, int64_t M, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                             float* y, int64_t N) {
  const int64_t supers = K / SUPER, groups = K / G, blocks = (M + TILE - 1) / TILE, row_bytes = supers * BLOCK;
  std::vector<int8_t> codes(PANEL_TILES * SUPER_B);
  std::vector<float> scales(PANEL_TILES * SUPER_B / 16), acc(PANEL_TILES * blocks * TILE * TILE);
  const anatomy::AmxConfig config(4, SUB);  // a sub-block: B 4 rows of 64 bytes, A 16 bytes a row of x
  _tile_loadconfig(&config);  // per thread, after the allocations: the registers' shapes
  alignas(64) int32_t sums[2][TILE * TILE];
  for (int64_t p0 = t0; p0 < t1; p0 += PANEL_TILES) {
    const int64_t p1 = std::min(t1, p0 + PANEL_TILES);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t s = 0; s < supers; ++s) {
      for (int64_t t = p0; t < p1; ++t)
        unpack_super(w, row_bytes, t, s, codes.data() + (t - p0) * SUPER_B, scales.data() + (t - p0) * 256);
      for (int64_t mb = 0; mb < blocks; ++mb)
        for (int64_t t = p0; t < p1; ++t) {
          float* a = acc.data() + ((t - p0) * blocks + mb) * TILE * TILE;
          __m512 out[TILE];
          for (int r = 0; r < TILE; ++r) out[r] = _mm512_loadu_ps(a + TILE * r);
          for (int64_t j = 0; j < SUPER / SUB; ++j) {
            const int64_t at = (mb * groups + s * (SUPER / G) + j / 2) * TILE;  // x's [block, group, row]
            const int64_t half = (j % 2) * SUB;
            anatomy::amx_products(codes.data() + (t - p0) * SUPER_B + j * 256, x.high.data() + at * G + half,
                                  x.low.data() + at * G + half, G, sums);
            const __m512 sc = _mm512_loadu_ps(scales.data() + (t - p0) * 256 + j * TILE);
            for (int r = 0; r < TILE; ++r) {
              const __m512i sum = anatomy::amx_sum(sums, r);
              out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(sc, _mm512_set1_ps(x.scale[at + r])), out[r]);
            }
          }
          for (int r = 0; r < TILE; ++r) _mm512_storeu_ps(a + TILE * r, out[r]);
        }
    }
    for (int64_t t = p0; t < p1; ++t)
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(y + m * N + t * TILE, acc.data() + (((t - p0) * blocks + m / TILE) * TILE + m % TILE) * TILE,
                    TILE * sizeof(float));
  }
  _tile_release();
}

#endif  // ANATOMY_HAS_AMX

}  // namespace

namespace anatomy {

at::Tensor q6_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  check(x, w, "anatomy::q6_linear");
  const Isa level = anatomy::isa(portable);
  const Quantized a = quantize_rows(x, level);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const Activations xs = level >= Isa::Avx2 ? activations(a, M, K) : Activations{};
  const uint8_t* weights = w.data_ptr<uint8_t>();
  at::Tensor y = x.new_empty({M, N}, at::kFloat);
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, TILE, [&](int64_t n0, int64_t n1) { q6_rows(xs, a, level, M, K, weights, n0, n1, out, N); });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor q6f_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  check(x, w, "anatomy::q6f_linear");
  const Isa level = anatomy::isa(portable);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* xs = xf.data_ptr<float>();
  const std::vector<float> ordered = level >= Isa::Avx2 ? layout_order(xs, M, K) : std::vector<float>{};
  const uint8_t* weights = w.data_ptr<uint8_t>();
  at::Tensor y = xf.new_empty({M, N});
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, TILE, [&](int64_t n0, int64_t n1) {
    q6f_rows(xs, ordered.data(), level, M, K, weights, n0, n1, out, N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor q6s_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  check(x, w, "anatomy::q6s_linear");
  const Isa level = anatomy::isa(portable);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const Int16Activations a = int16_activations(xf.data_ptr<float>(), M, K);
  const uint8_t* weights = w.data_ptr<uint8_t>();
  at::Tensor y = xf.new_empty({M, N});
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, TILE, [&](int64_t n0, int64_t n1) { q6s_rows(a, level, M, K, weights, n0, n1, out, N); });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// y [M, N] on AMX: x rounded to int16 per group of 32 (not per 256 as q6s_linear), 16 rows at a time
at::Tensor q6_amx_linear(const at::Tensor& x, const at::Tensor& w) {
  check(x, w, "anatomy::q6_amx_linear");
  TORCH_CHECK(w.size(0) % TILE == 0, "anatomy::q6_amx_linear: N = ", w.size(0), " is not a multiple of ", TILE);
  TORCH_CHECK(anatomy::isa() >= Isa::Amx, "anatomy::q6_amx_linear: this CPU (or the kernels' limit) runs no AMX");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = xf.new_empty({M, N});
#if ANATOMY_HAS_AMX
  const Planes planes = split_codes(xf.data_ptr<float>(), M, K);
  const uint8_t* weights = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N / TILE, 1, [&](int64_t t0, int64_t t1) { q6_amx_rows(planes, M, K, weights, t0, t1, out, N); });
#endif
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q6_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("q6f_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("q6s_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("pack_q6(Tensor low, Tensor high, Tensor scale, Tensor d) -> Tensor");
  m.def("q6_amx_linear(Tensor x, Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q6_linear", anatomy::q6_linear);
  m.impl("q6f_linear", anatomy::q6f_linear);
  m.impl("q6s_linear", anatomy::q6s_linear);
  m.impl("pack_q6", pack_q6);
  m.impl("q6_amx_linear", anatomy::q6_amx_linear);
}
