// The operators of anatomy's native kernels that other operators call directly (one library, one
// namespace): the few-row products (gemv.cpp, q5.cpp: int8 activations by VNNI; exact.cpp: float activations),
// RMSNorm (norm.cpp) and the attention over a cache as stored (attention.cpp). Each is also a torch
// operator of the same name under torch.ops.anatomy.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// x86-64's vector code (immintrin.h, function targets, the CPU's feature bits) is compiled only there;
// any other CPU builds the portable loops alone
#if defined(__x86_64__) || defined(_M_X64)
#define ANATOMY_X86 1
#else
#define ANATOMY_X86 0
#endif

// AMX code is compiled where the compiler has its intrinsics (GCC 11, clang 12 and later) on Linux, which
// grants a process the tile registers; elsewhere the kernels run without it
#if ANATOMY_X86 && defined(__linux__) && defined(__has_include)
#if __has_include(<amxtileintrin.h>) || __has_include(<amxintrin.h>)
#define ANATOMY_HAS_AMX 1
#endif
#endif
#ifndef ANATOMY_HAS_AMX
#define ANATOMY_HAS_AMX 0
#endif

#if ANATOMY_HAS_AMX
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
// the target of AMX code: AVX-512 (F, BW, VL, DQ) with VNNI, F16C, FMA and AMX's tiles and int8 products
#define ANATOMY_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,amx-tile,amx-int8")))
#endif

// a helper inlined into each caller, so that it takes the caller's vector target
#if defined(__GNUC__)
#define ANATOMY_INLINE inline __attribute__((always_inline))
#else
#define ANATOMY_INLINE inline
#endif

namespace anatomy {

// The native weight layouts (gemv.cpp builds them): each row of a weight is K / PAIR blocks, a block the
// float16 scales (and q4's minimums) of its two groups of 32 inputs, then their codes
constexpr int64_t PAIR = 64;      // inputs per stored block (two groups)
// 4 codes of x read as one word: a vector loop broadcasts it from memory, not through a general register
using Word = int32_t __attribute__((may_alias, aligned(1)));
constexpr int64_t Q4_BLOCK = 40;  // bytes per block: 4 float16 (scale, minimum per group), 32 bytes of 4-bit codes
constexpr int64_t Q8_BLOCK = 72;  // bytes per block: 2 float16 scales (in 8 bytes), 64 int8 codes
constexpr int64_t Q5_BLOCK = 48;  // q4's header, 8 bytes of fifth bits (bit i: input i), its 32 bytes of codes
// The q6 layout of GGUF Q6_K (q6k.cpp): per row and super-block of 256 inputs, 210 bytes: d float16, 16 int8
// sub-scales, then the code planes L0, L1 (the low 4 bits of chunks 0-1 and 2-3) and H (each chunk's top 2
// bits); input k lies in chunk q6_chunk(k), byte q6_byte(k), its code (0..63) q6_code(block, k)
constexpr int64_t Q6_SUPER = 256, Q6_BLOCK = 210;
constexpr int64_t Q6_L0 = 18, Q6_L1 = 82, Q6_H = 146;
inline int64_t q6_chunk(int64_t k) { return k % 32 / 8; }
inline int64_t q6_byte(int64_t k) { return 4 * (2 * (k / 32) + k % 32 / 4 % 2) + k % 4; }
inline int32_t q6_code(const uint8_t* block, int64_t k) {
  const int64_t c = q6_chunk(k), t = q6_byte(k);
  const uint8_t low = block[(c < 2 ? Q6_L0 : Q6_L1) + t];
  return ((c % 2 ? low >> 4 : low) & 0x0F) | ((block[Q6_H + t] >> (2 * c)) & 3) << 4;
}
// The weights stream from memory once per step, a few hundred KB per matrix: the hardware prefetcher
// alone leaves each new matrix latency-bound, so the one-row loops ask for the bytes this far ahead
constexpr int64_t AHEAD = 8192;

// pass(t0, t1, m0, rows) for output tiles [t0, t1), split across the threads, and rows [m0, m0 + rows) of x
// in passes of at most `per` (the tile loops of tiles.cpp and q6_tiles.cpp)
template <typename Pass>
void tile_passes(int64_t tiles, int64_t M, int64_t per, Pass pass) {
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += per) pass(t0, t1, m0, static_cast<int>(std::min(per, M - m0)));
  });
}

// f(std::integral_constant<int, r>) for r = rows (1 <= rows <= R): a loop over `rows` rows of x compiled for
// each count up to R, its registers sized at compile time
template <int R, typename F>
void up_to(int rows, F&& f) {
  if constexpr (R > 1) {
    if (rows < R) return up_to<R - 1>(rows, f);
  }
  f(std::integral_constant<int, R>{});
}

// The vector code a CPU runs: AVX-512 (F, BW, VL, DQ) with VNNI where it has them (and AMX's int8 tiles
// where Linux lets the process use them), AVX2 with FMA and F16C on the x86-64 machines of the last
// decade, the portable loops anywhere else (any other CPU: those alone). Each path is compiled for its
// own target (function attributes), so one library runs on any x86-64 machine.
enum class Isa { Portable = 0, Avx2 = 1, Avx512 = 2, Avx512Vnni = 3, Amx = 4 };

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), and Linux's permission for this process to
// use the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, state component 18)
inline bool amx_usable() {
#if ANATOMY_HAS_AMX
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx >> 24 & 1) || !(edx >> 25 & 1)) return false;
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

