// Attention of a few query rows over one cache's keys and values, reading the cache as it is stored:
// float32, bfloat16, float16, or 8-bit codes (int8 or fp8 e4m3 / e5m2) with a scale per token and head.
//
//   out [B, H, R, d] = softmax(q k^T * scale + mask) v        q [B, H, R, d]; k, v [B, H, T, d]
//
// R is a decode step's query rows of one KV head (its GQA group, folded: rep * S rows), T the cache's
// slots, mask [B|1, 1, R, T] additive (0 or -inf), shared by the heads. Keys and values are turned into
// floats a block of KEYS slots at a time, in a buffer that stays in the L1 cache, so a step reads the
// cache's own bytes (a quarter of float32's for 8-bit codes) and never a full-precision copy of it.
// Softmax is the online (flash) form over the blocks; one task per (batch row, KV head, slice of the
// slots), the slices merged at the end, so that 3 KV heads at batch 1 still keep 2 threads busy. A thread
// asks for its next task's keys and values (into L2) while it computes one (Fetch): the cache comes cold.
//
// The loops are vectorized for AVX-512 (16 lanes) and AVX2 (8 lanes): the scores of a vector's width of
// keys summed across lanes together, the weighted sum over keys with the head's output in registers;
// each is taken where native.h's isa() says it runs; the portable loops check them (tests) and serve
// any other CPU. The AVX-512 path weighs the values of a KV head's query rows three at a time, each
// value vector loaded once for them. (It copied each block of float32 rows into a buffer, summed each
// key's score alone and weighed one row at a time: 126 -> 48 us for 3 KV heads over 2,048 float32
// slots, 31 -> 12 over 256; hot, min of 7, a Zen 4 host.)
//
// 8-bit codes decode through a table of their 256 values (`lut`: int8 -> its integer, fp8 -> its
// float), times the token's scale: value = lut[code] * scale[b, h, t]; int8 codes (an int8 tensor)
// are their own integers, widened without the table.
//
// A paged cache is read in place through its block tables: with `tables` [B, nb], k and v are the
// pools [N, bs, H, d] (scales [N, bs, H]) and slot t of row b lives in block tables[b, t / bs], slot
// t % bs; T = nb * bs. No gathered copy of the rows' keys and values is made.

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "avx2.h"
#include "avx512.h"
#include "native.h"

namespace {

constexpr int64_t KEYS = 64;       // slots turned into floats at a time
constexpr int64_t KEYS_AVX2 = 32;  // the AVX2 path's: 32 float32 keys and values of 64 dims fill half of a 32 KB L1
constexpr int64_t MAX_DIM = 256;   // head dims up to this

enum Kind { F32 = 0, BF16 = 1, F16 = 2, CODES = 3 };

struct Cache {
  const void* data;
  int64_t sb, sh, st;  // strides of [B, H, T, d] in elements (d is contiguous); paged: of block, head, slot
  const float* scale;  // [B, H, T] as float32 (8-bit codes only), strides below
  int64_t ssb, ssh, sst;
  Kind kind;
  const int64_t* table = nullptr;  // paged: [B, nb] block ids, blocks of bs slots
  int64_t nb = 0, bs = 0;
  bool signed_codes = false;  // int8 codes: each is its own value (no table look-up; the loop vectorizes)
  bool f16c = false;          // float16 widened by F16C (a vector path), else one by one (the portable loops)
};

// where (b, h, t) starts, in elements of the data (scale: of the scales)
inline int64_t offset(const Cache& c, int64_t b, int64_t h, int64_t t, int64_t sb, int64_t sh, int64_t st) {
  if (c.table == nullptr) return b * sb + h * sh + t * st;
  return c.table[b * c.nb + t / c.bs] * sb + h * sh + (t % c.bs) * st;
}

// each(i, at, scale_at) for rows t0 + i, i < n, of one (b, h): where the row starts in the data and in the
// scales (offset's), found once per run of slots in one block (a paged cache's) instead of once per row
template <typename Each>
ANATOMY_INLINE void each_row(const Cache& c, int64_t b, int64_t h, int64_t t0, int64_t n, Each each) {
  for (int64_t i = 0; i < n;) {
    const int64_t t = t0 + i, run = c.table ? std::min(n - i, c.bs - t % c.bs) : n - i;
    int64_t at = offset(c, b, h, t, c.sb, c.sh, c.st);
    int64_t scale_at = c.scale ? offset(c, b, h, t, c.ssb, c.ssh, c.sst) : 0;
    for (const int64_t stop = i + run; i < stop; ++i, at += c.st, scale_at += c.sst) each(i, at, scale_at);
  }
}

#if ANATOMY_X86
// n float16 values widened to float32 by F16C, 8 at a time
AVX2 void widen_f16(const uint16_t* src, float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  for (; j < n; ++j) dst[j] = _cvtsh_ss(src[j]);
}
#else
// F16C is x86's: one by one (not taken: only a vector path sets Cache::f16c)
void widen_f16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(c10::Half(src[j], c10::Half::from_bits()));
}
#endif

