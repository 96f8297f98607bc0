// The AVX2 paths of the few-row products (avx2.h): what gemv.cpp's VNNI loops and exact.cpp's AVX-512
// loops compute, on CPUs with AVX2, FMA and F16C only (this project's machines without AVX-512).
//
// int8 activations: AVX2 has no byte dot product into 32 bits (VNNI's vpdpbusd); its vpmaddubsw
// multiplies unsigned by signed bytes and adds adjacent pairs into int16, vpmaddwd then sums pairs of
// those into int32. A q4 code (0..15) times an int8 activation (|q| <= 127) never saturates int16:
// 2 * 15 * 127 = 3810. A q8 code is signed: its magnitude goes in as the unsigned operand and its sign
// onto the activation (vpsignb), 2 * 128 * 127 = 32512 < 32767, as llama.cpp's AVX2 Q8_0 product does.
// One block holds two groups A and B of 32 inputs, which are summed in one vector [A B A B A B A B] so
// that one vector of scales [sA sB sA sB ...] scales both groups at once: a block's codes are taken as
// their 4-byte pieces interleaved, [A0 B0 A1 B1 | A4 B4 A5 B5] and [A2 B2 A3 B3 | A6 B6 A7 B7] (two
// unpacks per block, whatever the rows), and the activations the same way once per call (activations),
// so that the two int32 sums of a row add into [A B A B ...] directly.
//
// float activations: the codes widened to float32 8 at a time and decoded (q * d + m, or q * d) in
// registers, then one FMA per 8 inputs and row.
//
// Rows of x are taken INT8_CHUNK (int8) or CHUNK (float) at a time, their accumulators in the 16 vector
// registers beside a block's decoded codes; output rows a TILE at a time so that a tile's weights stay in
// the L1 cache across the chunks of rows.

#include "gemv_avx2.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "native.h"

#if ANATOMY_X86  // the whole file: other CPUs run gemv.cpp's and exact.cpp's portable loops

#include <immintrin.h>

#include "avx2.h"

namespace {

using anatomy::AHEAD;
using anatomy::PAIR;
using anatomy::Q4_BLOCK;
using anatomy::Q8_BLOCK;
using anatomy::Quantized;
using anatomy::up_to;

constexpr int64_t G = 32;     // inputs per group
constexpr int CHUNK = 4;      // rows of x per pass over a tile of weights (float activations: 2 x 4 accumulators)
constexpr int INT8_CHUNK = 8;  // the int8 loops' (one accumulator a row; 8 rows measured ~15% faster than 4)
constexpr int64_t TILE = 16;  // output rows per tile
constexpr int UNROLL = 4;     // output rows at a time in the one-row loops (independent FMA chains)

using anatomy::avx2::hmax8;
using anatomy::avx2::hsum8;

// 8 int32 lanes, each the sum of 4 of the 32 products u[j] * s[j] (u unsigned bytes, s signed)
AVX2 inline __m256i dot32(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

AVX2 inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// the float16 header of a block as floats in lanes 0..3
AVX2 inline __m256 header4(const uint8_t* block) {
  return _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block))));
}

AVX2 inline __m256 header2(const uint8_t* block) {
  return _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(block))));
}

// the 4-byte pieces of a and b interleaved (A0 B0 A1 B1 | A4 B4 A5 B5), (A2 B2 A3 B3 | A6 B6 A7 B7)
AVX2 inline void interleave(__m256i a, __m256i b, __m256i& lo, __m256i& hi) {
  lo = _mm256_unpacklo_epi32(a, b);
  hi = _mm256_unpackhi_epi32(a, b);
}

// the two groups' sums of a row, [A B A B A B A B] in float, from the interleaved u (unsigned) and s
AVX2 inline __m256 dots(__m256i u_lo, __m256i u_hi, __m256i s_lo, __m256i s_hi) {
  return _mm256_cvtepi32_ps(_mm256_add_epi32(dot32(u_lo, s_lo), dot32(u_hi, s_hi)));
}

// A q4 block decoded once for the rows of x: its codes (interleaved), [dA dB dA dB ...] and [mA mB mA mB ...]
struct Q4 {
  __m256i lo, hi;
  __m256 d, m;
  static constexpr int64_t BYTES = Q4_BLOCK;
  AVX2 static Q4 of(const uint8_t* block);
  // acc += one row's products with the block: x's 64 codes (interleaved), its lanes [scales x8 | minimum terms x8]
  AVX2 __m256 times(const int8_t* x, const float* lanes, __m256 acc) const;
};

