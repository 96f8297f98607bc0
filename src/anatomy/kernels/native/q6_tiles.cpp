// GGUF Q6_K's few-row product on tiles of 16 output rows (as tiles.cpp's int4 tiles): one vpdpbusd
// multiplies 4 inputs of each of the 16 rows by the same 4 inputs of a row of x, the 16 lanes the 16
// outputs, so a sub-block's 16 inputs are 4 instructions into one exact int32 sum per output (q6k.cpp's
// row layout sums one output row across lanes and widens its codes to int16 first).
//
//   q6 tiles (pack_q6_tiles, from q6k.cpp's q6 layout [N, K/256 * 210]): per tile of 16 output rows and
//   super-block of 256 inputs, 3360 bytes (the file's 210 a row): d [16] float16, the sub-scales
//   sc [16 sub-blocks][16 rows] int8, then per group g of 32 inputs 384 bytes: 4 vectors of 64 whose byte
//   4r + i holds the low 4 bits of row r's input 4v + i (low nibble) and 4(v + 4) + i (high one), as q4
//   tiles hold their codes, then 2 vectors of 64 whose byte 4r + i holds the top 2 bits of row r's input
//   4(4u + c) + i in bits 2c, 2c + 1 (vector u)
//       y[m, n] = sum_g sx[m, g] * sum_{h = 2g, 2g+1} d[n] sc[h, n] sum_{i in h} (q[n, i] - 32) qx[m, i]
//   q6_tiles_linear(x [M, K] float, tiles [N/16, K/256, 3360], portable, bits) -> [M, N]
//
// bits = 16: x is rounded to int16 per group of 32 (tiles.cpp's bits = 16: the same codes) and each code
// split as q = 256 hi + lo (hi signed, lo unsigned): vpdpbusd takes codes (0..63) x hi and lo x codes, and
// 256 hi_sum + lo_sum is the exact sum (at most 16 * 63 * 32767 a sub-block). bits = 8: x is rounded to
// int8 per group of 32 (tiles.cpp's bits = 8), kept as hi with lo zero: one vpdpbusd where int16 takes
// two. Either way 32 times the sub-block's code sum comes off (the weights' -32). The AVX-512 VNNI loop runs
// where the CPU has it, the portable one elsewhere (the same arithmetic in the same order: the tests hold
// the two to the same bits); the kernel plan offers the tiles only where VNNI runs (candidates.py q6t, q6t16).

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "native.h"

#if ANATOMY_X86
#include <immintrin.h>
#endif

namespace {

using anatomy::AHEAD;
using anatomy::Isa;
using anatomy::Q6_BLOCK;
using anatomy::Q6_H;
using anatomy::Q6_L0;
using anatomy::Q6_L1;
using anatomy::Q6_SUPER;

constexpr int64_t G = 32;                        // inputs per group of x
constexpr int64_t SUB = 16;                      // inputs per sub-block (one sub-scale)
constexpr int64_t TILE = 16;                     // output rows per tile
constexpr int64_t BYTES = TILE * Q6_BLOCK;       // bytes per tile and super-block: 3360
constexpr int64_t SC = 32;                       // where a tile's super-block keeps its sub-scales
constexpr int64_t CODES = SC + TILE * SUB;       // and its groups' codes: 288
constexpr int64_t GROUP = 384;                   // bytes of codes per group: 256 low nibbles, 128 top bits
constexpr int64_t TOP = 256;                     // where a group keeps its top bits
constexpr int ROWS = 8;                          // rows of x per pass over the tiles

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// input i (0..31) of row r in a group: its low nibble's byte and its top bits' byte and shift
inline int64_t low_byte(int64_t r, int64_t i) { return 64 * (i / 4 % 4) + 4 * r + i % 4; }
inline int64_t top_byte(int64_t r, int64_t i) { return TOP + 64 * (i / 16) + 4 * r + i % 4; }
inline int top_shift(int64_t i) { return static_cast<int>(2 * (i / 4 % 4)); }

inline int32_t code_at(const uint8_t* group, int64_t r, int64_t i) {
  const uint8_t low = group[low_byte(r, i)];
  return (i >= 16 ? low >> 4 : low & 0x0F) | (group[top_byte(r, i)] >> top_shift(i) & 3) << 4;
}

// x [M, K] rounded to int16 per group of 32, each code as its high (signed) and low (unsigned) byte (int8:
// the code itself, lo zero), the groups' scales and per sub-block 32 times its codes' sum (the weights' -32)
struct Split {
  std::vector<int8_t> hi;
  std::vector<uint8_t> lo;       // [M, K] each
  std::vector<float> scale;      // [M, K/32]
  std::vector<int32_t> offset;   // [M, K/16]
  int bits;                      // 16 or 8
};

// row m of x's codes, the portable loop
void split_row(const float* x, int64_t m, int64_t K, Split& s) {
  const int64_t groups = K / G;
  const bool eight = s.bits == 8;
  std::vector<int16_t> q(K);
  std::vector<int32_t> sums(groups);
  anatomy::quantize_groups(x + m * K, K, eight ? 127.f : 32767.f, q.data(), s.scale.data() + m * groups, sums.data());
  for (int64_t k = 0; k < K; ++k) {
    s.hi[m * K + k] = static_cast<int8_t>(eight ? q[k] : q[k] >> 8);  // int16: the floor of q / 256
    s.lo[m * K + k] = static_cast<uint8_t>(eight ? 0 : q[k] & 0xFF);
    s.offset[(m * K + k) / SUB] += 32 * q[k];
  }
}

#if ANATOMY_X86
// the same codes 16 at a time (the products v * (1 / s) rounded to nearest even, as round_even rounds)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void split_row512(const float* x, int64_t m, int64_t K,
                                                                                 Split& s) {
  const __m512i byte = _mm512_set1_epi32(0xFF);
  const bool eight = s.bits == 8;
  const float limit = eight ? 127.f : 32767.f;
  for (int64_t g = 0; g < K / G; ++g) {
    const int64_t at = m * K + g * G;
    const __m512 a = _mm512_loadu_ps(x + at), b = _mm512_loadu_ps(x + at + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float scale = amax / limit, inv = scale > 0.f ? 1.f / scale : 0.f;
    const __m512i q[2] = {_mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv))),
                          _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)))};
    s.scale[m * (K / G) + g] = scale;
    for (int h = 0; h < 2; ++h) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s.hi.data() + at + SUB * h),
                       _mm512_cvtepi32_epi8(eight ? q[h] : _mm512_srai_epi32(q[h], 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s.lo.data() + at + SUB * h),
                       _mm512_cvtepi32_epi8(eight ? _mm512_setzero_si512() : _mm512_and_si512(q[h], byte)));
      s.offset[at / SUB + h] = 32 * _mm512_reduce_add_epi32(q[h]);
    }
  }
}
#endif

