// Greedy decoding's choice: the index of each row's largest value, the first of equal ones, as
// torch.argmax gives it (a NaN counts as larger than any number: the first NaN's index).
//
//   argmax(x [R, V] float32) -> int64 [R]
//
// torch's max over a CPU row's last dimension compares one value at a time; a step's logits are a
// row of the whole vocabulary. Here one vector pass finds the maximum (and whether a NaN is there),
// a second the first index holding it.

#include <torch/library.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "avx2.h"
#include "native.h"

namespace {

constexpr float LOWEST = -std::numeric_limits<float>::infinity();

int64_t first_nan(const float* x, int64_t V) {
  for (int64_t i = 0; i < V; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

int64_t row_portable(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

#if ANATOMY_X86
AVX2 int64_t row_avx2(const float* x, int64_t V) {
  __m256 top = _mm256_set1_ps(LOWEST), unordered = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    top = _mm256_max_ps(top, v);
  }
  float m = anatomy::avx2::hmax8(top);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t j = i; j < V; ++j) {
    nan = nan || std::isnan(x[j]);
    m = x[j] > m ? x[j] : m;
  }
  if (nan) return first_nan(x, V);
  const __m256 wanted = _mm256_set1_ps(m);
  for (i = 0; i + 8 <= V; i += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), wanted, _CMP_EQ_OQ));
    if (hits) return i + __builtin_ctz(static_cast<unsigned>(hits));
  }
  for (; i < V; ++i)
    if (x[i] == m) return i;
  return 0;  // every value is -inf: the first, as torch gives
}
#endif

int64_t row(const float* x, int64_t V) {
#if ANATOMY_X86
  if (anatomy::isa() >= anatomy::Isa::Avx2) return row_avx2(x, V);
#endif
  return row_portable(x, V);
}

}  // namespace

namespace anatomy {

at::Tensor argmax(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) > 0,
              "anatomy::argmax: x must be float32 [R, V] with V > 0, got ", x.scalar_type(), " ", x.sizes());
  at::Tensor xc = x.contiguous();
  const int64_t R = xc.size(0), V = xc.size(1);
  at::Tensor out = xc.new_empty({R}, at::kLong);
  const float* src = xc.data_ptr<float>();
  int64_t* dst = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dst[r] = row(src + r * V, V);
  });
  return out;
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) { m.def("argmax(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(anatomy, CPU, m) { m.impl("argmax", anatomy::argmax); }
