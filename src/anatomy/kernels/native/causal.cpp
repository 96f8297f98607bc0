// Causal attention of a prompt's query rows over its keys, for a prefill:
//
//   out [B, H, S, d] = softmax(q k^T * scale, causal) v       q [B, H, S, d]; k, v [B, H_kv, T, d], T >= S
//
// Query row s sees keys t <= s + T - S (T == S for a fresh prompt); the H / H_kv query heads of a KV
// group read its keys. torch's CPU flash attention computes each block of query rows against a block of
// up to 512 keys, those past the diagonal included; here a tile of MR query rows of one head reads keys
// in blocks of KB only up to the last key its last row sees. The scores are a register-blocked product:
// the keys of a (batch row, KV head) transposed once to [d, T], so that 16 keys of one dim are a vector
// times a broadcast query element (MR rows x 64 keys of sums in registers); the weighted sum over keys
// the same way, the tile's output in registers. The softmax is online over the key blocks. Tiles are
// taken first, last, second, ..., so that each thread's contiguous share holds about as many keys.
// float32 with d a multiple of 16 up to 256 on AVX-512; the portable loops (any other shape or CPU, and
// the tests' check of the vector path) compute one row at a time.

#include <torch/library.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "avx512.h"
#include "native.h"

namespace {

constexpr int MR = 6;          // query rows of a tile
constexpr int64_t KB = 64;     // keys of a block (4 vectors of 16)
constexpr int64_t MAX_DIM = 256;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

struct Job {
  const float* q;
  int64_t qb, qh, qs;  // q's strides [B, H, S, d] (d contiguous)
  const float* kt;     // the keys transposed: [B, H_kv, d, tp], contiguous, zero past T
  int64_t tp;
  const float* v;
  int64_t vb, vh, vs;  // v's strides [B, H_kv, T, d]
  float* out;          // [B, H, S, d], contiguous
  int64_t B, H, H_kv, S, T, d;
  float scale;
};

inline const float* keys_of(const Job& j, int64_t b, int64_t h) {
  return j.kt + (b * j.H_kv + h / (j.H / j.H_kv)) * j.d * j.tp;
}

inline const float* values_of(const Job& j, int64_t b, int64_t h) {
  return j.v + b * j.vb + h / (j.H / j.H_kv) * j.vh;
}

// one query row s of head h: its scores, softmax and weighted values in plain loops
void row_portable(const Job& j, int64_t b, int64_t h, int64_t s) {
  const float* q = j.q + b * j.qb + h * j.qh + s * j.qs;
  const float* kt = keys_of(j, b, h);
  const float* v = values_of(j, b, h);
  const int64_t n = s + j.T - j.S + 1;  // keys [0, n) seen
  std::vector<float> w(n);
  float top = NEG_INF;
  for (int64_t t = 0; t < n; ++t) {
    float dot = 0.f;
    for (int64_t c = 0; c < j.d; ++c) dot += q[c] * kt[c * j.tp + t];
    w[t] = dot * j.scale;
    top = std::max(top, w[t]);
  }
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) sum += (w[t] = std::exp(w[t] - top));
  float* o = j.out + ((b * j.H + h) * j.S + s) * j.d;
  std::fill(o, o + j.d, 0.f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < j.d; ++c) o[c] += w[t] * v[t * j.vs + c];
  for (int64_t c = 0; c < j.d; ++c) o[c] /= sum;
}

#if ANATOMY_X86

using anatomy::avx512::exp512;

