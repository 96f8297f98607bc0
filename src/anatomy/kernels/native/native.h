// The operators of anatomy's native kernels that other operators call directly (one library, one
// namespace): the few-row products (gemv.cpp: int8 activations by VNNI; exact.cpp: float activations),
// RMSNorm (norm.cpp) and the attention over a cache as stored (attention.cpp). Each is also a torch
// operator of the same name under torch.ops.anatomy.
#pragma once

#include <ATen/ATen.h>

namespace anatomy {

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
