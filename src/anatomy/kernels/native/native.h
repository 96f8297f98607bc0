// The operators of anatomy's native kernels that other operators call directly (one library, one
// namespace): the few-row products (gemv.cpp: int8 activations by VNNI; exact.cpp: float activations),
// RMSNorm (norm.cpp) and the attention over a cache as stored (attention.cpp). Each is also a torch
// operator of the same name under torch.ops.anatomy.
#pragma once

#include <ATen/ATen.h>

namespace anatomy {

// The native weight layouts (gemv.cpp builds them): each row of a weight is K / PAIR blocks, a block the
// float16 scales (and q4's minimums) of its two groups of 32 inputs, then their codes
constexpr int64_t PAIR = 64;      // inputs per stored block (two groups)
constexpr int64_t Q4_BLOCK = 40;  // bytes per block: 4 float16 (scale, minimum per group), 32 bytes of 4-bit codes
constexpr int64_t Q8_BLOCK = 72;  // bytes per block: 2 float16 scales (in 8 bytes), 64 int8 codes
// The weights stream from memory once per step, a few hundred KB per matrix: the hardware prefetcher
// alone leaves each new matrix latency-bound, so the one-row loops ask for the bytes this far ahead
constexpr int64_t AHEAD = 8192;

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q4f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q8f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                            const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& lut,
                            double scale, bool portable, const c10::optional<at::Tensor>& tables);

}  // namespace anatomy