inline float bf16_to_float(uint16_t x) {
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// rows [t0, t0 + n) of one (b, h) of the cache as floats: out[i * d + j]
ANATOMY_INLINE void decode_rows(const Cache& c, const float* lut, int64_t b, int64_t h,
                                                       int64_t t0, int64_t n, int64_t d, float* out) {
  each_row(c, b, h, t0, n, [&](int64_t i, int64_t at, int64_t scale_at) {
    float* row = out + i * d;
    if (c.kind == F32) {
      std::memcpy(row, static_cast<const float*>(c.data) + at, d * sizeof(float));
    } else if (c.kind == BF16) {
      const uint16_t* src = static_cast<const uint16_t*>(c.data) + at;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) row[j] = bf16_to_float(src[j]);
    } else if (c.kind == F16) {
      const uint16_t* src = static_cast<const uint16_t*>(c.data) + at;
      if (c.f16c) {
        widen_f16(src, row, d);
      } else {
        for (int64_t j = 0; j < d; ++j) row[j] = static_cast<float>(c10::Half(src[j], c10::Half::from_bits()));
      }
    } else if (c.signed_codes) {
      const int8_t* src = static_cast<const int8_t*>(c.data) + at;
      const float s = c.scale[scale_at];
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) row[j] = static_cast<float>(src[j]) * s;
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(c.data) + at;
      const float s = c.scale[scale_at];
      for (int64_t j = 0; j < d; ++j) row[j] = lut[src[j]] * s;
    }
  });
}

// pointers to rows [t0, t0 + n) of one (b, h) as floats: the cache's own rows (float32), else decoded
// into buf (inlined into each vector path, whose instructions the widening loops then take)
ANATOMY_INLINE void rows_of(const Cache& c, const float* lut, int64_t b, int64_t h, int64_t t0,
                                                   int64_t n, int64_t d, float* buf, const float** rows) {
  if (c.kind == F32) {
    each_row(c, b, h, t0, n, [&](int64_t i, int64_t at, int64_t) { rows[i] = static_cast<const float*>(c.data) + at; });
    return;
  }
  decode_rows(c, lut, b, h, t0, n, d, buf);
  for (int64_t i = 0; i < n; ++i) rows[i] = buf + i * d;
}

// The key and value rows of one (b, h) and slots [t, t1) that a thread reads next (its next task's), asked
// for into L2 `per` slots a call while it computes the task before. A decode step's cache comes cold from
// memory (the weights streamed through the caches since the step before), and read as the loops use it,
// row by row, it waits on memory's latency rather than its bandwidth. A prefetch is a hint: no value changes.
struct Fetch {
  const Cache* k = nullptr;
  const Cache* v = nullptr;
  int64_t b = 0, h = 0, t = 0, t1 = 0, d = 0, per = 0;

  void some() {
    const int64_t n = std::min(t1, t + per) - t;
    if (n <= 0) return;
    for (const Cache* c : {k, v}) {
      const int64_t size = c->kind == F32 ? 4 : c->kind == CODES ? 1 : 2;  // bytes of an element
      const char* data = static_cast<const char*>(c->data);
      each_row(*c, b, h, t, n, [&](int64_t, int64_t at, int64_t) {
        for (int64_t line = 0; line < d * size; line += 64) __builtin_prefetch(data + at * size + line, 0, 2);  // T1
      });
    }
    t += n;
  }
};