AVX2 inline Q4 Q4::of(const uint8_t* block) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i packed = load(block + 8);
  const __m256 dm = header4(block);
  Q4 q;
  interleave(_mm256_and_si256(packed, low), _mm256_and_si256(_mm256_srli_epi16(packed, 4), low), q.lo, q.hi);
  q.d = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2));
  q.m = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 1, 3, 1, 3, 1, 3));
  return q;
}

AVX2 inline __m256 Q4::times(const int8_t* x, const float* lanes, __m256 acc) const {
  acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(lanes)), dots(lo, hi, load(x), load(x + G)), acc);
  return _mm256_fmadd_ps(m, _mm256_loadu_ps(lanes + 8), acc);
}

// 32 bits -> 32 bytes, byte j 16 where bit j is set, else 0 (a code's fifth bit)
AVX2 inline __m256i fifth_bits(const uint8_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(  // byte j holds byte j / 8 of the bits
      _mm256_set1_epi32(bits), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                        _mm256_set1_epi8(-1));  // all other bits of byte j are 1 already
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// A q5 block (q5.cpp): q4's, each code's fifth bit added before the interleave; the products the same
// (a code times an activation, 31 * 127 per pair, stays within int16)
struct Q5 : Q4 {
  static constexpr int64_t BYTES = anatomy::Q5_BLOCK;
  AVX2 static Q5 of(const uint8_t* block);
};

AVX2 inline Q5 Q5::of(const uint8_t* block) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i packed = load(block + 16);
  const __m256 dm = header4(block);
  const __m256i a = _mm256_or_si256(_mm256_and_si256(packed, low), fifth_bits(block + 8));
  const __m256i b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(packed, 4), low), fifth_bits(block + 12));
  Q5 q;
  interleave(a, b, q.lo, q.hi);
  q.d = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2));
  q.m = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 1, 3, 1, 3, 1, 3));
  return q;
}

// A q8 block: its codes' magnitudes and the codes themselves (for their signs), interleaved; [dA dB dA dB ...]
struct Q8 {
  __m256i u_lo, u_hi, s_lo, s_hi;
  __m256 d;
  static constexpr int64_t BYTES = Q8_BLOCK;
  AVX2 static Q8 of(const uint8_t* block);
  AVX2 __m256 times(const int8_t* x, const float* lanes, __m256 acc) const;
};

AVX2 inline Q8 Q8::of(const uint8_t* block) {
  const __m256i a = load(block + 8), b = load(block + 8 + G);
  Q8 q;
  interleave(_mm256_abs_epi8(a), _mm256_abs_epi8(b), q.u_lo, q.u_hi);
  interleave(a, b, q.s_lo, q.s_hi);
  q.d = _mm256_permutevar8x32_ps(header2(block), _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1));
  return q;
}

AVX2 inline __m256 Q8::times(const int8_t* x, const float* lanes, __m256 acc) const {
  const __m256i x_lo = _mm256_sign_epi8(load(x), s_lo), x_hi = _mm256_sign_epi8(load(x + G), s_hi);
  return _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(lanes)), dots(u_lo, u_hi, x_lo, x_hi), acc);
}

// x [M, K] int8 codes with each block's two groups interleaved by 4-byte pieces as the blocks' codes are
AVX2 std::vector<int8_t> interleaved(const int8_t* x, int64_t M, int64_t K) {
  std::vector<int8_t> out(M * K);
  for (int64_t i = 0; i < M * K; i += PAIR) {
    __m256i lo, hi;
    interleave(load(x + i), load(x + i + G), lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + i), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + i + G), hi);
  }
  return out;
}

// R rows of x (codes x, lanes l; row strides K and pairs * 16) times output rows [n0, n1) of w
template <int R, typename Block>
AVX2 void int8_rows(const int8_t* x, const float* l, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
                    int64_t N) {
  const int64_t pairs = K / PAIR, bytes = Block::BYTES;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * bytes;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const Block b = Block::of(row + p * bytes);
      for (int r = 0; r < R; ++r) acc[r] = b.times(x + r * K + p * PAIR, l + (r * pairs + p) * 16, acc[r]);
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum8(acc[r]);
  }
}

