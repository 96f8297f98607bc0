// The int4 and int8 products with int8 or int16 activations on a layout made for a few rows of x at
// once: 16 output rows
// interleaved (a "tile"), so that one vpdpbusd multiplies 4 inputs of each of the 16 rows by the same 4
// inputs of a row of x, broadcast to every lane. The 16 lanes are the 16 outputs: a group of 32 inputs
// is 8 such instructions into one int32 sum per output, scaled once per group and row of x (gemv.cpp's
// q4 loops sum a row's products across lanes, unpack its codes for each output row and narrow and
// scale per 128 weights and output row: several times the instructions per product).
//
//   q4 tiles (pack_q4_tiles, from the q4 layout; N a multiple of 16): per tile of 16 output rows and
//   group g of 32 inputs, 320 bytes: d [16] float16, m [16] float16 (the rows' scales and minimums),
//   then 4 vectors of 64 bytes; byte 4r + i of vector v holds the code of row r, input 4v + i in its
//   low nibble and that of input 4(v + 4) + i in its high one
//       y[m, n] = sum_g sx[m, g] * (d[n, g] * sum_i q[n, i] qx[m, i] + m[n, g] * sum_i qx[m, i])
//   q4_tiles_linear(x [M, K] float, tiles [N/16, K/32, 320], bits) -> [M, N]
//
//   q5 tiles (pack_q5_tiles, from the q5 layout of q5.cpp): a q4 tile's 320 bytes with the codes' low 4
//   bits, then 8 masks of 64 bits: bit 4r + i of mask j the fifth bit of row r, input 4j + i (the vector
//   loop adds 16 under it: vpaddb with a mask), 384 bytes; the same sums as q4 tiles, codes 0..31
//   q5_tiles_linear(x [M, K] float, tiles [N/16, K/32, 384], bits) -> [M, N]
//
//   k4 tiles (pack_k4_tiles, from an int4 weight whose scales and minimums in each 256 inputs are whole
//   multiples (0..255) of one float16 each: GGUF Q4_K's d * sc and -dmin * m): per tile and super-block of
//   8 groups, 2368 bytes (4.625 bits a weight where q4 tiles take 5): d [16] and u [16] float16 (the
//   minimums' unit, -dmin), then per group sc [16] and mn [16] uint8 and the codes as a symmetric q4 tile
//   holds them (288 bytes); the same sums as q4 tiles with d * sc and u * mn (float32, exact) for d and m;
//   the product takes them by their size, [N/16, K/32, 296] (K a multiple of 256)
//
//   symmetric q4 and q5 tiles (pack_q4_tiles / pack_q5_tiles with symmetric = true, where every minimum is
//   -8 d, or -16 d: GGUF Q4_0, Q5_0): the same without m, 288 and 352 bytes (4.5 and 5.5 bits a weight, the
//   file's), m = -8 d or -16 d computed in float32 (exact: the same outputs bit for bit); the products take
//   them by their size
//
//   q8 tiles (pack_q8_tiles, from Q8_0-style codes and scales): per tile and group, 544 bytes: d [16]
//   float16, then 8 vectors of 64 bytes, byte 4r + i of vector j the int8 code of row r, input 4j + i
//       y[m, n] = sum_g sx[m, g] * d[n, g] * sum_i q[n, i] qx[m, i]
//   q8_tiles_linear(x [M, K] float, tiles [N/16, K/32, 544], bits) -> [M, N]
//
//   l4 tiles (pack_l4_tiles, from int8 codes that take at most 16 levels: IQ4_NL, IQ4_XS, MXFP4): per tile
//   and group, 336 bytes: d [16] float32, the 16 int8 levels, then each code's 4-bit index as q4 tiles
//   hold their codes; the vector loop looks the levels up (vpshufb) and sums them as q8 tiles do
//       y[m, n] = sum_g sx[m, g] * d[n, g] * sum_i level[q[n, i]] qx[m, i]
//   l4_tiles_linear(x [M, K] float, tiles [N/16, K/32, 336], bits) -> [M, N]
//
// bits = 8: x quantized to int8 per group of 32 as q4_linear's (q8 and l4 tiles, whose codes are signed: each
// code plus 128 as vpdpbusd's unsigned byte, and 128 times the row's code sum taken off the integer sum, which
// is exact). bits = 16: to int16 per group of 32
// (s = max|x| / 32767: the rounding error of int8's / 258); unsigned codes (q4, k4, q5) sum each x code as
// 256 hi + lo against the codes' bytes (16 vpdpbusd a group), signed ones (q8, l4) each 32-bit lane's two
// bytes 0 and 2, then 1 and 3, widened to int16 pairs (16 vpdpwssd): the same exact sums. For the products
// whose inputs int8 rounds too coarsely (a down projection's outlier channels), in place of float, and
// for the int8 LM head, whose products are the logits (~3e-5 of the float product; int8: ~6e-3).
//
// The AVX-512 VNNI loop runs where the CPU has it; elsewhere the portable one (for checking: the kernel
// plan offers tiles only where VNNI runs: kernels/candidates.py q4t, q4t16, q8t16, l4t16). Where AMX runs,
//   tiles_amx_linear(x [M, K] float, tiles of any kind) -> [M, N]
// gives the bits = 16 products of the same tiles on AMX's int8 tiles, bit for bit (below).

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
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
using anatomy::Q4_BLOCK;
using anatomy::Quantized;

constexpr int64_t G = 32;            // inputs per group
constexpr int64_t TILE = 16;         // output rows per tile
// the codes a tile holds (L4: 4-bit indices into a table of 16 int8 levels; Q4S, Q5S: q4 and q5 tiles whose
// minimums are -8 d and -16 d, not stored; K4: q4 tiles whose scales and minimums are factored per 256 inputs)
enum Kind { Q4, Q5, Q8, L4, Q4S, Q5S, K4 };
template <int T>
constexpr bool SYMMETRIC = T == Q4S || T == Q5S;
template <int T>
constexpr bool FIVE = T == Q5 || T == Q5S;  // codes of 5 bits: a fifth bit beside the 4-bit ones
// bytes per tile and group: q4 16 + 16 float16 and 256 bytes of codes; q5 those and 64 of fifth bits;
// q8 16 float16 and 512 codes; l4 16 float32 scales, the 16 int8 levels and 256 bytes of indices; the
// symmetric ones 32 fewer (no minimums); k4 a super-block's 2368 over its 8 groups
template <int T>
constexpr int64_t TILE_BYTES = T == Q8 ? 544 : T == Q5 ? 384 : T == Q5S ? 352 : T == L4 ? 336 : T == Q4S ? 288 :
                               T == K4 ? 296 : 320;