struct Partial {  // one slice's online-softmax state per query row: max, sum of exp, weighted values
  std::vector<float> max, sum, acc;
};

// one (b, h) and slots [t0, t1): the partial softmax of every query row
ANATOMY_INLINE void attend_slice(const float* q, int64_t R, int64_t d, const Cache& k,
                                                        const Cache& v, const float* lut, const float* mask,
                                                        int64_t mr, int64_t mt, int64_t b, int64_t h, int64_t t0,
                                                        int64_t t1, float scale, Partial& p) {
  p.max.assign(R, -std::numeric_limits<float>::infinity());
  p.sum.assign(R, 0.f);
  p.acc.assign(R * d, 0.f);
  float kb[KEYS * MAX_DIM], vb[KEYS * MAX_DIM], s[KEYS];
  for (int64_t start = t0; start < t1; start += KEYS) {
    const int64_t n = std::min(KEYS, t1 - start);
    decode_rows(k, lut, b, h, start, n, d, kb);
    decode_rows(v, lut, b, h, start, n, d, vb);
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + r * d;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < d; ++j) dot += qr[j] * kb[i * d + j];
        s[i] = dot * scale + (mask ? mask[r * mr + (start + i) * mt] : 0.f);
        block_max = std::max(block_max, s[i]);
      }
      if (block_max == -std::numeric_limits<float>::infinity()) continue;  // every key of the block masked
      const float new_max = std::max(p.max[r], block_max);
      const float correction = std::exp(p.max[r] - new_max);  // 0 when the row had nothing yet
      float* acc = p.acc.data() + r * d;
      float total = p.sum[r] * correction;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) acc[j] *= correction;
      for (int64_t i = 0; i < n; ++i) {
        const float w = std::exp(s[i] - new_max);
        total += w;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) acc[j] += w * vb[i * d + j];
      }
      p.sum[r] = total;
      p.max[r] = new_max;
    }
  }
}

#if ANATOMY_X86

// -- AVX-512: the same arithmetic, vectorized as the AVX2 path below is: float32 keys and values read
// where they lie (bfloat16 widened by a shift, 8-bit codes decoded), the scores of 16 keys summed
// across lanes together (a transpose by unpacks and lane shuffles), exp over a block of keys, and the
// weighted sum over keys with the head's output in registers; taken when d is a multiple of 16 -------

using anatomy::avx512::exp512;

// [sum(a[0]), ..., sum(a[15])]: pairs interleaved by unpacks (16 -> 8 -> 4 vectors, each 128-bit lane
// then holding 4 keys' partial sums), then the 128-bit lanes added across by shuffles (4 -> 2 -> 1)
AVX512 inline __m512 sums16(const __m512 (&a)[16]) {
  __m512 b[8], c[4], e[2];
  for (int j = 0; j < 8; ++j)
    b[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  for (int j = 0; j < 4; ++j) {
    const __m512d x = _mm512_castps_pd(b[2 * j]), y = _mm512_castps_pd(b[2 * j + 1]);
    c[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int j = 0; j < 2; ++j)
    e[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88), _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xDD));
}

// the scores s[0..n) of query row qr against the keys' rows (d a multiple of 16)
AVX512 inline void scores16(const float* qr, const float* const* keys, int64_t n, int64_t d, float scale,
                            const float* mask, float* s) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 a[16];
    for (int j = 0; j < 16; ++j) a[j] = _mm512_mul_ps(_mm512_loadu_ps(qr), _mm512_loadu_ps(keys[i + j]));
    for (int64_t c = 16; c < d; c += 16) {
      const __m512 q = _mm512_loadu_ps(qr + c);
      for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(q, _mm512_loadu_ps(keys[i + j] + c), a[j]);
    }
    const __m512 add = mask ? _mm512_loadu_ps(mask + i) : _mm512_setzero_ps();
    _mm512_storeu_ps(s + i, _mm512_fmadd_ps(sums16(a), sc, add));
  }
  for (; i < n; ++i) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(qr + c), _mm512_loadu_ps(keys[i] + c), a);
    s[i] = _mm512_reduce_add_ps(a) * scale + (mask ? mask[i] : 0.f);
  }
}