// One row of x: UNROLL output rows at a time, each block's bytes asked for AHEAD bytes early
template <typename Block>
AVX2 void int8_row(const int8_t* x, const float* l, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y) {
  const int64_t pairs = K / PAIR, bytes = Block::BYTES;
  int64_t n = n0;
  for (; n + UNROLL <= n1; n += UNROLL) {
    __m256 acc[UNROLL];
    for (int u = 0; u < UNROLL; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p)
      for (int u = 0; u < UNROLL; ++u) {
        const uint8_t* block = w + ((n + u) * pairs + p) * bytes;
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
        acc[u] = Block::of(block).times(x + p * PAIR, l + p * 16, acc[u]);
      }
    for (int u = 0; u < UNROLL; ++u) y[n + u] = hsum8(acc[u]);
  }
  if (n < n1) int8_rows<1, Block>(x, l, K, w, n, n1, y, 1);
}

template <typename Block>
void int8_product(const anatomy::avx2::Activations& a, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
                  float* y, int64_t N) {
  const int8_t* x = a.codes.data();
  const float* l = a.lanes.data();
  if (M == 1) return int8_row<Block>(x, l, K, w, n0, n1, y);
  const int64_t pairs = K / PAIR;
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t1 = std::min(n1, t0 + TILE);
    for (int64_t m0 = 0; m0 < M; m0 += INT8_CHUNK)
      up_to<INT8_CHUNK>(static_cast<int>(std::min<int64_t>(INT8_CHUNK, M - m0)), [&](auto R) {
        int8_rows<decltype(R)::value, Block>(x + m0 * K, l + m0 * pairs * 16, K, w, t0, t1, y + m0 * N, N);
      });
  }
}

// -- float activations ----------------------------------------------------------------------------

// 8 codes (bytes, unsigned or signed) as floats
AVX2 inline __m256 widen(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

AVX2 inline __m256 widen_signed(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// one group's 32 weights as 4 vectors of 8 floats, times R rows of x (row stride K) into acc[r]
template <int R>
AVX2 inline void group_times(const __m256 (&wv)[4], const float* x, int64_t K, __m256 (&acc)[R][2]) {
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * K;
    acc[r][0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xr), acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xr + 8), acc[r][1]);
    acc[r][0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xr + 16), acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xr + 24), acc[r][1]);
  }
}

// (Q5: the q5 layout's blocks, each code's fifth bit added)
template <int R, bool Q5 = false>
AVX2 void q4f_rows(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR, bytes = Q5 ? anatomy::Q5_BLOCK : Q4_BLOCK;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * bytes;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * bytes;
      _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
      const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block)));
      const __m256i packed = load(block + (Q5 ? 16 : 8));
      __m256i codes[2] = {_mm256_and_si256(packed, low), _mm256_and_si256(_mm256_srli_epi16(packed, 4), low)};
      if constexpr (Q5) {
        codes[0] = _mm256_or_si256(codes[0], fifth_bits(block + 8));
        codes[1] = _mm256_or_si256(codes[1], fifth_bits(block + 12));
      }
      for (int g = 0; g < 2; ++g) {  // group A: the low nibbles, inputs 0..31; B: the high ones, 32..63
        const __m256 d = _mm256_broadcastss_ps(_mm_shuffle_ps(dm, dm, 2 * g));
        const __m256 m = _mm256_broadcastss_ps(_mm_shuffle_ps(dm, dm, 2 * g + 1));
        __m256 wv[4];
        const __m128i lo128 = _mm256_castsi256_si128(codes[g]), hi128 = _mm256_extracti128_si256(codes[g], 1);
        wv[0] = _mm256_fmadd_ps(widen(lo128), d, m);
        wv[1] = _mm256_fmadd_ps(widen(_mm_srli_si128(lo128, 8)), d, m);
        wv[2] = _mm256_fmadd_ps(widen(hi128), d, m);
        wv[3] = _mm256_fmadd_ps(widen(_mm_srli_si128(hi128, 8)), d, m);
        group_times<R>(wv, x + p * PAIR + g * G, K, acc);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
  }
}

template <int R>
AVX2 void q8f_rows(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q8_BLOCK;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * Q8_BLOCK;
      _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(block)));
      for (int g = 0; g < 2; ++g) {
        const __m256 d = _mm256_broadcastss_ps(_mm_shuffle_ps(dd, dd, g));
        const uint8_t* codes = block + 8 + g * G;
        __m256 wv[4];
        for (int k = 0; k < 4; ++k) wv[k] = _mm256_mul_ps(widen_signed(codes + 8 * k), d);
        group_times<R>(wv, x + p * PAIR + g * G, K, acc);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
  }
}

