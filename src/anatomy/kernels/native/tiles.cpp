// The int4 product with int8 activations on a layout made for a few rows of x at once: 16 output rows
// interleaved (a "tile"), so that one vpdpbusd multiplies 4 inputs of each of the 16 rows by the same 4
// inputs of a row of x, broadcast to every lane. The 16 lanes are the 16 outputs: a group of 32 inputs
// is 8 such instructions into one int32 sum per output, scaled once per group and row of x (gemv.cpp's
// q4 loops sum a row's products across lanes, unpack its codes for each output row and narrow and
// scale per 128 weights and output row: several times the instructions per product).
//
//   q4 tiles (pack_q4_tiles, from the q4 layout; N a multiple of 16): per tile of 16 output rows and
//   group g of 32 inputs, 320 bytes: d [16] float16, m [16] float16 (the rows' scales and minimums),
//   then 4 vectors of 64 bytes; byte 4r + i of vector v holds the code of row r, input 4v + i in its
//   low nibble and that of input 4(v + 4) + i in its high one
//       y[m, n] = sum_g sx[m, g] * (d[n, g] * sum_i q[n, i] qx[m, i] + m[n, g] * sum_i qx[m, i])
//   q4_tiles_linear(x [M, K] float, tiles [N/16, K/32, 320]) -> [M, N]     (x quantized as q4_linear's)
//
// The AVX-512 VNNI loop runs where the CPU has it; elsewhere the portable one (for checking: the
// engine makes tiles only where VNNI runs).

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <immintrin.h>
#include <cstdint>
#include <cstring>

#include "gemv_avx2.h"
#include "native.h"

namespace {

using anatomy::AHEAD;
using anatomy::Isa;
using anatomy::PAIR;
using anatomy::Q4_BLOCK;
using anatomy::Quantized;

constexpr int64_t G = 32;            // inputs per group
constexpr int64_t TILE = 16;         // output rows per tile
constexpr int64_t TILE_BYTES = 320;  // per tile and group: 16 + 16 float16, 256 bytes of codes
constexpr int ROWS = 8;              // rows of x per pass over the tiles

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// where input i (0..31) of row r sits in a tile's group: byte offset, and whether in the high nibble
inline int64_t code_byte(int64_t r, int64_t i) { return 64 + (i / 4 % 4) * 64 + 4 * r + i % 4; }
inline bool code_high(int64_t i) { return i / 4 >= 4; }

void tiles_portable(const Quantized& a, int64_t m0, int64_t M, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                    float* y, int64_t N) {
  const int64_t groups = K / G;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < TILE; ++r)
      for (int64_t m = m0; m < m0 + M; ++m) {
        float total = 0.f;
        for (int64_t g = 0; g < groups; ++g) {
          const uint8_t* block = w + (t * groups + g) * TILE_BYTES;
          uint16_t dm[2];
          std::memcpy(&dm[0], block + 2 * r, 2);
          std::memcpy(&dm[1], block + 32 + 2 * r, 2);
          int32_t dot = 0;
          for (int64_t i = 0; i < G; ++i) {
            const uint8_t byte = block[code_byte(r, i)];
            dot += (code_high(i) ? byte >> 4 : byte & 0x0F) * a.q[m * K + g * G + i];
          }
          const float sx = a.scale[m * groups + g];
          total += half_to_float(dm[0]) * sx * dot + half_to_float(dm[1]) * sx * a.sum[m * groups + g];
        }
        y[m * N + t * TILE + r] = total;
      }
}

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

// rows [m0, m0 + M) of x against tiles [t0, t1): per group, the tile's codes unpacked once for the M rows,
// each row's sum in two chains of 4 vpdpbusd
template <int M>
AVX512_VNNI void tiles_avx512(const Quantized& a, int64_t m0, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                              float* y, int64_t N) {
  const int64_t groups = K / G;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = w + (t * groups + g) * TILE_BYTES;
      for (int64_t line = 0; line < TILE_BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + AHEAD + line, _MM_HINT_T0);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
      const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
      __m512i q[8];
      for (int v = 0; v < 4; ++v) {
        const __m512i packed = _mm512_loadu_si512(block + 64 + 64 * v);
        q[v] = _mm512_and_si512(packed, low);
        q[v + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      }
      for (int m = 0; m < M; ++m) {
        const int64_t row = m0 + m;
        int32_t x4[8];
        std::memcpy(x4, a.q.data() + row * K + g * G, sizeof(x4));
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int j = 0; j < 8; j += 2) {
          s0 = _mm512_dpbusd_epi32(s0, q[j], _mm512_set1_epi32(x4[j]));
          s1 = _mm512_dpbusd_epi32(s1, q[j + 1], _mm512_set1_epi32(x4[j + 1]));
        }
        const float sx = a.scale[row * groups + g];
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(d, _mm512_set1_ps(sx)),
                                 acc[m]);
        acc[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sx * static_cast<float>(a.sum[row * groups + g])), acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + (m0 + m) * N + t * TILE, acc[m]);
  }
}