// acc[g][c, c + 16U) = acc[g] * correction[g] + sum_j w[g][j] values[j][c, c + 16U) for G query rows g
// (w and acc strides KEYS and d): each value vector is loaded once for the G rows, and G * U sums are
// in flight (one row's U alone wait on the latency of their FMAs)
template <int G, int U>
AVX512 inline void weigh_values16(const float* w, const float* const* values, int64_t n, int64_t c, int64_t d,
                                  const float* correction, float* acc) {
  __m512 a[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u)
      a[g][u] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * d + c + 16 * u), _mm512_set1_ps(correction[g]));
  for (int64_t j = 0; j < n; ++j) {
    __m512 row[U];
    for (int u = 0; u < U; ++u) row[u] = _mm512_loadu_ps(values[j] + c + 16 * u);
    for (int g = 0; g < G; ++g) {
      const __m512 wj = _mm512_set1_ps(w[g * KEYS + j]);
      for (int u = 0; u < U; ++u) a[g][u] = _mm512_fmadd_ps(wj, row[u], a[g][u]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(acc + g * d + c + 16 * u, a[g][u]);
}

// the G rows' weighted values over the whole head dim d (a multiple of 16)
template <int G>
AVX512 inline void weigh_rows16(const float* w, const float* const* values, int64_t n, int64_t d,
                                const float* correction, float* acc) {
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) weigh_values16<G, 4>(w, values, n, c, d, correction, acc);
  for (; c < d; c += 16) weigh_values16<G, 1>(w, values, n, c, d, correction, acc);
}

// one row's scores s[0..n) turned into its softmax weights over the block, its running max and sum
// updated; returns the factor its earlier weighted sum is scaled by (1 with the block all masked: its
// weights are then 0)
AVX512 inline float softmax_block(float* s, int64_t n, float& max, float& sum) {
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    top = _mm512_mask_max_ps(top, lanes, top, _mm512_maskz_loadu_ps(lanes, s + i));
  }
  const float block_max = _mm512_reduce_max_ps(top);
  if (block_max == -std::numeric_limits<float>::infinity()) {  // every key of the block masked
    std::fill(s, s + n, 0.f);
    return 1.f;
  }
  const float new_max = std::max(max, block_max);
  const float correction = std::exp(max - new_max);  // 0 when the row had nothing yet
  top = _mm512_set1_ps(new_max);
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 w = _mm512_maskz_mov_ps(lanes, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + i), top)));
    _mm512_mask_storeu_ps(s + i, lanes, w);
    total = _mm512_add_ps(total, w);
  }
  sum = sum * correction + _mm512_reduce_add_ps(total);
  max = new_max;
  return correction;
}

AVX512 void attend_slice_avx512(const float* q, int64_t R, int64_t d, const Cache& k, const Cache& v, const float* lut,
                                const float* mask, int64_t mr, int64_t b, int64_t h, int64_t t0, int64_t t1, float scale,
                                Partial& p, Fetch& next) {
  p.max.assign(R, -std::numeric_limits<float>::infinity());
  p.sum.assign(R, 0.f);
  p.acc.assign(R * d, 0.f);
  alignas(64) float kb[KEYS * MAX_DIM], vb[KEYS * MAX_DIM];
  const float* keys[KEYS];
  const float* values[KEYS];
  std::vector<float> s(R * KEYS), correction(R);  // each row's scores, then weights, over the block
  for (int64_t start = t0; start < t1; start += KEYS) {
    const int64_t n = std::min(KEYS, t1 - start);
    rows_of(k, lut, b, h, start, n, d, kb, keys);
    rows_of(v, lut, b, h, start, n, d, vb, values);
    for (int64_t r = 0; r < R; ++r) {
      next.some();
      scores16(q + r * d, keys, n, d, scale, mask ? mask + r * mr + start : nullptr, s.data() + r * KEYS);
      correction[r] = softmax_block(s.data() + r * KEYS, n, p.max[r], p.sum[r]);
    }
    for (int64_t r = 0; r < R; r += 3) {
      const float* w = s.data() + r * KEYS;
      float* acc = p.acc.data() + r * d;
      if (R - r >= 3) weigh_rows16<3>(w, values, n, d, correction.data() + r, acc);
      else if (R - r == 2) weigh_rows16<2>(w, values, n, d, correction.data() + r, acc);
      else weigh_rows16<1>(w, values, n, d, correction.data() + r, acc);
    }
  }
}

