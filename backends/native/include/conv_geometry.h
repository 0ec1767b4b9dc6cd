// The geometry of a 1-D or 2-D convolution or pooling window, checked against the tensors.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel.h"

namespace onnxlens {

struct Window2d {
  int64_t N, C, H, W;      // input (a 1-D input has H = 1)
  int64_t OH, OW;          // output
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t pt, pl, pb, pr;  // pads: top, left, bottom, right
};

// Reads strides / pads / dilations (ONNX order: begins then ends) for a window of `kernel`
// over `x` (rank 3 or 4) and checks that the output is `y_spatial`; `ceil` rounds the output
// size up (pooling's ceil_mode).
Window2d window_2d(const KernelContext& ctx, const Tensor& x,
                   const std::vector<int64_t>& kernel, const std::vector<int64_t>& y_shape,
                   bool ceil = false);

// Every output row of every block of `lanes` channels of the blocked window `a` (simd.h
// BlockedWindow: a depthwise convolution or a max pool) from blocked x into blocked y, shared
// out over the pool's threads. `a` holds the geometry, filters and epilogue of block 0 (its
// residual, when set, at the output's start); `block(a, b)` points it at block b's filters and
// per-lane constants before that block's rows run.
template <class Block>
void run_blocked_window(ThreadPool& pool, const SimdKernels& s, const Window2d& g,
                        int64_t lanes, const float* x, float* y, const BlockedWindow& a,
                        Block block) {
  const int64_t blocks = g.C / lanes, rows = g.N * blocks * g.OH;
  pool.for_range(rows, pool.chunk_for(rows), [&](int, int64_t begin, int64_t end) {
    BlockedWindow row = a;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t nb = r / g.OH, at = r * g.OW * lanes;
      block(row, nb % blocks);
      row.oy = r % g.OH;
      row.in = x + nb * g.H * g.W * lanes;
      row.out = y + at;
      if (a.residual != nullptr) row.residual = a.residual + at;
      s.blocked_window(row);
    }
  }, checked_mul(rows * g.OW, g.kh * g.kw * lanes));
}

// A BlockedWindow of window g with no filters (a max pool) and no epilogue.
inline BlockedWindow blocked_window_of(const Window2d& g) {
  return {nullptr, nullptr, nullptr, g.H, g.W, g.OW, 0, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl,
          g.dh, g.dw, nullptr, nullptr, nullptr, -INFINITY, INFINITY};
}

}  // namespace onnxlens