Split split_rows(const at::Tensor& x, Isa level, int bits) {
  const int64_t M = x.size(0), K = x.size(1);
  Split s{std::vector<int8_t>(M * K), std::vector<uint8_t>(M * K), std::vector<float>(M * K / G),
          std::vector<int32_t>(M * K / SUB, 0), bits};
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  for (int64_t m = 0; m < M; ++m) {
#if ANATOMY_X86
    if (level >= Isa::Avx512) {
      split_row512(xf.data_ptr<float>(), m, K, s);
      continue;
    }
#endif
    split_row(xf.data_ptr<float>(), m, K, s);
  }
  return s;
}

// the scales d * sc of a tile's super-block's sub-block h, row r
inline float sub_scale(const uint8_t* block, int64_t h, int64_t r) {
  uint16_t d;
  std::memcpy(&d, block + 2 * r, 2);
  return static_cast<float>(static_cast<int8_t>(block[SC + TILE * h + r])) * half_to_float(d);
}

// the arithmetic, for checking: the vector loop's, in its order
void tiles_portable(const Split& a, int64_t m0, int64_t M, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                    float* y, int64_t N) {
  const int64_t supers = K / Q6_SUPER, groups = K / G;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < TILE; ++r)
      for (int64_t m = m0; m < m0 + M; ++m) {
        float total = 0.f;
        for (int64_t b = 0; b < supers; ++b) {
          const uint8_t* block = w + (t * supers + b) * BYTES;
          for (int64_t g = 0; g < Q6_SUPER / G; ++g) {
            const uint8_t* group = block + CODES + GROUP * g;
            const int64_t at = m * K + b * Q6_SUPER + g * G;
            int32_t sum[2];
            for (int64_t h = 0; h < 2; ++h) {
              int32_t hi = 0, lo = 0;
              for (int64_t i = SUB * h; i < SUB * h + SUB; ++i) {
                hi += code_at(group, r, i) * a.hi[at + i];
                lo += code_at(group, r, i) * a.lo[at + i];
              }
              sum[h] = (a.bits == 8 ? hi : hi * 256 + lo) - a.offset[at / SUB + h];
            }
            const float f = std::fma(static_cast<float>(sum[0]), sub_scale(block, 2 * g, r),
                                     static_cast<float>(sum[1]) * sub_scale(block, 2 * g + 1, r));
            total = std::fma(f, a.scale[m * groups + b * Q6_SUPER / G + g], total);
          }
        }
        y[m * N + t * TILE + r] = total;
      }
}

#if ANATOMY_X86

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