// -- AVX2: the same, 8 lanes at a time; float32 keys and values are read where they lie (no copy), and
// the scores of 8 keys are summed across lanes together (a transpose by horizontal adds) ------------

using anatomy::avx2::exp8;
using anatomy::avx2::hmax8;
using anatomy::avx2::hsum8;

// [sum(a[0]), ..., sum(a[7])]
AVX2 inline __m256 sums8(const __m256 (&a)[8]) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// the scores s[0..n) of query row qr against the keys' rows (d a multiple of 8)
AVX2 inline void scores8(const float* qr, const float* const* keys, int64_t n, int64_t d, float scale, const float* mask,
                         float* s) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(qr), _mm256_loadu_ps(keys[i + j]));
    for (int64_t c = 8; c < d; c += 8) {
      const __m256 q = _mm256_loadu_ps(qr + c);
      for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys[i + j] + c), a[j]);
    }
    const __m256 add = mask ? _mm256_loadu_ps(mask + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(s + i, _mm256_fmadd_ps(sums8(a), sc, add));
  }
  for (; i < n; ++i) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + c), _mm256_loadu_ps(keys[i] + c), a);
    s[i] = hsum8(a) * scale + (mask ? mask[i] : 0.f);
  }
}

// acc[c, c + 8U) = acc * correction + sum_j w[j] values[j][c, c + 8U): U vectors of the output in registers
template <int U>
AVX2 inline void weigh_values(const float* w, const float* const* values, int64_t n, int64_t c, float correction,
                              float* acc) {
  __m256 a[U];
  for (int u = 0; u < U; ++u) a[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 8 * u), _mm256_set1_ps(correction));
  for (int64_t j = 0; j < n; ++j) {
    const __m256 wj = _mm256_set1_ps(w[j]);
    const float* row = values[j] + c;
    for (int u = 0; u < U; ++u) a[u] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(row + 8 * u), a[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_storeu_ps(acc + c + 8 * u, a[u]);
}

AVX2 void attend_slice_avx2(const float* q, int64_t R, int64_t d, const Cache& k, const Cache& v, const float* lut,
                            const float* mask, int64_t mr, int64_t b, int64_t h, int64_t t0, int64_t t1, float scale,
                            Partial& p, Fetch& next) {
  p.max.assign(R, -std::numeric_limits<float>::infinity());
  p.sum.assign(R, 0.f);
  p.acc.assign(R * d, 0.f);
  alignas(32) float kb[KEYS_AVX2 * MAX_DIM], vb[KEYS_AVX2 * MAX_DIM], s[KEYS_AVX2];
  const float* keys[KEYS_AVX2];
  const float* values[KEYS_AVX2];
  for (int64_t start = t0; start < t1; start += KEYS_AVX2) {
    const int64_t n = std::min(KEYS_AVX2, t1 - start);
    rows_of(k, lut, b, h, start, n, d, kb, keys);
    rows_of(v, lut, b, h, start, n, d, vb, values);
    for (int64_t r = 0; r < R; ++r) {
      next.some();
      scores8(q + r * d, keys, n, d, scale, mask ? mask + r * mr + start : nullptr, s);
      float block_max = -std::numeric_limits<float>::infinity();
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) block_max = std::max(block_max, hmax8(_mm256_loadu_ps(s + i)));
      for (; i < n; ++i) block_max = std::max(block_max, s[i]);
      if (block_max == -std::numeric_limits<float>::infinity()) continue;  // every key of the block masked
      const float new_max = std::max(p.max[r], block_max);
      const float correction = std::exp(p.max[r] - new_max);  // 0 when the row had nothing yet
      const __m256 top = _mm256_set1_ps(new_max);
      __m256 total = _mm256_setzero_ps();
      for (i = 0; i + 8 <= n; i += 8) {
        const __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), top));
        _mm256_storeu_ps(s + i, w);
        total = _mm256_add_ps(total, w);
      }
      float rest = 0.f;
      for (; i < n; ++i) rest += (s[i] = std::exp(s[i] - new_max));
      p.sum[r] = p.sum[r] * correction + hsum8(total) + rest;
      p.max[r] = new_max;
      float* acc = p.acc.data() + r * d;
      int64_t c = 0;
      for (; c + 64 <= d; c += 64) weigh_values<8>(s, values, n, c, correction, acc);
      for (; c < d; c += 8) weigh_values<1>(s, values, n, c, correction, acc);
    }
  }
}