// where a tile's group keeps its 4-bit codes (q4, q5, l4), and an l4 tile's group its table of levels
template <int T>
constexpr int64_t CODES = T == L4 ? 80 : SYMMETRIC<T> || T == K4 ? 32 : 64;
constexpr int64_t LEVELS = 64;
template <int T>
constexpr bool MINS = T == Q4 || T == Q5 || T == K4 || SYMMETRIC<T>;  // the codes have a minimum term
template <int T>
constexpr bool SIGNED = T == Q8 || T == L4;  // signed codes (vpdpbusd takes them shifted by 128)
template <int T>
constexpr float OFFSET = T == Q4S ? -8.f : -16.f;  // a symmetric tile's minimum over its scale
template <int T>
constexpr int64_t FIFTH = CODES<T> + 256;  // where a q5 tile's group keeps its masks
constexpr int ROWS = 8;              // rows of x per pass over the tiles
// a k4 tile's super-block: its head (d, u), then 8 groups of 288 bytes (sc, mn, codes)
constexpr int64_t K4_HEAD = 64, K4_GROUP = 288, K4_GROUPS = 8;

// where group g of tile t starts in tiles of `groups` groups a row (k4: past its super-block's head)
template <int T>
inline int64_t group_offset(int64_t t, int64_t groups, int64_t g) {
  if constexpr (T == K4)
    return (t * groups + g / K4_GROUPS * K4_GROUPS) * TILE_BYTES<K4> + K4_HEAD + g % K4_GROUPS * K4_GROUP;
  return (t * groups + g) * TILE_BYTES<T>;
}
// a k4 tile's group's super-block head
template <typename Byte>
inline Byte* k4_head(Byte* block, int64_t g) { return block - K4_HEAD - g % K4_GROUPS * K4_GROUP; }

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }
// the float16 stored (little-endian, unaligned) at p
inline float half_at(const uint8_t* p) { return half_to_float(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// output row r's scale in tile group g (starting at `block`)
template <int T>
inline float scale_at(const uint8_t* block, int64_t r, int64_t g) {
  if constexpr (T == K4) return half_at(k4_head(block, g) + 2 * r) * block[r];
  if constexpr (T == L4) {
    float d;
    std::memcpy(&d, block + 4 * r, 4);
    return d;
  }
  return half_at(block + 2 * r);
}

// and its minimum (zero where the codes have none)
template <int T>
inline float minimum_at(const uint8_t* block, int64_t r, int64_t g) {
  if constexpr (SYMMETRIC<T>) return OFFSET<T> * scale_at<T>(block, r, g);
  if constexpr (!MINS<T>) return 0.f;
  if constexpr (T == K4) return half_at(k4_head(block, g) + 32 + 2 * r) * block[16 + r];
  return half_at(block + 32 + 2 * r);
}

// x [M, K] rounded to int16 per group of 32: codes, scale s = max|x| / 32767, sum of the codes, and the
// codes as the vector loop takes them: per 4 inputs, two 32-bit pairs (inputs 0 and 2, then 1 and 3)
struct Quantized16 {
  std::vector<int16_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<int32_t> pairs;  // [M, K/2]
  std::vector<int8_t> hi;      // [M, K]: each code as 256 hi + lo, hi signed, lo unsigned
  std::vector<uint8_t> lo;
};

// the codes' high and low bytes (q = 256 hi + lo), what the loop of unsigned codes takes
void split_bytes(Quantized16& a) {
  a.hi.resize(a.q.size()), a.lo.resize(a.q.size());
  for (size_t i = 0; i < a.q.size(); ++i) {
    a.hi[i] = static_cast<int8_t>(a.q[i] >> 8);  // the floor of q / 256
    a.lo[i] = static_cast<uint8_t>(a.q[i] & 0xFF);
  }
}

// `bytes`: the hi and lo planes too (the loop of unsigned codes reads those, signed codes the pairs)
Quantized16 quantize_rows16(const at::Tensor& x, Isa level, bool bytes) {
  const int64_t M = x.size(0), K = x.size(1), groups = K / G;
  Quantized16 out{std::vector<int16_t>(M * K), std::vector<float>(M * groups), std::vector<int32_t>(M * groups),
                  std::vector<int32_t>(M * K / 2)};
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* v = xf.data_ptr<float>();
#if ANATOMY_X86
  if (level >= Isa::Avx2) {  // the same numbers, 8 lanes at a time
    for (int64_t m = 0; m < M; ++m)
      anatomy::avx2::quantize_row16(v + m * K, K, out.q.data() + m * K,
                                    reinterpret_cast<int16_t*>(out.pairs.data()) + m * K,
                                    out.scale.data() + m * groups, out.sum.data() + m * groups);
    if (bytes) split_bytes(out);
    return out;
  }
#endif
  for (int64_t m = 0; m < M; ++m)
    anatomy::quantize_groups(v + m * K, K, 32767.f, out.q.data() + m * K, out.scale.data() + m * groups,
                             out.sum.data() + m * groups);
  const auto pair = [](int16_t lo, int16_t hi) {
    return static_cast<int32_t>(static_cast<uint16_t>(lo) | static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16);
  };
  for (int64_t i = 0; i < M * K; i += 4) {
    out.pairs[i / 2] = pair(out.q[i], out.q[i + 2]);
    out.pairs[i / 2 + 1] = pair(out.q[i + 1], out.q[i + 3]);
  }
  if (bytes) split_bytes(out);
  return out;
}

// where input i (0..31) of row r sits in a q4 tile's group: byte offset, and whether in the high nibble
inline int64_t code_byte(int64_t r, int64_t i) { return 64 + (i / 4 % 4) * 64 + 4 * r + i % 4; }
inline bool code_high(int64_t i) { return i / 4 >= 4; }
// and in a q8 tile's: its byte
inline int64_t q8_byte(int64_t r, int64_t i) { return 32 + i / 4 * 64 + 4 * r + i % 4; }

template <int T>
inline int32_t code_at(const uint8_t* block, int64_t r, int64_t i) {
  if constexpr (T == Q8) return static_cast<int8_t>(block[q8_byte(r, i)]);
  const uint8_t byte = block[code_byte(r, i) - 64 + CODES<T>];
  const int32_t low = code_high(i) ? byte >> 4 : byte & 0x0F;
  if constexpr (T == L4) return static_cast<int8_t>(block[LEVELS + low]);
  if constexpr (FIVE<T>)
    return low | ((block[FIFTH<T> + 8 * (i / 4) + (4 * r + i % 4) / 8] >> ((4 * r + i % 4) % 8)) & 1) << 4;
  return low;
}

template <int T, typename Codes>
void tiles_portable(const Codes& a, int64_t m0, int64_t M, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                    float* y, int64_t N) {
  const int64_t groups = K / G;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < TILE; ++r)
      for (int64_t m = m0; m < m0 + M; ++m) {
        float total = 0.f;
        for (int64_t g = 0; g < groups; ++g) {
          const uint8_t* block = w + group_offset<T>(t, groups, g);
          int32_t dot = 0;
          for (int64_t i = 0; i < G; ++i) dot += code_at<T>(block, r, i) * a.q[m * K + g * G + i];
          const float sx = a.scale[m * groups + g];
          total += scale_at<T>(block, r, g) * sx * dot + minimum_at<T>(block, r, g) * sx * a.sum[m * groups + g];
        }
        y[m * N + t * TILE + r] = total;
      }
}

#if ANATOMY_X86

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

// A group's 16 codes vectors unpacked once for the M rows of x: int8 activations take the 8 vectors of
// 4-byte pieces, int16 ones each piece as two int16 pairs (its inputs 0 and 2, then 1 and 3)
// (q5 tiles: 16 added to each code whose fifth bit its piece's mask sets)
// (l4 tiles: each code's level; SHIFTED: plus 128, an unsigned byte, the table shifted once for the 8 lookups)
template <int T, bool SHIFTED = false>
AVX512_VNNI inline void unpack(const uint8_t* block, __m512i (&q)[8]) {
  static_assert(!SHIFTED || T == L4, "only an l4 tile's levels are shifted in the lookup");
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) {
    const __m512i packed = _mm512_loadu_si512(block + CODES<T> + 64 * v);
    q[v] = _mm512_and_si512(packed, low);
    q[v + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
  }
  if constexpr (T == L4) {  // each code's level: vpshufb on the table, the same 16 bytes in every 128-bit lane
    __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + LEVELS)));
    if constexpr (SHIFTED) levels = _mm512_xor_si512(levels, _mm512_set1_epi8(static_cast<char>(0x80)));
    for (int j = 0; j < 8; ++j) q[j] = _mm512_shuffle_epi8(levels, q[j]);
  }
  if constexpr (FIVE<T>) {
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int j = 0; j < 8; ++j) {
      uint64_t fifth;
      std::memcpy(&fifth, block + FIFTH<T> + 8 * j, 8);
      q[j] = _mm512_mask_add_epi8(q[j], _cvtu64_mask64(fifth), q[j], sixteen);
    }
  }
}