// The most a kernel may use, below what the CPU has (set_isa_limit: the tests run the AVX2 and portable
// paths on an AVX-512 machine, and a user can simulate an older CPU); the CPU's own by default
inline std::atomic<int>& isa_limit() {
  static std::atomic<int> limit{static_cast<int>(Isa::Amx)};
  return limit;
}

inline Isa cpu_isa() {
#if ANATOMY_X86
  static const Isa found = [] {
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (avx512 && __builtin_cpu_supports("avx512vnni")) return amx_usable() ? Isa::Amx : Isa::Avx512Vnni;
    if (avx512) return Isa::Avx512;
    return avx2 ? Isa::Avx2 : Isa::Portable;
  }();
  return found;
#else
  return Isa::Portable;
#endif
}

inline Isa isa() {
  return static_cast<Isa>(std::min(static_cast<int>(cpu_isa()), isa_limit().load(std::memory_order_relaxed)));
}

// what a kernel runs: `portable` (the tests' check of the vector paths) forces the portable loops
inline Isa isa(bool portable) { return portable ? Isa::Portable : isa(); }

// One row v [K] rounded per group of 32 inputs to codes of magnitude at most `limit` (127: int8, 32767:
// int16): q [K] = round to nearest even of v * (1 / s), s = max|v| / limit, and per group s and the sum
// of q ([K/32] each). The portable loop; gemv_avx2.cpp's int8 one gives the same numbers.
// v rounded to the nearest integer, ties to even (std::nearbyint's in the default rounding mode), for
// |v| < 2^22: adding and taking off 1.5 * 2^23 leaves no fraction bits; inlined, where nearbyint is a call
inline float round_even(float v) {
  constexpr float shift = 12582912.f;
  return (v + shift) - shift;
}

template <typename Code>
inline void quantize_groups(const float* v, int64_t K, float limit, Code* q, float* scale, int32_t* sum) {
  constexpr int64_t G = 32;
  for (int64_t g = 0; g < K / G; ++g, v += G, q += G) {
    float amax = 0.f;
    for (int64_t j = 0; j < G; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float s = amax / limit;
    const float inv = s > 0.f ? 1.f / s : 0.f;
    int32_t total = 0;
    for (int64_t j = 0; j < G; ++j) {
      q[j] = static_cast<Code>(round_even(v[j] * inv));
      total += q[j];
    }
    scale[g] = s;
    sum[g] = total;
  }
}

// x [M, K] rounded to int8 per group of 32 (gemv.cpp; the struct is gemv_avx2.h's): the activations of
// every int8 product, the same numbers on every path
struct Quantized;
Quantized quantize_rows(const at::Tensor& x, Isa level);

// x [M, K] float rounded to int16 per group of 32 (quantize_rows16's codes: s = max|x| / 32767) for AMX's
// int8 tiles: each code split into a high signed byte and a low unsigned one (q = 256 h + l), per 16 rows
// (M rounded up, zero rows after x's) and group [M16/16, K/32, 16, 32] each; the scales and the scales
// times the codes' sums [M16/16, K/32, 16] (tiles.cpp; where the CPU runs AMX)
struct Planes {
  std::vector<int8_t> high;
  std::vector<uint8_t> low;
  std::vector<float> scale, scaled_sum;
};
Planes split_codes(const float* x, int64_t M, int64_t K);

#if ANATOMY_HAS_AMX
// The tile registers as the AMX products use them: 0 a B tile of weight codes (`b_rows` rows of 64 bytes),
// 1 and 2 the high and low bytes of 16 rows of x (A tiles, `a_bytes` a row), 3 and 4 their int32 sums
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxConfig(uint8_t b_rows, uint16_t a_bytes) {
    colsb[0] = 64, colsb[1] = colsb[2] = a_bytes, colsb[3] = colsb[4] = 64;
    rows[0] = b_rows, rows[1] = rows[2] = rows[3] = rows[4] = 16;
  }
};

// x's high bytes (tdpbssd: signed by signed codes) and low bytes (tdpbusd: unsigned) against one B tile of
// codes: the two int32 sums [16, 16] into `sums`, whose 256 h + l (amx_sum) is the int16 rows' exact sum
ANATOMY_AMX inline void amx_products(const void* codes, const int8_t* high, const uint8_t* low, int64_t stride,
                                     int32_t (&sums)[2][256]) {
  _tile_loadd(0, codes, 64);
  _tile_loadd(1, high, stride);
  _tile_loadd(2, low, stride);
  _tile_zero(3);
  _tile_zero(4);
  _tile_dpbssd(3, 1, 0);
  _tile_dpbusd(4, 2, 0);
  _tile_stored(3, sums[0], 64);
  _tile_stored(4, sums[1], 64);
}

ANATOMY_AMX inline __m512i amx_sum(const int32_t (&sums)[2][256], int r) {
  const __m512i high = _mm512_load_si512(sums[0] + 16 * r), low = _mm512_load_si512(sums[1] + 16 * r);
  return _mm512_add_epi32(_mm512_slli_epi32(high, 8), low);
}
#endif

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q4_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits);
at::Tensor q5_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits);
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q5_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q5f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q4f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q8f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q8_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits);
at::Tensor l4_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits);
at::Tensor q6_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q6f_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q6s_linear(const at::Tensor& x, const at::Tensor& w, bool portable);
at::Tensor q6_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable, int64_t bits = 16);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                            const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& lut,
                            double scale, bool portable, const c10::optional<at::Tensor>& tables);

}  // namespace anatomy