#endif  // ANATOMY_X86

// the n slices `parts` of one (b, h) merged (no copies: a decode step merges every layer's): out [R, d]
void merge(const Partial* parts, int64_t n, int64_t R, int64_t d, float* out) {
  for (int64_t r = 0; r < R; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, parts[i].max[r]);
    float total = 0.f;
    float acc[MAX_DIM] = {};
    if (m != -std::numeric_limits<float>::infinity()) {
      for (int64_t i = 0; i < n; ++i) {
        const Partial& p = parts[i];
        if (p.max[r] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(p.max[r] - m);
        total += w * p.sum[r];
        for (int64_t j = 0; j < d; ++j) acc[j] += w * p.acc[r * d + j];
      }
    }
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = total > 0.f ? acc[j] / total : 0.f;
  }
}

struct Job {
  const float* q;  // [B, H, R, d] contiguous float32
  int64_t B, H, R, T, d;
  Cache k, v;
  const float* lut;
  const float* mask;  // [Bm, 1, R, T] float32, slots contiguous (strides mb, mr; 0: shared), or null
  int64_t mb, mr, mt;
  float scale;
  int64_t slices;
  std::vector<int64_t> reach;  // per batch row: the slots up to its last one any query row may attend (T unmasked)
};

// One task: a (batch row, KV head) and a slice [t0, t1) of the slots it reaches
struct Task {
  const float* q;
  const float* mask;
  int64_t b, h, t0, t1;
};

Task task_of(const Job& j, int64_t task) {
  const int64_t slice = task % j.slices, bh = task / j.slices, b = bh / j.H, T = j.reach[b];
  const int64_t per = (T + j.slices - 1) / j.slices, t0 = std::min(T, slice * per), t1 = std::min(T, t0 + per);
  return {j.q + bh * j.R * j.d, j.mask ? j.mask + b * j.mb : nullptr, b, bh % j.H, t0, t1};
}

// How far each batch row's queries reach: one past the last slot not masked (-inf) for some query row.
// A decode step over a cache bucket masks the slots not written yet: they are not read at all.
std::vector<int64_t> reach_of(const float* mask, int64_t B, int64_t R, int64_t T, int64_t mb, int64_t mr) {
  std::vector<int64_t> reach(B, T);
  if (mask == nullptr) return reach;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = T;
    for (; t > 0; --t) {
      bool open = false;
      for (int64_t r = 0; r < R && !open; ++r) open = mask[b * mb + r * mr + t - 1] != -std::numeric_limits<float>::infinity();
      if (open) break;
    }
    reach[b] = t;
  }
  return reach;
}

void run_portable(const Job& j, int64_t task, Partial& p) {
  const Task t = task_of(j, task);
  attend_slice(t.q, j.R, j.d, j.k, j.v, j.lut, t.mask, j.mr, j.mt, t.b, t.h, t.t0, t.t1, j.scale, p);
}

#if ANATOMY_X86
AVX512 void run_avx512(const Job& j, int64_t task, Partial& p, Fetch& next) {
  const Task t = task_of(j, task);
  if (j.d % 16 == 0)
    attend_slice_avx512(t.q, j.R, j.d, j.k, j.v, j.lut, t.mask, j.mr, t.b, t.h, t.t0, t.t1, j.scale, p, next);
  else
    attend_slice(t.q, j.R, j.d, j.k, j.v, j.lut, t.mask, j.mr, j.mt, t.b, t.h, t.t0, t.t1, j.scale, p);
}

