// The greedy screen's bfloat16 products (bfloat16_linear.cpp) through AMX (Intel since Sapphire Rapids): one
// tdpbf16ps multiplies a 16 x 32 tile of input rows by 32 x 16 of weight rows into 16 x 16 float32 sums, 16 times
// vdpbf16ps's work, so the layer reads its copy at the memory's speed where vdpbf16ps, one a cycle a core on an
// Intel Xeon, is bound by arithmetic (bench/results/log.md, "The greedy screen through AMX's tiles"). Each product of two bfloat16 values is exact in float32 and the sums are
// float32 with what is below the smallest normal flushed to zero, as vdpbf16ps does, in an order of the hardware's:
// the screen's bound holds for any order. A row's sums do not depend on the other rows of the tile.
//
// Linux hands AMX's 8 KB of tile state to a process only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM); a kernel,
// VM or CPU that refuses leaves vdpbf16ps in place.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bfloat16_pairs.h"
#include "weight_rows.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int kTileRows = 16;  // input rows of an A tile, and sums of a C tile's row
constexpr int64_t kTilePairs = 16;  // value pairs of an A tile's row (64 bytes), rows of a B tile
// Tile registers (their numbers are immediates): a panel's 16-row block of sums in 0, 1, 2, the input rows' tile in
// 3, the panel's B tiles in 4, 5, 6.
static_assert(kPairPanel == 3 * 16, "a panel is three B tiles wide");
constexpr int kTilesUsed = 7;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

bool granted() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
  constexpr int kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

// Sums 0, 1, 2 = 16 input rows (x, 2 * pairs values a row) times one panel's 48 weight rows: from zero, one
// tdpbf16ps per B tile for each 16 pairs, in order.
inline void multiply_panel(const uint16_t* x, int64_t pairs, const uint16_t* panel) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  for (int64_t i = 0; i < pairs; i += kTilePairs) {
    _tile_loadd(3, x + 2 * i, 4 * pairs);
    const uint16_t* rows = panel + i * kPairPanel * 2;
    _tile_loadd(4, rows, 4 * kPairPanel);
    _tile_loadd(5, rows + 32, 4 * kPairPanel);
    _tile_loadd(6, rows + 64, 4 * kPairPanel);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(1, 3, 5);
    _tile_dpbf16ps(2, 3, 6);
  }
}

}  // namespace

bool bfloat16_tiles_available() {
  static const bool available = granted();
  return available;
}

bool bfloat16_tiles_serve(int64_t pairs) { return pairs % kTilePairs == 0 && bfloat16_tiles_available(); }

void bfloat16_tile_products(const uint16_t* x, int64_t rows, const uint16_t* packed, int64_t n, int64_t pairs,
                            float* out) {
  TORCH_CHECK(bfloat16_tiles_serve(pairs), "bfloat16 tiles: not on this CPU or this K");
  // The input rows in whole tiles, the last one's missing rows zeros.
  const int64_t blocks = (rows + kTileRows - 1) / kTileRows;
  std::vector<uint16_t> padded(blocks * kTileRows * 2 * pairs, 0);
  std::copy_n(x, rows * 2 * pairs, padded.data());
  const int64_t panels = (n + kPairPanel - 1) / kPairPanel;
  weight_rows::guided_chunks(panels, 1, INT64_MAX, [&](int64_t first, int64_t last) {
    TileConfig config;  // a thread's tiles are its own: each configures them
    for (int t = 0; t < kTilesUsed; ++t) {
      config.bytes_per_row[t] = 64;
      config.rows[t] = kTileRows;
    }
    _tile_loadconfig(&config);
    alignas(64) float partial[kTileRows * kPairPanel];  // a tile's rows past `rows`, or the last panel's
    for (int64_t p = first; p < last; ++p) {
      const uint16_t* panel = packed + p * pairs * kPairPanel * 2;
      const int64_t n0 = p * kPairPanel, cols = std::min(kPairPanel, n - n0);
      for (int64_t b = 0; b < blocks; ++b) {
        multiply_panel(padded.data() + b * kTileRows * 2 * pairs, pairs, panel);
        const int64_t m = b * kTileRows, valid = std::min<int64_t>(kTileRows, rows - m);
        const bool whole = valid == kTileRows && cols == kPairPanel;
        float* sums = whole ? out + m * n + n0 : partial;
        const int64_t stride = 4 * (whole ? n : kPairPanel);
        _tile_stored(0, sums, stride);
        _tile_stored(1, sums + 16, stride);
        _tile_stored(2, sums + 32, stride);
        if (!whole)
          for (int64_t r = 0; r < valid; ++r) std::copy_n(partial + r * kPairPanel, cols, out + (m + r) * n + n0);
      }
    }
    _tile_release();  // the OS then saves no tile state when it switches this thread out
  });
}

#else

bool bfloat16_tiles_available() { return false; }

bool bfloat16_tiles_serve(int64_t) { return false; }

void bfloat16_tile_products(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*) {
  TORCH_CHECK(false, "bfloat16 tiles: not compiled for this CPU");
}

#endif