template <int T>
AVX512_VNNI inline void unpack(const uint8_t* block, __m512i (&q)[16]) {
  const __m512i even = _mm512_set1_epi16(0x00FF);
  __m512i pieces[8];
  unpack<T>(block, pieces);
  for (int j = 0; j < 8; ++j) {
    if constexpr (T == L4) {  // signed levels: each byte sign-extended
      q[2 * j] = _mm512_srai_epi16(_mm512_slli_epi16(pieces[j], 8), 8);
      q[2 * j + 1] = _mm512_srai_epi16(pieces[j], 8);
    } else {
      q[2 * j] = _mm512_and_si512(pieces[j], even);
      q[2 * j + 1] = _mm512_srli_epi16(pieces[j], 8);
    }
  }
}

// 16 float16 at `at`
AVX512_VNNI inline __m512 halves(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}
// 16 float32 `unit` times 16 uint8 at `by` (a k4 group's d * sc, u * mn: exact in float32)
AVX512_VNNI inline __m512 times_bytes(__m512 unit, const uint8_t* by) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(by));
  return _mm512_mul_ps(unit, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)));
}

// tile group g's 16 scales (float16, l4's float32) and minimums (q4, q5; symmetric: -8 d, -16 d; else zeros)
template <int T>
AVX512_VNNI inline __m512 scales(const uint8_t* block, int64_t g) {
  if constexpr (T == K4) return times_bytes(halves(k4_head(block, g)), block);
  if constexpr (T == L4) return _mm512_loadu_ps(block);
  return halves(block);
}
template <int T>
AVX512_VNNI inline __m512 minimums(const uint8_t* block, int64_t g) {
  if constexpr (!MINS<T>) return _mm512_setzero_ps();
  if constexpr (SYMMETRIC<T>) return _mm512_mul_ps(scales<T>(block, g), _mm512_set1_ps(OFFSET<T>));
  if constexpr (T == K4) return times_bytes(halves(k4_head(block, g) + 32), block + 16);
  return halves(block + 32);
}

// a q8 tile's group, for int16 activations: each piece's signed bytes 0 and 2, then 1 and 3, as int16
AVX512_VNNI inline void unpack_q8(const uint8_t* block, __m512i (&q)[16]) {
  for (int j = 0; j < 8; ++j) {
    const __m512i piece = _mm512_loadu_si512(block + 32 + 64 * j);
    q[2 * j] = _mm512_srai_epi16(_mm512_slli_epi16(piece, 8), 8);
    q[2 * j + 1] = _mm512_srai_epi16(piece, 8);
  }
}

// a q8 or l4 tile's group for int8 activations: each signed code plus 128, an unsigned byte
template <int T>
AVX512_VNNI inline void unpack_shifted(const uint8_t* block, __m512i (&q)[8]) {
  if constexpr (T == Q8) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < 8; ++j) q[j] = _mm512_xor_si512(_mm512_loadu_si512(block + 32 + 64 * j), flip);
  } else {
    unpack<T, true>(block, q);
  }
}