AVX2 void run_avx2(const Job& j, int64_t task, Partial& p, Fetch& next) {
  const Task t = task_of(j, task);
  if (j.d % 8 == 0)
    attend_slice_avx2(t.q, j.R, j.d, j.k, j.v, j.lut, t.mask, j.mr, t.b, t.h, t.t0, t.t1, j.scale, p, next);
  else
    attend_slice(t.q, j.R, j.d, j.k, j.v, j.lut, t.mask, j.mr, j.mt, t.b, t.h, t.t0, t.t1, j.scale, p);
}
#endif

// one task by the vector code `level` (the portable loops where no vector path is compiled); a vector
// path asks for `next`'s rows as it goes (the portable loops check the arithmetic and ask for nothing)
void run(const Job& j, int64_t task, anatomy::Isa level, Partial& p, Fetch& next) {
#if ANATOMY_X86
  if (level >= anatomy::Isa::Avx512) return run_avx512(j, task, p, next);
  if (level == anatomy::Isa::Avx2) return run_avx2(j, task, p, next);
#endif
  run_portable(j, task, p);
}

// task's rows, asked for over `calls` calls of Fetch::some (all at the first with 1)
Fetch fetch_of(const Job& j, int64_t task, int64_t calls) {
  const Task t = task_of(j, task);
  return {&j.k, &j.v, t.b, t.h, t.t0, t.t1, j.d, (t.t1 - t.t0 + calls - 1) / std::max<int64_t>(1, calls)};
}

// the calls of Fetch::some a task makes: one per query row and block of keys
int64_t calls_of(const Job& j, int64_t task, anatomy::Isa level) {
  const Task t = task_of(j, task);
  const int64_t keys = level >= anatomy::Isa::Avx512 ? KEYS : KEYS_AVX2;
  return (t.t1 - t.t0 + keys - 1) / keys * j.R;
}

// tasks [t0, t1) on one thread; on a vector path each one's rows asked for while the one before runs (the
// first one's at once)
void run_tasks(const Job& j, int64_t t0, int64_t t1, anatomy::Isa level, std::vector<Partial>& parts) {
  const bool ask = level > anatomy::Isa::Portable;
  Fetch next = ask ? fetch_of(j, t0, 1) : Fetch{};
  next.some();
  for (int64_t t = t0; t < t1; ++t) {
    next = ask && t + 1 < t1 ? fetch_of(j, t + 1, calls_of(j, t, level)) : Fetch{};
    run(j, t, level, parts[t], next);
  }
}

// k or v as the attention reads it: [B, H, T, d], or a paged pool [N, bs, H, d] read through tables
Cache cache_of(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& scale_f32, const at::Tensor& tables) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "anatomy::decode_attention: k and v must be [B, H, T, d] (paged: "
              "[N, bs, H, d]) with d contiguous");
  const at::ScalarType type = x.scalar_type();
  Kind kind = type == at::kFloat ? F32 : type == at::kBFloat16 ? BF16 : type == at::kHalf ? F16 : CODES;
  TORCH_CHECK(kind != CODES || x.element_size() == 1, "anatomy::decode_attention: k and v must be float32, "
              "bfloat16, float16 or 8-bit codes (their bytes are looked up in lut), got ", x.scalar_type());
  TORCH_CHECK(kind != CODES || (scale.defined() && scale.dim() == 3), "anatomy::decode_attention: 8-bit codes need "
              "their scales [B, H, T] (paged: [N, bs, H])");
  const bool paged = tables.defined();
  const int h = paged ? 2 : 1, t = paged ? 1 : 2;  // which dims are the heads' and the slots'
  Cache c{x.data_ptr(), x.stride(0), x.stride(h), x.stride(t), nullptr, 0, 0, 0, kind};
  if (kind == CODES) {
    c.signed_codes = x.scalar_type() == at::kChar;
    c.scale = scale_f32.data_ptr<float>();
    c.ssb = scale_f32.stride(0), c.ssh = scale_f32.stride(h), c.sst = scale_f32.stride(t);
  }
  if (paged) c.table = tables.data_ptr<int64_t>(), c.nb = tables.size(1), c.bs = x.size(1);
  return c;
}

}  // namespace