template <int M>
void tiles_dispatch(int rows, const Quantized& a, int64_t m0, int64_t K, const uint8_t* w, int64_t t0, int64_t t1,
                    float* y, int64_t N) {
  if constexpr (M > 1) {
    if (rows < M) return tiles_dispatch<M - 1>(rows, a, m0, K, w, t0, t1, y, N);
  }
  tiles_avx512<M>(a, m0, K, w, t0, t1, y, N);
}

// the q4 layout [N, K/64 * 40] -> tiles [N/16, K/32, 320]
at::Tensor pack_q4_tiles(const at::Tensor& q4) {
  TORCH_CHECK(q4.dim() == 2 && q4.scalar_type() == at::kByte && q4.size(1) % Q4_BLOCK == 0,
              "anatomy::pack_q4_tiles: the q4 layout is uint8 [N, K/64 * 40]");
  TORCH_CHECK(q4.size(0) % TILE == 0, "anatomy::pack_q4_tiles: N = ", q4.size(0), " is not a multiple of ", TILE);
  const int64_t N = q4.size(0), pairs = q4.size(1) / Q4_BLOCK, groups = 2 * pairs;
  at::Tensor src = q4.contiguous();
  at::Tensor out = at::zeros({N / TILE, groups, TILE_BYTES}, q4.options());
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = out.data_ptr<uint8_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = from + (n * pairs + g / 2) * Q4_BLOCK;
      const int64_t half = g % 2, r = n % TILE;
      uint8_t* tile = to + (n / TILE * groups + g) * TILE_BYTES;
      std::memcpy(tile + 2 * r, block + 4 * half, 2);       // d
      std::memcpy(tile + 32 + 2 * r, block + 4 * half + 2, 2);  // m
      for (int64_t i = 0; i < G; ++i) {
        const uint8_t code = half ? block[8 + i] >> 4 : block[8 + i] & 0x0F;
        tile[code_byte(r, i)] |= code_high(i) ? code << 4 : code;
      }
    }
  return out;
}

}  // namespace

namespace anatomy {

at::Tensor q4_tiles_linear(const at::Tensor& x, const at::Tensor& w, bool portable) {
  TORCH_CHECK(x.dim() == 2 && x.is_floating_point() && x.size(0) >= 1, "anatomy::q4_tiles_linear: x must be a float "
              "matrix [M, K]");
  TORCH_CHECK(x.size(1) % PAIR == 0, "anatomy::q4_tiles_linear: K = ", x.size(1), " must be a multiple of ", PAIR);
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(1) == x.size(1) / G &&
              w.size(2) == TILE_BYTES, "anatomy::q4_tiles_linear: tiles must be uint8 [N/16, K/32, 320] for K = ",
              x.size(1));
  const Isa level = anatomy::isa(portable);
  const Quantized a = anatomy::quantize_rows(x, level);
  const int64_t M = x.size(0), K = x.size(1), T = w.size(0), N = T * TILE;
  const uint8_t* tiles = w.data_ptr<uint8_t>();
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  float* out = y.data_ptr<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(ROWS, M - m0));
      if (level == Isa::Avx512Vnni) tiles_dispatch<ROWS>(rows, a, m0, K, tiles, t0, t1, out, N);
      else tiles_portable(a, m0, rows, K, tiles, t0, t1, out, N);
    }
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace anatomy

TORCH_LIBRARY_FRAGMENT(anatomy, m) {
  m.def("q4_tiles_linear(Tensor x, Tensor tiles, bool portable=False) -> Tensor");
  m.def("pack_q4_tiles(Tensor q4) -> Tensor");
}

TORCH_LIBRARY_IMPL(anatomy, CPU, m) {
  m.impl("q4_tiles_linear", anatomy::q4_tiles_linear);
  m.impl("pack_q4_tiles", pack_q4_tiles);
}