// acc[r][u] lane i = q[r] . k[t0 + 16u + i] for the tile's MR rows and the block's 64 keys (summed in
// locals: acc's stores could alias the loads of q, and would be kept in memory every step)
AVX512 inline void tile_scores(const float* const (&q)[MR], const float* kt, int64_t tp, int64_t t0, int64_t d,
                               __m512 (&acc)[MR][4]) {
  __m512 a[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < 4; ++u) a[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const float* row = kt + c * tp + t0;
    const __m512 k0 = _mm512_loadu_ps(row), k1 = _mm512_loadu_ps(row + 16);
    const __m512 k2 = _mm512_loadu_ps(row + 32), k3 = _mm512_loadu_ps(row + 48);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(q[r][c]);
      a[r][0] = _mm512_fmadd_ps(x, k0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(x, k1, a[r][1]);
      a[r][2] = _mm512_fmadd_ps(x, k2, a[r][2]);
      a[r][3] = _mm512_fmadd_ps(x, k3, a[r][3]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < 4; ++u) acc[r][u] = a[r][u];
}

// row r's scores of the block turned into weights w (0 past its last key `limit`), its running max and
// sum updated; returns the factor its earlier weighted sum is scaled by
AVX512 inline float softmax_row(const __m512 (&acc)[4], int64_t t0, int64_t limit, float scale, float* w,
                                float& max, float& sum) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 seen[4];
  __m512 x[4];
  __m512 top = _mm512_set1_ps(NEG_INF);
  for (int u = 0; u < 4; ++u) {
    const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(t0 + 16 * u)));
    seen[u] = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(static_cast<int>(limit)));
    x[u] = _mm512_mul_ps(acc[u], _mm512_set1_ps(scale));
    top = _mm512_mask_max_ps(top, seen[u], top, x[u]);
  }
  const float block_max = _mm512_reduce_max_ps(top);
  if (block_max == NEG_INF) {  // no key of the block is seen by this row
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(w + 16 * u, _mm512_setzero_ps());
    return 1.f;
  }
  const float new_max = std::max(max, block_max);
  const float correction = std::exp(max - new_max);  // 0 when the row had nothing yet
  const __m512 m = _mm512_set1_ps(new_max);
  __m512 total = _mm512_setzero_ps();
  for (int u = 0; u < 4; ++u) {
    const __m512 p = _mm512_maskz_mov_ps(seen[u], exp512(_mm512_sub_ps(x[u], m)));
    _mm512_storeu_ps(w + 16 * u, p);
    total = _mm512_add_ps(total, p);
  }
  sum = sum * correction + _mm512_reduce_add_ps(total);
  max = new_max;
  return correction;
}

// o[r][c, c + 16U) = o[r] * correction[r] + sum_i w[r][i] v[i][c, c + 16U) over the block's n keys
template <int U>
AVX512 inline void tile_values(const float (&w)[MR][KB], int64_t n, const float* v, int64_t vs, int64_t c,
                               const float* correction, float (&o)[MR][MAX_DIM]) {
  __m512 a[MR][U];
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < U; ++u)
      a[r][u] = _mm512_mul_ps(_mm512_loadu_ps(o[r] + c + 16 * u), _mm512_set1_ps(correction[r]));
  for (int64_t i = 0; i < n; ++i) {
    __m512 row[U];
    for (int u = 0; u < U; ++u) row[u] = _mm512_loadu_ps(v + i * vs + c + 16 * u);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(w[r][i]);
      for (int u = 0; u < U; ++u) a[r][u] = _mm512_fmadd_ps(x, row[u], a[r][u]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(o[r] + c + 16 * u, a[r][u]);
}

// query rows [s0, s0 + MR) of head h (past S: the last row again, not written)
AVX512 void tile_avx512(const Job& j, int64_t b, int64_t h, int64_t s0) {
  const int m = static_cast<int>(std::min<int64_t>(MR, j.S - s0));
  const int64_t shift = j.T - j.S;  // row s sees keys [0, s + shift]
  const float* q[MR];
  for (int r = 0; r < MR; ++r) q[r] = j.q + b * j.qb + h * j.qh + (s0 + std::min(r, m - 1)) * j.qs;
  const float* kt = keys_of(j, b, h);
  const float* v = values_of(j, b, h);
  alignas(64) float w[MR][KB];
  alignas(64) float o[MR][MAX_DIM];
  float max[MR], sum[MR], correction[MR];
  for (int r = 0; r < MR; ++r) {
    std::fill(o[r], o[r] + j.d, 0.f);
    max[r] = NEG_INF, sum[r] = 0.f;
  }
  const int64_t end = s0 + m + shift;  // keys [0, end) are seen by some row of the tile
  for (int64_t t0 = 0; t0 < end; t0 += KB) {
    __m512 acc[MR][4];
    tile_scores(q, kt, j.tp, t0, j.d, acc);
    for (int r = 0; r < MR; ++r)
      correction[r] = softmax_row(acc[r], t0, s0 + std::min(r, m - 1) + shift, j.scale, w[r], max[r], sum[r]);
    const int64_t n = std::min(KB, end - t0);
    const float* vt = v + t0 * j.vs;
    int64_t c = 0;
    for (; c + 64 <= j.d; c += 64) tile_values<4>(w, n, vt, j.vs, c, correction, o);
    for (; c < j.d; c += 16) tile_values<1>(w, n, vt, j.vs, c, correction, o);
  }
  for (int r = 0; r < m; ++r) {
    float* dst = j.out + ((b * j.H + h) * j.S + s0 + r) * j.d;
    const __m512 inv = _mm512_set1_ps(1.f / sum[r]);
    for (int64_t c = 0; c < j.d; c += 16) _mm512_storeu_ps(dst + c, _mm512_mul_ps(_mm512_loadu_ps(o[r] + c), inv));
  }
}

#endif

// task p of n, in the order first, last, second, ...: tiles later in a prompt see more keys
inline int64_t zigzag(int64_t p, int64_t n) { return p % 2 == 0 ? p / 2 : n - 1 - p / 2; }

}  // namespace

