// Small AVX-512 helpers the kernels share: exp of 16 lanes. Compiled for AVX-512 (F, BW, VL, DQ) with
// F16C and FMA (the function attribute AVX512), called only from code of that target; x86-64 only.
#pragma once

#include "native.h"

#if ANATOMY_X86
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

namespace anatomy::avx512 {

// exp(x) to ~2e-7 relative: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 Taylor polynomial of r,
// scaled by 2^n (scalef); x is clamped below at -87 (exp(-87) ~ 2e-38, a masked key's weight)
AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  for (const float c : {1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

}  // namespace anatomy::avx512

#endif