// the 16 outputs' integer sums of one group with one row's codes x [32], in two chains
AVX512_VNNI inline __m512i dot(const __m512i (&q)[8], const int8_t* x) {
  const auto* x4 = reinterpret_cast<const anatomy::Word*>(x);
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  for (int j = 0; j < 8; j += 2) {
    s0 = _mm512_dpbusd_epi32(s0, q[j], _mm512_set1_epi32(x4[j]));
    s1 = _mm512_dpbusd_epi32(s1, q[j + 1], _mm512_set1_epi32(x4[j + 1]));
  }
  return _mm512_add_epi32(s0, s1);
}

// the same with int16 codes, x their pairs [16] (Quantized16::pairs)
AVX512_VNNI inline __m512i dot(const __m512i (&q)[16], const int32_t* x) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  for (int j = 0; j < 16; j += 2) {
    s0 = _mm512_dpwssd_epi32(s0, q[j], _mm512_set1_epi32(x[j]));
    s1 = _mm512_dpwssd_epi32(s1, q[j + 1], _mm512_set1_epi32(x[j + 1]));
  }
  return _mm512_add_epi32(s0, s1);
}

// the same with unsigned codes (q4, k4, q5) and x's int16 codes as bytes: 256 sum(q hi) + sum(q lo), codes
// times hi's signed bytes and lo's unsigned bytes times the codes (as signed, below 128), the same exact sum
// in 16 vpdpbusd on the 8 vectors of bytes (no widening to int16 pairs)
AVX512_VNNI inline __m512i dot(const __m512i (&q)[8], const int8_t* hi, const uint8_t* lo) {
  const auto* h4 = reinterpret_cast<const anatomy::Word*>(hi);
  const auto* l4 = reinterpret_cast<const anatomy::Word*>(lo);
  __m512i sh = _mm512_setzero_si512(), sl = _mm512_setzero_si512();
  for (int j = 0; j < 8; ++j) {
    sh = _mm512_dpbusd_epi32(sh, q[j], _mm512_set1_epi32(h4[j]));
    sl = _mm512_dpbusd_epi32(sl, _mm512_set1_epi32(l4[j]), q[j]);
  }
  return _mm512_add_epi32(_mm512_slli_epi32(sh, 8), sl);
}

// a row's codes of group g as `dot` takes them
inline const int8_t* codes_of(const Quantized& a, int64_t row, int64_t K, int64_t g) { return a.q.data() + row * K + g * G; }
inline const int32_t* codes_of(const Quantized16& a, int64_t row, int64_t K, int64_t g) {
  return a.pairs.data() + (row * K + g * G) / 2;
}

// rows [m0, m0 + M) of x against tiles [t0, t1)
template <int M, int T, typename Codes>
AVX512_VNNI void tiles_avx512(const Codes& a, int64_t m0, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                              float* y, int64_t N) {
  const int64_t groups = K / G;
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    __m512 units[2];  // a k4 tile's super-block head (d, u), converted once for its 8 groups
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = w + group_offset<T>(t, groups, g);
      for (int64_t line = 0; line < TILE_BYTES<T>; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
      if (T == K4 && g % K4_GROUPS == 0)
        units[0] = halves(k4_head(block, g)), units[1] = halves(k4_head(block, g) + 32);
      const __m512 d = T == K4 ? times_bytes(units[0], block) : scales<T>(block, g);
      const __m512 mins = T == K4 ? times_bytes(units[1], block + 16) : minimums<T>(block, g);
      constexpr bool int8 = std::is_same_v<Codes, Quantized>;
      constexpr bool bytes = int8 || !SIGNED<T>;  // int16 activations on unsigned codes: as hi and lo bytes
      __m512i q[bytes ? 8 : 16];
      if constexpr (int8 && SIGNED<T>) unpack_shifted<T>(block, q);
      else if constexpr (T == Q8) unpack_q8(block, q);
      else unpack<T>(block, q);
      for (int m = 0; m < M; ++m) {
        const int64_t row = m0 + m;
        __m512i s;
        if constexpr (int8 || SIGNED<T>) s = dot(q, codes_of(a, row, K, g));
        else s = dot(q, a.hi.data() + row * K + g * G, a.lo.data() + row * K + g * G);
        if constexpr (int8 && SIGNED<T>) s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * a.sum[row * groups + g]));
        const float sx = a.scale[row * groups + g];
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(sx)), acc[m]);
        if (MINS<T>) acc[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sx * static_cast<float>(a.sum[row * groups + g])), acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + (m0 + m) * N + t * TILE, acc[m]);
  }
}

#if ANATOMY_HAS_AMX

// -- AMX: the same int16 sums, 16 rows of x at a time ------------------------------------------------------
//
// x's int16 codes split into a high signed byte and a low unsigned one (q = 256 h + l); per tile, group
// and 16 rows of x, one tdpbssd (h x codes) and one tdpbusd (l x codes) give two int32 sums [16, 16]
// whose 256 h + l is exactly the VNNI loop's sum, scaled as that loop scales it: the same outputs, bit
// for bit. A group's codes are the B tile as the tile stores them (byte 64 j + 4 r + i: 8 rows of 64
// bytes): q8's read in place, q4's and q5's unpacked once per panel of tiles that stays in the cache
// while every 16 rows of x pass over it; a tile's 16 x 16 outputs stay in registers over its groups.

constexpr int64_t B_BYTES = 8 * 64;        // a group's codes as a B tile
constexpr int64_t PANEL = 256 << 10;       // bytes of unpacked codes per panel of tiles

using anatomy::Planes;

// the low byte of each of 16 int32 lanes
ANATOMY_AMX inline void store_bytes(void* to, __m512i q) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(to), _mm512_cvtepi32_epi8(q));
}

// row m of x [M, K] float rounded to int16 per group of 32 as quantize_rows16 rounds it (s = max|x| / 32767,
// the products v * (1 / s) rounded to nearest even: the same codes), into the planes
ANATOMY_AMX void split_row(const float* x, int64_t m, int64_t K, Planes& s) {
  const int64_t groups = K / G;
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int64_t g = 0; g < groups; ++g) {
    const float* v = x + m * K + g * G;
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float scale = amax / 32767.f, inv = scale > 0.f ? 1.f / scale : 0.f;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));  // nearest, ties to even
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    const int64_t at = (m / TILE * groups + g) * TILE + m % TILE;  // [block, group, row]
    s.scale[at] = scale;
    s.scaled_sum[at] = scale * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
    store_bytes(s.high.data() + at * G, _mm512_srai_epi32(qa, 8));  // the floor of q / 256
    store_bytes(s.high.data() + at * G + 16, _mm512_srai_epi32(qb, 8));
    store_bytes(s.low.data() + at * G, _mm512_and_si512(qa, byte));
    store_bytes(s.low.data() + at * G + 16, _mm512_and_si512(qb, byte));
  }
}

