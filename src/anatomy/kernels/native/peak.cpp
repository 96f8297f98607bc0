// The integer products' peak on this CPU: what the tiles kernels' inner instruction does per second when
// nothing else is in its way, a roof for `anatomy profile` (as a dense matmul's FLOP/s is the float roof).
//
//   integer_peak(iterations) -> int8 multiply-adds per second (vpdpbusd: 64 a 512-bit instruction), every
//       intra-op thread running
//
// Each thread keeps 16 independent sums in registers (enough to hide the instruction's latency) and
// runs `iterations` rounds of 16 instructions on them; 0 where AVX-512 VNNI does not run.

#include <torch/library.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "native.h"

#if ANATOMY_X86
#include <immintrin.h>
#endif

namespace {

constexpr int SUMS = 16;

#if ANATOMY_X86
#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// `iterations` rounds of the instruction on SUMS sums; their total (used: the compiler keeps the loop)
AVX512_VNNI int64_t rounds(int64_t iterations) {
  __m512i s[SUMS];
  for (int j = 0; j < SUMS; ++j) s[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  for (int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < SUMS; ++j)
      s[j] = _mm512_dpbusd_epi32(s[j], a, b);
  __m512i total = s[0];
  for (int j = 1; j < SUMS; ++j) total = _mm512_add_epi32(total, s[j]);
  return _mm512_reduce_add_epi32(total);
}
#endif

}  // namespace

namespace anatomy {

double integer_peak(int64_t iterations) {
  TORCH_CHECK(iterations > 0, "anatomy::integer_peak: iterations = ", iterations, ": must be positive");
  TORCH_CHECK(!at::in_parallel_region(), "anatomy::integer_peak: called inside a parallel region (its threads "
              "would run one at a time)");
#if ANATOMY_X86
  if (anatomy::isa() < anatomy::Isa::Avx512Vnni) return 0.0;
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> sinks(threads);
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) sinks[t] = rounds(iterations);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile int64_t kept = 0;  // the sums are used: the loops stay
  for (int64_t sum : sinks) kept = kept + sum;
  return threads * iterations * SUMS * 64.0 / seconds;
#else
  return 0.0;
#endif
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) { m.def("integer_peak(int iterations) -> float"); }

TORCH_LIBRARY_IMPL(anatomy, CompositeExplicitAutograd, m) { m.impl("integer_peak", anatomy::integer_peak); }
