// One pre-norm LLaMA-style decoder block of a decode step as one operator: what ~35 torch operators
// (and the interpreter between them) do per block, with the same products, in one call.
//
//   x [B, D] float32, one new token per row
//   h = rms_norm(x) * attn_norm                   qkv = h @ Wqkv^T        [B, (H + 2 H_kv) d]
//   q, k rotated (RoPE, rotate-half pairs i and i + d/2, cos/sin [B, d]); k, v written to the cache
//   a = softmax(q k^T * scale + mask) v over the row's cache slots (decode_attention, GQA folded)
//   x = x + a @ Wo^T
//   h = rms_norm(x) * ffn_norm                    g, u = h @ Wgate_up^T   [B, 2F]
//   x = x + (silu(g) * u) @ Wdown^T
//
// Each of the four products reads one weight, or several whose outputs lie side by side (a split weight's
// row runs, each in its own layout: `counts` holds how many of `weights` each product takes, in order).
// The weights are in the native layouts (q4: 40 bytes per 64 weights, q8: 72; gemv.cpp; q5: 48, q5.cpp;
// q6: 210 per 256, q6k.cpp; or tiles of 16 rows, q4 [N/16, K/32, 320 or 288], q5 [.., 384 or 352], q8 [.., 544],
// l4 [.., 336]: tiles.cpp; q6 [N/16, K/256, 3360]: q6_tiles.cpp); bit i of `int8_activations` makes weight i quantize its input to int8 per group of 32
// (q4/q5/q6/q8_linear, q4/q5/q8/l4 tiles) instead of reading it as float (q4f/q5f/q8f_linear), or rounding it
// to int16 (q4/q5/q8/l4 tiles, q6s where AVX-512 runs, else q6f); q6 tiles always take int16. The cache is
// float32, bfloat16 or float16:
//   static  k, v [B, H_kv, T, d]; `where` = input_pos [1]: every row writes slot input_pos[0]
//   paged   k, v pools [N, bs, H_kv, d]; `where` = slots [B] (block * bs + offset), tables [B, nb]
// Norms, RoPE, SwiGLU and the residual adds are loops over the rows in float32.

#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "avx2.h"
#include "native.h"

namespace {

using anatomy::PAIR;
using anatomy::Q4_BLOCK;
using anatomy::Q5_BLOCK;
using anatomy::Q8_BLOCK;
using anatomy::Q6_BLOCK;  // the q6 layout: 210 bytes per 256 inputs (q6k.cpp)
using anatomy::Q6_SUPER;
constexpr int64_t Q8_TILE_BYTES = 544;             // q8 tiles: [N/16, K/32, 544] (tiles.cpp; q4 tiles: 320, 288 or 296)
constexpr int64_t Q5_TILE_BYTES = 384, Q5S_TILE_BYTES = 352;  // q5 tiles: [N/16, K/32, 384]; symmetric: 352
constexpr int64_t L4_TILE_BYTES = 336;             // l4 tiles (levels looked up): [N/16, K/32, 336]
constexpr int64_t Q6_TILE_BYTES = 3360;            // q6 tiles: [N/16, K/256, 3360] (q6_tiles.cpp)

at::Tensor product(const at::Tensor& x, const at::Tensor& w, bool int8) {
  const int64_t K = x.size(1);
  if (w.dim() == 3 && w.size(2) == Q6_TILE_BYTES) return anatomy::q6_tiles_linear(x, w, false, int8 ? 8 : 16);
  if (w.dim() == 3 && w.size(2) == Q8_TILE_BYTES) return anatomy::q8_tiles_linear(x, w, false, int8 ? 8 : 16);
  if (w.dim() == 3 && w.size(2) == L4_TILE_BYTES) return anatomy::l4_tiles_linear(x, w, false, int8 ? 8 : 16);
  if (w.dim() == 3 && (w.size(2) == Q5_TILE_BYTES || w.size(2) == Q5S_TILE_BYTES))
    return anatomy::q5_tiles_linear(x, w, false, int8 ? 8 : 16);
  if (w.dim() == 3) return anatomy::q4_tiles_linear(x, w, false, int8 ? 8 : 16);  // q4 tiles (tiles.cpp)
  TORCH_CHECK(w.dim() == 2 && K % PAIR == 0, "anatomy::decode_block: a weight is not [N, K/64 * bytes]");
  if (K % Q6_SUPER == 0 && w.size(1) == K / Q6_SUPER * Q6_BLOCK) {  // q6k.cpp; without int8, int16 where it runs
    if (int8) return anatomy::q6_linear(x, w, false);
    return anatomy::isa() >= anatomy::Isa::Avx512 ? anatomy::q6s_linear(x, w, false) : anatomy::q6f_linear(x, w, false);
  }
  const int64_t per = w.size(1) / (K / PAIR);
  if (per == Q4_BLOCK) return int8 ? anatomy::q4_linear(x, w, false) : anatomy::q4f_linear(x, w, false);
  if (per == Q5_BLOCK) return int8 ? anatomy::q5_linear(x, w, false) : anatomy::q5f_linear(x, w, false);
  TORCH_CHECK(per == Q8_BLOCK, "anatomy::decode_block: a weight has ", w.size(1), " bytes a row for K = ", K,
              ", none of the q4, q5, q6 and q8 layouts");
  return int8 ? anatomy::q8_linear(x, w, false) : anatomy::q8f_linear(x, w, false);
}

// x @ W^T for W the rows of ws[0], ws[1], ... in order; bit i of `int8` for ws[i]
at::Tensor products(const at::Tensor& x, at::TensorList ws, int64_t int8) {
  if (ws.size() == 1) return product(x, ws[0], int8 & 1);
  std::vector<at::Tensor> parts;
  int64_t N = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    parts.push_back(product(x, ws[i], (int8 >> i) & 1));
    N += parts.back().size(1);
  }
  at::Tensor y = x.new_empty({x.size(0), N}, at::kFloat);
  int64_t at0 = 0;
  for (const auto& part : parts) {
    y.narrow(1, at0, part.size(1)).copy_(part);
    at0 += part.size(1);
  }
  return y;
}