Planes split_rows(const float* x, int64_t M, int64_t K) {
  const int64_t blocks = (M + TILE - 1) / TILE, groups = K / G;
  Planes s{std::vector<int8_t>(blocks * TILE * K, 0), std::vector<uint8_t>(blocks * TILE * K, 0),
           std::vector<float>(blocks * groups * TILE, 0.f), std::vector<float>(blocks * groups * TILE, 0.f)};
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) split_row(x, m, K, s);
  });
  return s;
}

// tile t's outputs for rows [m0, m0 + 16) of x; codes(g): its group g's B tile
template <int T, typename Codes>
ANATOMY_AMX inline void tile_rows(const Planes& s, int64_t m0, int64_t M, int64_t groups, const uint8_t* tile,
                               Codes codes, float* y, int64_t N, int64_t column) {
  alignas(64) int32_t sums[2][TILE * TILE];
  __m512 acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t block = m0 / TILE;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* header = tile + group_offset<T>(0, groups, g);
    const __m512 d = scales<T>(header, g);
    const __m512 mins = minimums<T>(header, g);
    const int64_t at = (block * groups + g) * TILE;
    anatomy::amx_products(codes(g), s.high.data() + at * G, s.low.data() + at * G, G, sums);
    for (int r = 0; r < TILE; ++r) {
      const __m512i sum = anatomy::amx_sum(sums, r);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(s.scale[at + r])), acc[r]);
      if (MINS<T>) acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(s.scaled_sum[at + r]), acc[r]);
    }
  }
  for (int64_t r = 0; r < std::min<int64_t>(TILE, M - m0); ++r) _mm512_storeu_ps(y + (m0 + r) * N + column, acc[r]);
}

template <int T>
ANATOMY_AMX void tiles_amx(const Planes& s, int64_t M, int64_t K, const uint8_t* w, int64_t t0, int64_t t1, float* y,
                        int64_t N) {
  const int64_t groups = K / G, panel = std::max<int64_t>(1, PANEL / (groups * B_BYTES));
  std::vector<uint8_t> unpacked(T == Q8 ? 0 : panel * groups * B_BYTES);  // [panel, groups, B tile]
  const anatomy::AmxConfig config(8, G);
  _tile_loadconfig(&config);  // per thread, after the allocations: the registers' shapes
  for (int64_t p0 = t0; p0 < t1; p0 += panel) {
    const int64_t p1 = std::min(t1, p0 + panel);
    if constexpr (T != Q8)
      for (int64_t t = p0; t < p1; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          __m512i q[8];
          unpack<T>(w + group_offset<T>(t, groups, g), q);
          uint8_t* to = unpacked.data() + ((t - p0) * groups + g) * B_BYTES;
          for (int j = 0; j < 8; ++j) _mm512_storeu_si512(to + 64 * j, q[j]);
        }
    for (int64_t m0 = 0; m0 < M; m0 += TILE)
      for (int64_t t = p0; t < p1; ++t) {
        const uint8_t* tile = w + t * groups * TILE_BYTES<T>;
        if constexpr (T == Q8)
          tile_rows<T>(s, m0, M, groups, tile, [&](int64_t g) { return tile + g * TILE_BYTES<T> + 32; }, y, N, t * TILE);
        else
          tile_rows<T>(s, m0, M, groups, tile, [&](int64_t g) { return unpacked.data() + ((t - p0) * groups + g) * B_BYTES; }, y, N,
                       t * TILE);
      }
  }
  _tile_release();
}

#endif  // ANATOMY_HAS_AMX

#endif  // ANATOMY_X86

// fill(n, g, r, tile) for each row n of N and group g of `groups`, tile its tile's group (row r of 16) in
// tiles `to` [N/16, groups, TILE_BYTES<T>]; tiles in parallel, a tile's rows on one thread
template <int T, typename Fill>
void each_row_group(uint8_t* to, int64_t N, int64_t groups, Fill fill) {
  at::parallel_for(0, N / TILE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin * TILE; n < end * TILE; ++n)
      for (int64_t g = 0; g < groups; ++g) fill(n, g, n % TILE, to + (n / TILE * groups + g) * TILE_BYTES<T>);
  });
}

// a row layout of blocks of 64 inputs ([N, K/64 * bytes]) -> tiles [N/16, K/32, TILE_BYTES<T>]: fill(block,
// half, r, tile) puts group `half` of a row's block into row r of its tile's group
template <int T, typename Fill>
at::Tensor pack_tiles(const at::Tensor& rows, int64_t bytes, const char* what, Fill fill) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kByte && rows.size(1) % bytes == 0, what,
              ": the row layout is uint8 [N, K/64 * ", bytes, "]");
  TORCH_CHECK(rows.size(0) % TILE == 0, what, ": N = ", rows.size(0), " is not a multiple of ", TILE);
  const int64_t N = rows.size(0), pairs = rows.size(1) / bytes, groups = 2 * pairs;
  at::Tensor src = rows.contiguous();
  at::Tensor out = rows.new_zeros({N / TILE, groups, TILE_BYTES<T>});
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = out.data_ptr<uint8_t>();
  each_row_group<T>(to, N, groups, [&](int64_t n, int64_t g, int64_t r, uint8_t* tile) {
    fill(from + (n * pairs + g / 2) * bytes, g % 2, r, tile);
  });
  return out;
}

// group `half` of a row block ([dA mA dB mB] float16, then 32 bytes of codes at `codes`: A's low nibbles,
// B's high) into row r of a q4 (or q5) tile's group: its d, m (not in a symmetric tile) and the codes' low 4 bits
template <int T>
void fill_q4(const uint8_t* block, const uint8_t* codes, int64_t half, int64_t r, uint8_t* tile) {
  std::memcpy(tile + 2 * r, block + 4 * half, 2);  // d
  if constexpr (!SYMMETRIC<T>) std::memcpy(tile + 32 + 2 * r, block + 4 * half + 2, 2);  // m
  auto code = [&](int64_t i) { return static_cast<uint8_t>(half ? codes[i] >> 4 : codes[i] & 0x0F); };
  for (int64_t i = 0; i < G / 2; ++i)  // input i in the low nibble of its byte, input i + 16 in the high one
    tile[code_byte(r, i) - 64 + CODES<T>] = static_cast<uint8_t>(code(i) | code(i + G / 2) << 4);
}