// a group's 8 vectors of codes (vector j: inputs 4j .. 4j + 3 of the 16 rows, 0..63): the low nibbles
// (j >= 4: the high ones, shifted down) or the top bits shifted into bits 4-5
AVX512_VNNI inline void unpack(const uint8_t* group, __m512i (&q)[8]) {
  const __m512i nibble = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i top[2] = {_mm512_loadu_si512(group + TOP), _mm512_loadu_si512(group + TOP + 64)};
  for (int v = 0; v < 4; ++v) {
    const __m512i low = _mm512_loadu_si512(group + 64 * v);
    for (int half = 0; half < 2; ++half) {
      const __m512i t = top[half];
      const __m512i at45 = v == 0 ? _mm512_slli_epi16(t, 4) : v == 1 ? _mm512_slli_epi16(t, 2) : v == 2 ? t
                                                                     : _mm512_srli_epi16(t, 2);
      const __m512i l = half ? _mm512_srli_epi16(low, 4) : low;
      // (l & 0x0F) | (at45 & 0x30): imm 0xEC is (a & c) | b
      q[4 * half + v] = _mm512_ternarylogic_epi32(l, _mm512_and_si512(at45, bits45), nibble, 0xEC);
    }
  }
}

// the scales d * sc of sub-block h of a tile's super-block, for the 16 rows
AVX512_VNNI inline __m512 sub_scales(const uint8_t* block, __m512 d, int64_t h) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + SC + TILE * h));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), d);
}

// a sub-block's exact sums for the 16 rows: codes q[j0 .. j0 + 3] against x's bytes of its 16 inputs
// (EIGHT: the int8 codes in hi alone)
template <bool EIGHT>
AVX512_VNNI inline __m512i sub_sum(const __m512i* q, const int8_t* hi, const uint8_t* lo, int32_t offset) {
  const auto* h4 = reinterpret_cast<const anatomy::Word*>(hi);
  const auto* l4 = reinterpret_cast<const anatomy::Word*>(lo);
  __m512i sh = _mm512_setzero_si512(), sl = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {
    sh = _mm512_dpbusd_epi32(sh, q[j], _mm512_set1_epi32(h4[j]));
    if (!EIGHT) sl = _mm512_dpbusd_epi32(sl, _mm512_set1_epi32(l4[j]), q[j]);
  }
  const __m512i sum = EIGHT ? sh : _mm512_add_epi32(_mm512_slli_epi32(sh, 8), sl);
  return _mm512_sub_epi32(sum, _mm512_set1_epi32(offset));
}

// rows [m0, m0 + M) of x against tiles [t0, t1)
template <int M, bool EIGHT>
AVX512_VNNI void tiles_avx512(const Split& a, int64_t m0, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                              float* y, int64_t N) {
  const int64_t supers = K / Q6_SUPER, groups = K / G;
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < supers; ++b) {
      const uint8_t* block = w + (t * supers + b) * BYTES;
      for (int64_t line = 0; line < CODES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
      for (int64_t g = 0; g < Q6_SUPER / G; ++g) {
        const uint8_t* group = block + CODES + GROUP * g;
        for (int64_t line = 0; line < GROUP; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(group) + AHEAD + line, _MM_HINT_T0);
        __m512i q[8];
        unpack(group, q);
        const __m512 ds0 = sub_scales(block, d, 2 * g), ds1 = sub_scales(block, d, 2 * g + 1);
        for (int m = 0; m < M; ++m) {
          const int64_t at = (m0 + m) * K + b * Q6_SUPER + g * G;
          const __m512i s0 = sub_sum<EIGHT>(q, a.hi.data() + at, a.lo.data() + at, a.offset[at / SUB]);
          const __m512i s1 = sub_sum<EIGHT>(q + 4, a.hi.data() + at + SUB, a.lo.data() + at + SUB,
                                            a.offset[at / SUB + 1]);
          const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), ds0, _mm512_mul_ps(_mm512_cvtepi32_ps(s1), ds1));
          const float sx = a.scale[(m0 + m) * groups + b * Q6_SUPER / G + g];
          acc[m] = _mm512_fmadd_ps(f, _mm512_set1_ps(sx), acc[m]);
        }
      }
    }
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + (m0 + m) * N + t * TILE, acc[m]);
  }
}

#endif  // ANATOMY_X86