// y += x over n values (a residual add: a loop, not a TensorIterator's setup per call)
void add_to(float* y, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += x[j];
}

// heads [n, d] of one row rotated in place by cos/sin [d]
void rope(float* heads, int64_t n, int64_t d, const float* c, const float* s) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < n; ++i) {
    float* x = heads + i * d;
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = x[j], x2 = x[j + half];
      x[j] = x1 * c[j] - x2 * s[j];
      x[j + half] = x2 * c[j + half] + x1 * s[j + half];
    }
  }
}

// y = silu(gate) * up over n values
void swiglu(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = gate[j] / (1.f + std::exp(-gate[j])) * up[j];
}

#if ANATOMY_X86
AVX2 void swiglu_avx2(const float* gate, const float* up, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, anatomy::avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(y + j, _mm256_mul_ps(silu, _mm256_loadu_ps(up + j)));
  }
  swiglu(gate + j, up + j, y + j, n - j);
}
#endif

template <typename T>
void store(const float* src, T* dst, int64_t d) {
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<T>(src[j]);
}

// the new k and v heads [H_kv, d] of row b into the cache at its slot
void write_kv(const at::Tensor& cache, const float* heads, int64_t b, int64_t H_kv, int64_t d, const at::Tensor& where,
              bool paged) {
  int64_t at0, sh;
  if (paged) {  // pool [N, bs, H_kv, d]
    const int64_t slot = where.data_ptr<int64_t>()[b], bs = cache.size(1);
    TORCH_CHECK(slot >= 0 && slot < cache.size(0) * bs, "anatomy::decode_block: slot ", slot, " outside the pool");
    at0 = (slot / bs) * cache.stride(0) + (slot % bs) * cache.stride(1), sh = cache.stride(2);
  } else {  // [B, H_kv, T, d]
    const int64_t pos = where.data_ptr<int64_t>()[0];
    TORCH_CHECK(pos >= 0 && pos < cache.size(2), "anatomy::decode_block: input_pos ", pos, " outside the cache");
    at0 = b * cache.stride(0) + pos * cache.stride(2), sh = cache.stride(1);
  }
  for (int64_t h = 0; h < H_kv; ++h) {
    if (cache.scalar_type() == at::kFloat)
      store(heads + h * d, cache.data_ptr<float>() + at0 + h * sh, d);
    else if (cache.scalar_type() == at::kHalf)
      store(heads + h * d, cache.data_ptr<c10::Half>() + at0 + h * sh, d);
    else
      store(heads + h * d, cache.data_ptr<c10::BFloat16>() + at0 + h * sh, d);
  }
}

}  // namespace