namespace anatomy {

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                            const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& lut,
                            double scale, bool portable, const c10::optional<at::Tensor>& tables) {
  TORCH_CHECK(q.dim() == 4, "anatomy::decode_attention: q must be [B, H, R, d]");
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), d = q.size(3);
  at::Tensor blocks;
  if (tables.has_value()) {
    TORCH_CHECK(tables->dim() == 2 && tables->size(0) == B && tables->scalar_type() == at::kLong,
                "anatomy::decode_attention: tables must be int64 [B, nb]");
    TORCH_CHECK(k.dim() == 4 && k.size(2) == H && k.size(3) == d && v.sizes() == k.sizes(),
                "anatomy::decode_attention: paged k and v must be pools [N, bs, H, d] of q's H and d");
    blocks = tables->contiguous();
    const int64_t* ids = blocks.data_ptr<int64_t>();
    for (int64_t i = 0; i < blocks.numel(); ++i)
      TORCH_CHECK(ids[i] >= 0 && ids[i] < k.size(0), "anatomy::decode_attention: block id ", ids[i],
                  " of tables is outside the pool's ", k.size(0), " blocks");
  } else {
    TORCH_CHECK(k.dim() == 4 && k.size(0) == B && k.size(1) == H && k.size(3) == d && v.sizes() == k.sizes(),
                "anatomy::decode_attention: k and v must be [B, H, T, d] of q's B, H and d");
  }
  const int64_t T = tables.has_value() ? blocks.size(1) * k.size(1) : k.size(2);
  TORCH_CHECK(d <= MAX_DIM, "anatomy::decode_attention: head dim ", d, " > ", MAX_DIM);
  at::Tensor qf = q.to(at::kFloat).contiguous();
  at::Tensor ks = k_scale.has_value() ? k_scale->to(at::kFloat) : at::Tensor();
  at::Tensor vs = v_scale.has_value() ? v_scale->to(at::kFloat) : at::Tensor();
  at::Tensor table = lut.has_value() ? lut->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(k.element_size() != 1 || (table.defined() && table.numel() == 256),
              "anatomy::decode_attention: 8-bit codes need their table of 256 values");
  at::Tensor m;
  if (mask.has_value()) {
    TORCH_CHECK(mask->dim() == 4 && (mask->size(2) == R || mask->size(2) == 1) && mask->size(3) == T,
                "anatomy::decode_attention: mask must be [B|1, 1, R|1, T]");
    m = mask->scalar_type() == at::kFloat && mask->stride(3) == 1 ? *mask : mask->to(at::kFloat).contiguous();
  }
  // the mask as it is (a row shared by the batch or the query rows: stride 0), float32 with slots contiguous
  const int64_t mb = m.defined() && m.size(0) > 1 ? m.stride(0) : 0, mr = m.defined() && m.size(2) > 1 ? m.stride(2) : 0;
  Job job{qf.data_ptr<float>(), B, H, R, T, d, cache_of(k, k_scale.value_or(at::Tensor()), ks, blocks),
          cache_of(v, v_scale.value_or(at::Tensor()), vs, blocks), table.defined() ? table.data_ptr<float>() : nullptr,
          m.defined() ? m.data_ptr<float>() : nullptr, mb, mr, 1, static_cast<float>(scale), 1, {}};
  job.reach = reach_of(job.mask, B, R, T, mb, mr);
  const int64_t threads = at::get_num_threads();
  const int64_t reach = *std::max_element(job.reach.begin(), job.reach.end());
  job.slices = std::max<int64_t>(1, std::min<int64_t>((2 * threads + B * H - 1) / (B * H), reach / KEYS));
  const int64_t tasks = B * H * job.slices;
  std::vector<Partial> parts(tasks);
  const anatomy::Isa level = anatomy::isa(portable);
  job.k.f16c = job.v.f16c = level >= anatomy::Isa::Avx2;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) { run_tasks(job, t0, t1, level, parts); });
  at::Tensor out = qf.new_empty({B, H, R, d});
  float* dst = out.data_ptr<float>();
  for (int64_t bh = 0; bh < B * H; ++bh) merge(parts.data() + bh * job.slices, job.slices, R, d, dst + bh * R * d);
  return out.to(q.scalar_type());
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? k_scale, Tensor? v_scale, Tensor? mask, "
        "Tensor? lut, float scale, bool portable=False, Tensor? tables=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) { m.impl("decode_attention", anatomy::decode_attention); }
