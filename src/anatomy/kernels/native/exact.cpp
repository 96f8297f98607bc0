// The same layouts as gemv.cpp's (q4: [dA, mA, dB, mB] float16 + 32 nibble bytes per 64 weights; q8:
// [dA, dB] float16, [sumA, sumB] int16, 64 codes), multiplied with float activations as they are: each
// weight decoded to float32 in registers (w = q * d + m, or q * d) and summed in float32, so the product
// is the float product of the weights the file holds (no rounding of the activations, unlike the int8
// path). A decode step is bound by reading the weights, and those are the same bytes either way.
// AVX-512 loops here, AVX2 ones in gemv_avx2.cpp, the portable ones anywhere else (native.h's isa()).
//
//   q4f_linear(x [M, K] float, weight) -> [M, N]      (M any; in the input's dtype)
//   q8f_linear(x [M, K] float, weight) -> [M, N]

#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemv_avx2.h"
#include "native.h"

#if ANATOMY_X86
#include <immintrin.h>
#endif

namespace {

using anatomy::AHEAD;
using anatomy::PAIR;
using anatomy::Q4_BLOCK;
using anatomy::Q8_BLOCK;

constexpr int ROWS = 8;  // rows of x per pass over the weights

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// -- portable: the arithmetic, for checking ---------------------------------------------------------

void q4f_portable(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = w + (n * pairs + p) * Q4_BLOCK;
        uint16_t h[4];
        std::memcpy(h, block, 8);
        for (int64_t j = 0; j < 64; ++j) {
          const int half = j / 32;
          const uint8_t byte = block[8 + j % 32];
          const float q = half ? (byte >> 4) : (byte & 0x0F);
          total += (q * half_to_float(h[2 * half]) + half_to_float(h[2 * half + 1])) * x[m * K + p * PAIR + j];
        }
      }
      y[m * N + n] = total;
    }
}

void q8f_portable(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* block = w + (n * pairs + p) * Q8_BLOCK;
        uint16_t h[2];
        std::memcpy(h, block, 4);
        const int8_t* codes = reinterpret_cast<const int8_t*>(block + 8);
        for (int64_t j = 0; j < 64; ++j) total += codes[j] * half_to_float(h[j / 32]) * x[m * K + p * PAIR + j];
      }
      y[m * N + n] = total;
    }
}

// -- AVX-512 ------------------------------------------------------------------------------------------

#if ANATOMY_X86

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

AVX512 inline __m512 widen(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)); }

AVX512 inline __m512 widen_signed(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)); }

template <int M>
AVX512 void q4f_rows(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q4_BLOCK;
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * Q4_BLOCK;
      _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
      const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block)));
      const __m512 dA = _mm512_set1_ps(_mm_cvtss_f32(dm)), mA = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)));
      const __m512 dB = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 2)));
      const __m512 mB = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 3)));
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 8));
      const __m256i a = _mm256_and_si256(packed, low), b = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
      const __m512 w0 = _mm512_fmadd_ps(widen(_mm256_castsi256_si128(a)), dA, mA);       // inputs 0..15
      const __m512 w1 = _mm512_fmadd_ps(widen(_mm256_extracti128_si256(a, 1)), dA, mA);  // 16..31
      const __m512 w2 = _mm512_fmadd_ps(widen(_mm256_castsi256_si128(b)), dB, mB);       // 32..47
      const __m512 w3 = _mm512_fmadd_ps(widen(_mm256_extracti128_si256(b, 1)), dB, mB);  // 48..63
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * K + p * PAIR;
        acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xm), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xm + 16), acc[m][1]);
        acc[m][0] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xm + 32), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xm + 48), acc[m][1]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
  }
}

template <int M>
AVX512 void q8f_rows(const float* x, int64_t K, const uint8_t* w, int64_t n0, int64_t n1, float* y, int64_t N) {
  const int64_t pairs = K / PAIR;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * pairs * Q8_BLOCK;
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const uint8_t* block = row + p * Q8_BLOCK;
      _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD, _MM_HINT_T0);
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(block)));
      const __m512 dA = _mm512_set1_ps(_mm_cvtss_f32(dd)), dB = _mm512_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(dd, dd, 1)));
      const __m512i codes = _mm512_loadu_si512(block + 8);
      const __m512 w0 = _mm512_mul_ps(widen_signed(_mm512_extracti32x4_epi32(codes, 0)), dA);
      const __m512 w1 = _mm512_mul_ps(widen_signed(_mm512_extracti32x4_epi32(codes, 1)), dA);
      const __m512 w2 = _mm512_mul_ps(widen_signed(_mm512_extracti32x4_epi32(codes, 2)), dB);
      const __m512 w3 = _mm512_mul_ps(widen_signed(_mm512_extracti32x4_epi32(codes, 3)), dB);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * K + p * PAIR;
        acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xm), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xm + 16), acc[m][1]);
        acc[m][0] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xm + 32), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xm + 48), acc[m][1]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
  }
}

#endif  // ANATOMY_X86

template <int M, typename F>
void dispatch(int rows, F&& f) {
  if constexpr (M > 1) {
    if (rows < M) return dispatch<M - 1>(rows, f);
  }
  f(std::integral_constant<int, M>{});
}

template <bool Q4>
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  const int64_t block = Q4 ? Q4_BLOCK : Q8_BLOCK;
  const char* what = Q4 ? "anatomy::q4f_linear" : "anatomy::q8f_linear";
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, what, ": x must be a float matrix [M, K]");
  TORCH_CHECK(x.size(1) % PAIR == 0, what, ": K = ", x.size(1), " must be a multiple of ", PAIR);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(1) == x.size(1) / PAIR * block,
              what, ": weight must be uint8 [N, K/64 * ", block, "]");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = xf.new_empty({M, N});
  const float* xs = xf.data_ptr<float>();
  const uint8_t* weights = w.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const anatomy::Isa level = anatomy::isa(portable);
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
#if ANATOMY_X86
    if (level == anatomy::Isa::Avx2) {
      (Q4 ? anatomy::avx2::q4f_rows : anatomy::avx2::q8f_rows)(xs, M, K, weights, n0, n1, out, N);
      return;
    }
#endif
    const bool fast = level >= anatomy::Isa::Avx512;
    for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(ROWS, M - m0));
      const float* xm = xs + m0 * K;
      float* ym = out + m0 * N;
      if (!fast) {
        Q4 ? q4f_portable(xm, rows, K, weights, n0, n1, ym, N) : q8f_portable(xm, rows, K, weights, n0, n1, ym, N);
        continue;
      }
#if ANATOMY_X86
      dispatch<ROWS>(rows, [&](auto R) {
        Q4 ? q4f_rows<decltype(R)::value>(xm, K, weights, n0, n1, ym, N)
           : q8f_rows<decltype(R)::value>(xm, K, weights, n0, n1, ym, N);
      });
#endif
    }
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace

namespace anatomy {

at::Tensor q4f_linear(const at::Tensor& x, const at::Tensor& w, bool portable) { return linear<true>(x, w, portable); }

at::Tensor q8f_linear(const at::Tensor& x, const at::Tensor& w, bool portable) { return linear<false>(x, w, portable); }

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q4f_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
  m.def("q8f_linear(Tensor x, Tensor weight, bool portable=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q4f_linear", anatomy::q4f_linear);
  m.impl("q8f_linear", anatomy::q8f_linear);
}