namespace anatomy {

at::Tensor decode_block(const at::Tensor& x, const at::Tensor& attn_norm, const at::Tensor& ffn_norm, double eps,
                        at::TensorList weights, at::IntArrayRef counts, int64_t int8_activations,
                        const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& k_cache, const at::Tensor& v_cache, const c10::optional<at::Tensor>& mask,
                        const at::Tensor& where, const c10::optional<at::Tensor>& tables, int64_t n_heads,
                        double scale) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "anatomy::decode_block: x must be float32 [B, D]");
  const bool paged = tables.has_value();
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.stride(3) == 1 &&
              v_cache.stride(3) == 1 && k_cache.scalar_type() == v_cache.scalar_type() &&
              (k_cache.scalar_type() == at::kFloat || k_cache.scalar_type() == at::kBFloat16 ||
               k_cache.scalar_type() == at::kHalf),
              "anatomy::decode_block: k and v must be float32, bfloat16 or float16 caches of one shape, d contiguous");
  TORCH_CHECK(where.scalar_type() == at::kLong && where.is_contiguous() && where.numel() == (paged ? x.size(0) : 1),
              "anatomy::decode_block: where must be int64: input_pos [1] (static) or slots [B] (paged)");
  const int64_t B = x.size(0), D = x.size(1), H = n_heads, d = k_cache.size(3);
  const int64_t H_kv = paged ? k_cache.size(2) : k_cache.size(1);
  TORCH_CHECK(H % H_kv == 0 && cos.numel() == B * d && sin.numel() == B * d,
              "anatomy::decode_block: heads ", H, " / ", H_kv, " or RoPE tables not [B, d]");
  at::Tensor xs = x.contiguous();
  TORCH_CHECK(counts.size() == 4 && counts[0] > 0 && counts[1] > 0 && counts[2] > 0 && counts[3] > 0 &&
              counts[0] + counts[1] + counts[2] + counts[3] == static_cast<int64_t>(weights.size()) &&
              weights.size() <= 32, "anatomy::decode_block: counts must give each of the 4 products one or more of "
              "the ", weights.size(), " weights (at most 32)");
  int64_t first[4] = {0, counts[0], counts[0] + counts[1], counts[0] + counts[1] + counts[2]};
  auto of = [&](int i) { return weights.slice(first[i], counts[i]); };
  auto bits = [&](int i) { return (int8_activations >> first[i]) & ((int64_t{1} << counts[i]) - 1); };

  at::Tensor qkv = products(anatomy::rms_norm(xs, attn_norm, eps), of(0), bits(0));  // [B, (H + 2 H_kv) d]
  TORCH_CHECK(qkv.size(1) == (H + 2 * H_kv) * d, "anatomy::decode_block: Wqkv gives ", qkv.size(1), " outputs, not ",
              (H + 2 * H_kv) * d);
  auto as_float = [](const at::Tensor& t) {  // no dispatch where the tables are float32 already
    return t.scalar_type() == at::kFloat ? t.contiguous() : t.to(at::kFloat).contiguous();
  };
  at::Tensor c = as_float(cos), s = as_float(sin);
  float* rows = qkv.data_ptr<float>();
  const int64_t width = qkv.size(1);
  for (int64_t b = 0; b < B; ++b) {
    float* row = rows + b * width;
    rope(row, H + H_kv, d, c.data_ptr<float>() + b * d, s.data_ptr<float>() + b * d);
    write_kv(k_cache, row + H * d, b, H_kv, d, where, paged);
    write_kv(v_cache, row + (H + H_kv) * d, b, H_kv, d, where, paged);
  }
  at::Tensor q = qkv.narrow(1, 0, H * d).reshape({B, H_kv, H / H_kv, d});  // the query heads of a KV group as rows
  at::Tensor a = decode_attention(q, k_cache, v_cache, c10::nullopt, c10::nullopt, mask, c10::nullopt, scale, false,
                                  tables);
  at::Tensor h = products(a.reshape({B, H * d}), of(1), bits(1));  // [B, D]
  TORCH_CHECK(h.size(1) == D, "anatomy::decode_block: Wo gives ", h.size(1), " outputs, not D = ", D);
  add_to(h.data_ptr<float>(), xs.data_ptr<float>(), B * D);  // x after attention

  at::Tensor gu = products(anatomy::rms_norm(h, ffn_norm, eps), of(2), bits(2));  // [B, 2F]
  const int64_t F = gu.size(1) / 2;
  at::Tensor act = gu.new_empty({B, F});
  const float* g = gu.data_ptr<float>();
  float* y = act.data_ptr<float>();
#if ANATOMY_X86
  const auto gated = anatomy::isa() >= anatomy::Isa::Avx2 ? swiglu_avx2 : swiglu;
#else
  const auto gated = swiglu;
#endif
  for (int64_t b = 0; b < B; ++b) gated(g + b * 2 * F, g + b * 2 * F + F, y + b * F, F);
  at::Tensor out = products(act, of(3), bits(3));  // [B, D]
  TORCH_CHECK(out.size(1) == D, "anatomy::decode_block: Wdown gives ", out.size(1), " outputs, not D = ", D);
  add_to(out.data_ptr<float>(), h.data_ptr<float>(), B * D);
  return out;
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("decode_block(Tensor x, Tensor attn_norm, Tensor ffn_norm, float eps, Tensor[] weights, int[] counts, "
        "int int8_activations, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor? mask, Tensor where, Tensor? tables, int n_heads, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) { m.impl("decode_block", anatomy::decode_block); }
