// RMSNorm as one operator: y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, summed and
// scaled in float32 whatever x's dtype (float32 or bfloat16), y in x's dtype.
//
// torch's rms_norm on a CPU costs ~15 us for one 576-wide row (it dispatches several operators under
// the one it shows), about as much as reading a 576 x 576 int4 weight; a decode step of SmolLM2 runs
// 61 of them. This one is a loop per row: ~1 us.

#include <torch/library.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "native.h"

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }

inline float load(const c10::BFloat16* p, int64_t i) { return static_cast<float>(p[i]); }

// sum of x[j]^2 in LANES interleaved partial sums, added at the end: one dependent add per LANES values
// (a single running sum waits on each add in turn), the same order on every machine
template <typename T>
float squares(const T* x, int64_t D) {
  constexpr int64_t LANES = 16;
  float part[LANES] = {};
  int64_t j = 0;
  for (; j + LANES <= D; j += LANES)
    for (int64_t l = 0; l < LANES; ++l) {
      const float v = load(x, j + l);
      part[l] += v * v;
    }
  for (; j < D; ++j) {
    const float v = load(x, j);
    part[j % LANES] += v * v;
  }
  float total = 0.f;
  for (float p : part) total += p;
  return total;
}

template <typename T>
void rows(const T* x, const float* w, T* y, int64_t n0, int64_t n1, int64_t D, float eps) {
  for (int64_t r = n0; r < n1; ++r) {
    const T* xr = x + r * D;
    const float inv = 1.f / std::sqrt(squares(xr, D) / static_cast<float>(D) + eps);
    T* yr = y + r * D;
    for (int64_t j = 0; j < D; ++j) yr[j] = static_cast<T>(load(xr, j) * inv * w[j]);
  }
}

}  // namespace

namespace anatomy {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "anatomy::rms_norm: x must be float32 or bfloat16, got ", x.scalar_type());
  const int64_t D = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == D, "anatomy::rms_norm: weight must be [", D, "]");
  at::Tensor xc = x.contiguous();
  at::Tensor w = weight.to(at::kFloat).contiguous();
  at::Tensor y = xc.new_empty(xc.sizes());
  const int64_t R = D ? xc.numel() / D : 0;
  const float* ws = w.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, R, 64, [&](int64_t n0, int64_t n1) {
    if (xc.scalar_type() == at::kFloat)
      rows(xc.data_ptr<float>(), ws, y.data_ptr<float>(), n0, n1, D, e);
    else
      rows(xc.data_ptr<c10::BFloat16>(), ws, y.data_ptr<c10::BFloat16>(), n0, n1, D, e);
  });
  return y;
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(anatomy, CPU, m) { m.impl("rms_norm", anatomy::rms_norm); }