// one row's super-block (the q6 layout's 210 bytes) into row r of its tile's 3360 bytes: every byte of the
// row's share written once (its 32 codes of a group first unpacked)
void pack_row(const uint8_t* row, int64_t r, uint8_t* block) {
  std::memcpy(block + 2 * r, row, 2);  // d
  for (int64_t h = 0; h < Q6_SUPER / SUB; ++h) block[SC + TILE * h + r] = row[2 + h];
  for (int64_t g = 0; g < Q6_SUPER / G; ++g) {
    uint8_t code[G];  // anatomy::q6_code(row, 32 g + i), 8 inputs of each of the 4 chunks a byte at a time
    for (int64_t j = 0; j < 8; ++j) {
      const int low = row[Q6_L0 + 8 * g + j], high = row[Q6_L1 + 8 * g + j], top = row[Q6_H + 8 * g + j];
      code[j] = static_cast<uint8_t>((low & 0x0F) | (top & 3) << 4);
      code[8 + j] = static_cast<uint8_t>((low >> 4) | (top >> 2 & 3) << 4);
      code[16 + j] = static_cast<uint8_t>((high & 0x0F) | (top >> 4 & 3) << 4);
      code[24 + j] = static_cast<uint8_t>((high >> 4) | (top >> 6) << 4);
    }
    uint8_t* group = block + CODES + GROUP * g;
    for (int64_t v = 0; v < 4; ++v)
      for (int64_t i = 0; i < 4; ++i) {  // inputs 4v + i (low nibble) and 4(v + 4) + i (high)
        const int low = code[4 * v + i] & 0x0F, high = code[16 + 4 * v + i] & 0x0F;
        group[low_byte(r, 4 * v + i)] = static_cast<uint8_t>(low | high << 4);
      }
    for (int64_t u = 0; u < 2; ++u)
      for (int64_t i = 0; i < 4; ++i) {  // the top 2 bits of inputs 4(4u + c) + i in bits 2c, 2c + 1
        uint8_t top = 0;
        for (int64_t c = 0; c < 4; ++c)
          top |= static_cast<uint8_t>((code[4 * (4 * u + c) + i] >> 4) << top_shift(4 * c));
        group[top_byte(r, 16 * u + i)] = top;
      }
  }
}

// the q6 layout [N, K/256 * 210] -> q6 tiles [N/16, K/256, 3360]; tiles in parallel, each tile's
// super-blocks in order
at::Tensor pack_q6_tiles(const at::Tensor& q6) {
  const char* what = "anatomy::pack_q6_tiles";
  TORCH_CHECK(q6.dim() == 2 && q6.scalar_type() == at::kByte && q6.size(1) % Q6_BLOCK == 0, what,
              ": the q6 layout is uint8 [N, K/256 * ", Q6_BLOCK, "]");
  TORCH_CHECK(q6.size(0) % TILE == 0, what, ": N = ", q6.size(0), " is not a multiple of ", TILE);
  const int64_t N = q6.size(0), supers = q6.size(1) / Q6_BLOCK;
  const at::Tensor src = q6.contiguous();
  at::Tensor out = q6.new_empty({N / TILE, supers, BYTES});  // every byte is written
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / TILE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t b = 0; b < supers; ++b)
        for (int64_t r = 0; r < TILE; ++r)
          pack_row(from + ((t * TILE + r) * supers + b) * Q6_BLOCK, r, to + (t * supers + b) * BYTES);
  });
  return out;
}

}  // namespace

namespace anatomy {

at::Tensor q6_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits) {
  const char* what = "anatomy::q6_tiles_linear";
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, what, ": x must be a float matrix [M, K]");
  TORCH_CHECK(bits == 8 || bits == 16, what, ": bits = ", bits, ": x is rounded to 8 or 16 bits");
  TORCH_CHECK(x.size(1) % Q6_SUPER == 0, what, ": K = ", x.size(1), " must be a multiple of ", Q6_SUPER);
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kByte && w.is_contiguous() &&
              w.size(1) == x.size(1) / Q6_SUPER && w.size(2) == BYTES, what, ": tiles must be uint8 [N/16, K/256, ",
              BYTES, "] for K = ", x.size(1));
  const Isa level = anatomy::isa(portable);
  const int64_t M = x.size(0), N = w.size(0) * TILE, K = x.size(1);
  const Split a = split_rows(x, level, static_cast<int>(bits));
  at::Tensor y = x.new_empty({M, N}, at::kFloat);
  const uint8_t* tiles = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  anatomy::tile_passes(w.size(0), M, ROWS, [&](int64_t t0, int64_t t1, int64_t m0, int rows) {
#if ANATOMY_X86
    if (level >= Isa::Avx512Vnni)
      return anatomy::up_to<ROWS>(rows, [&](auto R) {
        if (bits == 8) return tiles_avx512<decltype(R)::value, true>(a, m0, K, tiles, t0, t1, out, N);
        tiles_avx512<decltype(R)::value, false>(a, m0, K, tiles, t0, t1, out, N);
      });
#endif
    tiles_portable(a, m0, rows, K, tiles, t0, t1, out, N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q6_tiles_linear(Tensor x, Tensor tiles, bool portable=False, int bits=16) -> Tensor");
  m.def("pack_q6_tiles(Tensor q6) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q6_tiles_linear", anatomy::q6_tiles_linear);
  m.impl("pack_q6_tiles", pack_q6_tiles);
}