// symmetric tiles hold no minimums: refuse a row layout ([dA mA dB mB] float16 at the start of each block of
// `bytes`) any of whose minimums is not `offset` times its scale
void check_symmetric(const at::Tensor& rows, int64_t bytes, float offset, const char* what) {
  const int64_t blocks = rows.numel() / bytes, per_row = rows.size(1) / bytes;
  const uint8_t* from = rows.data_ptr<uint8_t>();
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t half = 0; half < 2; ++half) {
      uint16_t h[2];
      std::memcpy(h, from + b * bytes + 4 * half, 4);
      const float d = half_to_float(h[0]), m = half_to_float(h[1]);
      TORCH_CHECK(m == offset * d, what, ": symmetric tiles need every minimum to be ", offset,
                  " times its scale; row ", b / per_row, ", group ", 2 * (b % per_row) + half, " has scale ", d,
                  " and minimum ", m);
    }
}

// the q4 layout [N, K/64 * 40] (gemv.cpp: [dA mA dB mB] float16, then the codes) -> tiles (symmetric: the
// minimums -8 d, left out)
template <int T>
at::Tensor pack_q4_kind(const at::Tensor& q4) {
  return pack_tiles<T>(q4, Q4_BLOCK, "anatomy::pack_q4_tiles",
                       [](const uint8_t* block, int64_t half, int64_t r, uint8_t* tile) {
    fill_q4<T>(block, block + 8, half, r, tile);
  });
}

// a row layout of blocks of `bytes` made contiguous, its minimums checked (check_symmetric) where it is one;
// pack_tiles refuses any other
at::Tensor symmetric_rows(const at::Tensor& layout, int64_t bytes, float offset, const char* what) {
  const at::Tensor rows = layout.contiguous();
  if (rows.dim() == 2 && rows.scalar_type() == at::kByte && rows.size(1) % bytes == 0)
    check_symmetric(rows, bytes, offset, what);
  return rows;
}

at::Tensor pack_q4_tiles(const at::Tensor& q4, bool symmetric) {
  if (!symmetric) return pack_q4_kind<Q4>(q4);
  return pack_q4_kind<Q4S>(symmetric_rows(q4, Q4_BLOCK, OFFSET<Q4S>, "anatomy::pack_q4_tiles"));
}

// the q5 layout [N, K/64 * 48] (q5.cpp: [dA mA dB mB] float16, the fifth bits, then the q4 layout's
// codes) -> tiles (symmetric: the minimums -16 d, left out)
template <int T>
at::Tensor pack_q5_kind(const at::Tensor& q5) {
  return pack_tiles<T>(q5, anatomy::Q5_BLOCK, "anatomy::pack_q5_tiles",
                       [](const uint8_t* block, int64_t half, int64_t r, uint8_t* tile) {
    fill_q4<T>(block, block + 16, half, r, tile);
    uint64_t fifth;
    std::memcpy(&fifth, block + 8, 8);
    for (int64_t i = 0; i < G; ++i) {
      const int64_t bit = 4 * r + i % 4;
      tile[FIFTH<T> + 8 * (i / 4) + bit / 8] |= static_cast<uint8_t>(((fifth >> (half * G + i)) & 1) << (bit % 8));
    }
  });
}

at::Tensor pack_q5_tiles(const at::Tensor& q5, bool symmetric) {
  if (!symmetric) return pack_q5_kind<Q5>(q5);
  return pack_q5_kind<Q5S>(symmetric_rows(q5, anatomy::Q5_BLOCK, OFFSET<Q5S>, "anatomy::pack_q5_tiles"));
}

// codes [N, K/2] in ggml's order (Int4Weight's), d and u [N, K/256] float16, sc and mn [N, K/32] uint8
// (w = q * d * sc + u * mn: GGUF Q4_K's with u = -dmin) -> k4 tiles [N/16, K/32, 296]
at::Tensor pack_k4_tiles(const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc, const at::Tensor& u,
                         const at::Tensor& mn) {
  const char* what = "anatomy::pack_k4_tiles";
  const int64_t N = codes.dim() == 2 ? codes.size(0) : 0, K = codes.dim() == 2 ? 2 * codes.size(1) : 0,
                groups = K / G, supers = groups / K4_GROUPS;
  const auto is = [&](const at::Tensor& t, at::ScalarType type, int64_t columns) {
    return t.dim() == 2 && t.scalar_type() == type && t.size(0) == N && t.size(1) == columns;
  };
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && K % (K4_GROUPS * G) == 0 &&
              is(d, at::kHalf, supers) && is(u, at::kHalf, supers) && is(sc, at::kByte, groups) &&
              is(mn, at::kByte, groups), what,
              ": codes uint8 [N, K/2] (K a multiple of 256), d and u float16 [N, K/256], sc and mn uint8 [N, K/32]");
  TORCH_CHECK(N % TILE == 0, what, ": N = ", N, " is not a multiple of ", TILE);
  const at::Tensor c = codes.contiguous(), dc = d.contiguous(), uc = u.contiguous(), s = sc.contiguous(),
                   m = mn.contiguous();
  at::Tensor out = codes.new_empty({N / TILE, groups, TILE_BYTES<K4>});
  const uint8_t *from = c.data_ptr<uint8_t>(), *ds = reinterpret_cast<const uint8_t*>(dc.data_ptr<at::Half>()),
                *us = reinterpret_cast<const uint8_t*>(uc.data_ptr<at::Half>()), *scs = s.data_ptr<uint8_t>(),
                *mns = m.data_ptr<uint8_t>();
  uint8_t* to = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / TILE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t b = 0; b < supers; ++b)
        for (int64_t r = 0, n = t * TILE; r < TILE; ++r, ++n) {
          uint8_t* head = k4_head(to + group_offset<K4>(t, groups, b * K4_GROUPS), 0);
          std::memcpy(head + 2 * r, ds + 2 * (n * supers + b), 2);
          std::memcpy(head + 32 + 2 * r, us + 2 * (n * supers + b), 2);
          for (int64_t g = b * K4_GROUPS; g < (b + 1) * K4_GROUPS; ++g) {
            uint8_t* block = to + group_offset<K4>(t, groups, g);
            block[r] = scs[n * groups + g];
            block[16 + r] = mns[n * groups + g];
            for (int64_t i = 0; i < G / 2; ++i)  // ggml's byte i: input i low, input i + 16 high, as a q4 tile's
              block[code_byte(r, i) - 64 + CODES<K4>] = from[(n * groups + g) * (G / 2) + i];
          }
        }
  });
  return out;
}