namespace anatomy {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            bool portable) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "anatomy::causal_attention: q must be [B, H, S, d] and k, v [B, H_kv, T, d]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "anatomy::causal_attention: q, k and v must be float32");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), d = q.size(3), H_kv = k.size(1), T = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(3) == d && H_kv > 0 && H % H_kv == 0,
              "anatomy::causal_attention: k and v must be [B, H_kv, T, d] of q's B and d, H a multiple of H_kv");
  TORCH_CHECK(T >= S, "anatomy::causal_attention: ", T, " keys for ", S, " query rows (T >= S)");
  TORCH_CHECK(d <= MAX_DIM, "anatomy::causal_attention: head dim ", d, " > ", MAX_DIM);
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor vc = v.stride(3) == 1 ? v : v.contiguous();
  const int64_t tp = (T + KB - 1) / KB * KB + 16;  // a row of kt 64 bytes past a multiple of 256: no stride of 2^k
  at::Tensor kt = k.new_zeros({B, H_kv, d, tp});
  kt.narrow(3, 0, T).copy_(k.transpose(2, 3));
  at::Tensor out = q.new_empty({B, H, S, d});
  if (S == 0) return out;
  const Job j{qc.data_ptr<float>(), qc.stride(0), qc.stride(1), qc.stride(2), kt.data_ptr<float>(), tp,
              vc.data_ptr<float>(), vc.stride(0), vc.stride(1), vc.stride(2), out.data_ptr<float>(),
              B, H, H_kv, S, T, d, static_cast<float>(scale)};
  const bool vector = ANATOMY_X86 && d % 16 == 0 && anatomy::isa(portable) >= anatomy::Isa::Avx512;
  const int64_t per = vector ? MR : 1;  // query rows of a task
  const int64_t tiles = (S + per - 1) / per, tasks = B * H * tiles;
  at::parallel_for(0, tasks, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t i = zigzag(p, tasks), tile = i / (B * H), b = i % (B * H) / H, h = i % H;
#if ANATOMY_X86
      if (vector) {
        tile_avx512(j, b, h, tile * MR);
        continue;
      }
#endif
      row_portable(j, b, h, tile);
    }
  });
  return out;
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("causal_attention(Tensor q, Tensor k, Tensor v, float scale, bool portable=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) { m.impl("causal_attention", anatomy::causal_attention); }