template <typename Rows>
void float_product(int64_t M, int64_t K, int64_t n0, int64_t n1, float* y, int64_t N, Rows rows) {
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t1 = std::min(n1, t0 + TILE);
    for (int64_t m0 = 0; m0 < M; m0 += CHUNK)
      up_to<CHUNK>(static_cast<int>(std::min<int64_t>(CHUNK, M - m0)),
                   [&](auto R) { rows(R, m0, t0, t1, y + m0 * N); });
  }
}

}  // namespace

namespace anatomy::avx2 {

// one group of 32 inputs rounded to codes c of magnitude at most `limit`: returns s = max|x| / limit and
// puts the sum of the codes in `total`
AVX2 inline float group_codes(const float* x, float limit, __m256i c[4], int32_t& total) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i] = _mm256_loadu_ps(x + 8 * i)));
  const float s = hmax8(amax) / limit;
  const __m256 inv = _mm256_set1_ps(s > 0.f ? 1.f / s : 0.f);
  for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // nearest, ties to even
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  total = static_cast<int32_t>(hsum8(_mm256_cvtepi32_ps(sum)));
  return s;
}

AVX2 void quantize_row(const float* x, int64_t K, int8_t* q, float* scale, int32_t* sum) {
  for (int64_t g = 0; g < K / G; ++g, x += G, q += G) {
    __m256i c[4];
    scale[g] = group_codes(x, 127.f, c, sum[g]);
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),  // the packs interleave the 128-bit lanes: undo it
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

AVX2 void quantize_row16(const float* x, int64_t K, int16_t* q, int16_t* pairs, float* scale, int32_t* sum) {
  for (int64_t g = 0; g < K / G; ++g, x += G, q += G, pairs += G) {
    __m256i c[4];
    scale[g] = group_codes(x, 32767.f, c, sum[g]);
    for (int h = 0; h < 2; ++h) {  // packs interleave the 128-bit lanes: undo it, then swap inputs 1 and 2 of 4
      const __m256i codes = _mm256_permute4x64_epi64(_mm256_packs_epi32(c[2 * h], c[2 * h + 1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16 * h), codes);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + 16 * h),
                          _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(codes, 0xD8), 0xD8));
    }
  }
}

Activations activations(const Quantized& a, int64_t M, int64_t K) {
  const int64_t pairs = K / PAIR, groups = K / G;
  Activations out{interleaved(a.q.data(), M, K), std::vector<float>(M * pairs * 16)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const float s = a.scale[m * groups + g], c = s * a.sum[m * groups + g] / 4.f;
      float* at = out.lanes.data() + (m * pairs + g / 2) * 16 + g % 2;  // lanes 0, 2, 4, 6 (A) or 1, 3, 5, 7 (B)
      for (int lane : {0, 2, 4, 6}) at[lane] = s, at[8 + lane] = c;
    }
  return out;
}

void q4_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N) {
  int8_product<Q4>(x, M, K, w, n0, n1, y, N);
}

void q8_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N) {
  int8_product<Q8>(x, M, K, w, n0, n1, y, N);
}

void q5_rows(const Activations& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y,
             int64_t N) {
  int8_product<Q5>(x, M, K, w, n0, n1, y, N);
}

void q4f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  float_product(M, K, n0, n1, y, N, [&](auto R, int64_t m0, int64_t t0, int64_t t1, float* ym) {
    ::q4f_rows<decltype(R)::value>(x + m0 * K, K, w, t0, t1, ym, N);
  });
}

void q5f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  float_product(M, K, n0, n1, y, N, [&](auto R, int64_t m0, int64_t t0, int64_t t1, float* ym) {
    ::q4f_rows<decltype(R)::value, true>(x + m0 * K, K, w, t0, t1, ym, N);
  });
}

void q8f_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  float_product(M, K, n0, n1, y, N, [&](auto R, int64_t m0, int64_t t0, int64_t t1, float* ym) {
    ::q8f_rows<decltype(R)::value>(x + m0 * K, K, w, t0, t1, ym, N);
  });
}

}  // namespace anatomy::avx2

#endif  // ANATOMY_X86