// codes [N, K] int8 and scales [N, K/32] (GGUF Q8_0: w = q * d) -> q8 tiles [N/16, K/32, 544]
at::Tensor pack_q8_tiles(const at::Tensor& codes, const at::Tensor& scale) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.size(1) % G == 0 &&
              scale.dim() == 2 && scale.size(0) == codes.size(0) && scale.size(1) == codes.size(1) / G,
              "anatomy::pack_q8_tiles: codes int8 [N, K] and scales [N, K/32]");
  TORCH_CHECK(codes.size(0) % TILE == 0, "anatomy::pack_q8_tiles: N = ", codes.size(0), " is not a multiple of ", TILE);
  const int64_t N = codes.size(0), K = codes.size(1), groups = K / G;
  at::Tensor c = codes.contiguous(), s = scale.to(at::kHalf).contiguous();
  at::Tensor out = codes.new_empty({N / TILE, groups, TILE_BYTES<Q8>}, at::kByte);
  const int8_t* from = c.data_ptr<int8_t>();
  const at::Half* scales = s.data_ptr<at::Half>();
  uint8_t* to = out.data_ptr<uint8_t>();
  each_row_group<Q8>(to, N, groups, [&](int64_t n, int64_t g, int64_t r, uint8_t* tile) {
    std::memcpy(tile + 2 * r, scales + n * groups + g, 2);
    for (int64_t i = 0; i < G; ++i) tile[q8_byte(r, i)] = static_cast<uint8_t>(from[n * K + g * G + i]);
  });
  return out;
}

// codes [N, K] int8, each one of `levels` [16] int8, and scales [N, K/32] (GGUF IQ4_NL, IQ4_XS, MXFP4:
// w = level * d) -> l4 tiles [N/16, K/32, 336]: per tile and group d [16] float32, the levels, then each
// code's index into them as a q4 tile holds its codes (the first of equal levels: FP4's two zeros)
at::Tensor pack_l4_tiles(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& levels) {
  const char* what = "anatomy::pack_l4_tiles";
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.size(1) % G == 0 && scale.dim() == 2 &&
              scale.size(0) == codes.size(0) && scale.size(1) == codes.size(1) / G && levels.numel() == 16 &&
              levels.scalar_type() == at::kChar, what, ": codes int8 [N, K], scales [N, K/32] and levels int8 [16]");
  TORCH_CHECK(codes.size(0) % TILE == 0, what, ": N = ", codes.size(0), " is not a multiple of ", TILE);
  const int64_t N = codes.size(0), K = codes.size(1), groups = K / G;
  at::Tensor c = codes.contiguous(), s = scale.to(at::kFloat).contiguous(), l = levels.contiguous();
  int index[256];
  std::fill(index, index + 256, -1);
  for (int i = 15; i >= 0; --i) index[l.data_ptr<int8_t>()[i] + 128] = i;
  const int8_t* from = c.data_ptr<int8_t>();
  for (int64_t i = 0; i < N * K; ++i)
    TORCH_CHECK(index[from[i] + 128] >= 0, what, ": code ", static_cast<int>(from[i]), " of row ", i / K,
                " is not one of the 16 levels");
  at::Tensor out = codes.new_zeros({N / TILE, groups, TILE_BYTES<L4>}, at::kByte);
  const float* scales = s.data_ptr<float>();
  uint8_t* to = out.data_ptr<uint8_t>();
  each_row_group<L4>(to, N, groups, [&](int64_t n, int64_t g, int64_t r, uint8_t* tile) {
    std::memcpy(tile + 4 * r, scales + n * groups + g, 4);
    std::memcpy(tile + LEVELS, l.data_ptr<int8_t>(), 16);
    for (int64_t i = 0; i < G; ++i) {
      const uint8_t code = static_cast<uint8_t>(index[from[n * K + g * G + i] + 128]);
      tile[code_byte(r, i) - 64 + CODES<L4>] |= code_high(i) ? code << 4 : code;
    }
  });
  return out;
}

// y [M, N] = the activations a against every tile, rows of x ROWS at a time, tiles split over the threads
template <int T, typename Codes>
void over_tiles(const Codes& a, const at::Tensor& w, Isa level, at::Tensor& y) {
  const int64_t M = y.size(0), N = y.size(1), K = w.size(1) * G;
  const uint8_t* tiles = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  anatomy::tile_passes(w.size(0), M, ROWS, [&](int64_t t0, int64_t t1, int64_t m0, int rows) {
#if ANATOMY_X86
    if (level >= Isa::Avx512Vnni)
      return anatomy::up_to<ROWS>(rows, [&](auto R) {
        tiles_avx512<decltype(R)::value, T>(a, m0, K, tiles, t0, t1, out, N);
      });
#endif
    tiles_portable<T>(a, m0, rows, K, tiles, t0, t1, out, N);
  });
}

// `sizes`: the bytes a group of the kinds the product takes, for the message
void check_tiles(const at::Tensor& x, const at::Tensor& w, int64_t bytes, const char* what,
                 const char* sizes = nullptr) {
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, what, ": x must be a float matrix [M, K]");
  TORCH_CHECK(x.size(1) % PAIR == 0, what, ": K = ", x.size(1), " must be a multiple of ", PAIR);
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(1) == x.size(1) / G &&
              w.size(2) == bytes, what, ": tiles must be uint8 [N/16, K/32, ", sizes ? sizes : std::to_string(bytes),
              "] for K = ", x.size(1));
  TORCH_CHECK(bytes != TILE_BYTES<K4> || w.size(1) % K4_GROUPS == 0, what,
              ": k4 tiles need K a multiple of 256, got K = ", x.size(1));
}

// a q4 (q5) product's kind: the symmetric one when the tiles have its size
inline bool has_size(const at::Tensor& w, int64_t bytes) { return w.dim() == 3 && w.size(2) == bytes; }

template <int T>
at::Tensor int_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits, const char* what) {
  const char* sizes = T == Q4 || T == Q4S || T == K4 ? "320 | 288 | 296" : FIVE<T> ? "384 | 352" : nullptr;
  check_tiles(x, w, TILE_BYTES<T>, what, sizes);
  TORCH_CHECK(bits == 8 || bits == 16, what, ": bits = ", bits, ": the activations are int8 or int16");
  const Isa level = anatomy::isa(portable);
  at::Tensor y = x.new_empty({x.size(0), w.size(0) * TILE}, at::kFloat);
  if (bits == 8) over_tiles<T>(anatomy::quantize_rows(x, level), w, level, y);
  else over_tiles<T>(quantize_rows16(x, level, !SIGNED<T>), w, level, y);
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// y [M, N] on AMX: x rounded to int16 per group of 32 as for bits = 16, 16 rows at a time (tiles_amx)
at::Tensor tiles_amx_linear(const at::Tensor& x, const at::Tensor& w) {
  const char* what = "anatomy::tiles_amx_linear";
  const bool known = has_size(w, TILE_BYTES<Q4>) || has_size(w, TILE_BYTES<Q5>) || has_size(w, TILE_BYTES<Q8>) ||
                     has_size(w, TILE_BYTES<L4>) || has_size(w, TILE_BYTES<Q4S>) || has_size(w, TILE_BYTES<Q5S>) ||
                     has_size(w, TILE_BYTES<K4>);
  TORCH_CHECK(known, what, ": tiles must be uint8 [N/16, K/32, 320 | 288 | 296 | 384 | 352 | 544 | 336] (q4, k4, q5, q8 "
              "or l4 tiles)");
  check_tiles(x, w, w.size(2), what);
  TORCH_CHECK(anatomy::isa() >= Isa::Amx, what, ": this CPU (or the kernels' limit) runs no AMX");
#if ANATOMY_HAS_AMX
  const int64_t M = x.size(0), N = w.size(0) * TILE, K = x.size(1);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const Planes s = split_rows(xf.data_ptr<float>(), M, K);
  at::Tensor y = x.new_empty({M, N}, at::kFloat);
  const uint8_t* tiles = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const int64_t bytes = w.size(2);
  at::parallel_for(0, w.size(0), 1, [&](int64_t t0, int64_t t1) {
    if (bytes == TILE_BYTES<Q4>) tiles_amx<Q4>(s, M, K, tiles, t0, t1, out, N);
    else if (bytes == TILE_BYTES<Q5>) tiles_amx<Q5>(s, M, K, tiles, t0, t1, out, N);
    else if (bytes == TILE_BYTES<L4>) tiles_amx<L4>(s, M, K, tiles, t0, t1, out, N);
    else if (bytes == TILE_BYTES<Q4S>) tiles_amx<Q4S>(s, M, K, tiles, t0, t1, out, N);
    else if (bytes == TILE_BYTES<Q5S>) tiles_amx<Q5S>(s, M, K, tiles, t0, t1, out, N);
    else if (bytes == TILE_BYTES<K4>) tiles_amx<K4>(s, M, K, tiles, t0, t1, out, N);
    else tiles_amx<Q8>(s, M, K, tiles, t0, t1, out, N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
#else
  return x;
#endif
}

}  // namespace

namespace anatomy {

Planes split_codes(const float* x, int64_t M, int64_t K) {
#if ANATOMY_HAS_AMX
  return split_rows(x, M, K);
#else
  return Planes{};
#endif
}

at::Tensor q4_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits) {
  if (has_size(w, TILE_BYTES<K4>)) return int_tiles_linear<K4>(x, w, portable, bits, "anatomy::q4_tiles_linear");
  if (has_size(w, TILE_BYTES<Q4S>)) return int_tiles_linear<Q4S>(x, w, portable, bits, "anatomy::q4_tiles_linear");
  return int_tiles_linear<Q4>(x, w, portable, bits, "anatomy::q4_tiles_linear");
}

at::Tensor q5_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits) {
  if (has_size(w, TILE_BYTES<Q5S>)) return int_tiles_linear<Q5S>(x, w, portable, bits, "anatomy::q5_tiles_linear");
  return int_tiles_linear<Q5>(x, w, portable, bits, "anatomy::q5_tiles_linear");
}

at::Tensor q8_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits) {
  return int_tiles_linear<Q8>(x, w, portable, bits, "anatomy::q8_tiles_linear");
}

at::Tensor l4_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits) {
  return int_tiles_linear<L4>(x, w, portable, bits, "anatomy::l4_tiles_linear");
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q4_tiles_linear(Tensor x, Tensor tiles, bool portable=False, int bits=8) -> Tensor");
  m.def("pack_q4_tiles(Tensor q4, bool symmetric=False) -> Tensor");
  m.def("pack_k4_tiles(Tensor codes, Tensor d, Tensor sc, Tensor u, Tensor mn) -> Tensor");
  m.def("q5_tiles_linear(Tensor x, Tensor tiles, bool portable=False, int bits=8) -> Tensor");
  m.def("pack_q5_tiles(Tensor q5, bool symmetric=False) -> Tensor");
  m.def("q8_tiles_linear(Tensor x, Tensor tiles, bool portable=False, int bits=16) -> Tensor");
  m.def("pack_q8_tiles(Tensor codes, Tensor scale) -> Tensor");
  m.def("tiles_amx_linear(Tensor x, Tensor tiles) -> Tensor");
  m.def("l4_tiles_linear(Tensor x, Tensor tiles, bool portable=False, int bits=16) -> Tensor");
  m.def("pack_l4_tiles(Tensor codes, Tensor scale, Tensor levels) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q4_tiles_linear", anatomy::q4_tiles_linear);
  m.impl("pack_q4_tiles", pack_q4_tiles);
  m.impl("pack_k4_tiles", pack_k4_tiles);
  m.impl("q5_tiles_linear", anatomy::q5_tiles_linear);
  m.impl("pack_q5_tiles", pack_q5_tiles);
  m.impl("q8_tiles_linear", anatomy::q8_tiles_linear);
  m.impl("pack_q8_tiles", pack_q8_tiles);
  m.impl("tiles_amx_linear", tiles_amx_linear);
  m.impl("l4_tiles_linear", anatomy::l4_tiles_linear);
  m.impl("pack_l4_tiles", pack_l4_tiles);
}
