// MaxPool and AveragePool over 1-D / 2-D windows: one thread per output element.
#pragma once

#include <cstdint>

#include "arith.h"
#include "launch.h"

namespace onnxlens::cuda {

struct PoolArgs {
  const float* x;  // [N, C, H, W] (1-D: H = 1)
  float* y;        // [N, C, OH, OW]
  int64_t NC, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
  bool max;
  bool count_include_pad;  // AveragePool: divide by the window inside the padded input
};

// The pooled value of output element `o`. An average divides by the positions inside the input,
// or with count_include_pad inside the padded input (a ceil_mode window can pass even that).
ONNXLENS_HD float pool_at(const PoolArgs& a, int64_t o) {
  const int64_t ox = o % a.OW, oy = o / a.OW % a.OH, plane = o / (a.OW * a.OH);
  const float* x = a.x + plane * a.H * a.W;
  float acc = a.max ? -INFINITY : 0.0f;
  int64_t inside = 0, padded = 0;
  for (int64_t ky = 0; ky < a.kh; ++ky) {
    const int64_t iy = oy * a.sh - a.pt + ky * a.dh;
    for (int64_t kx = 0; kx < a.kw; ++kx) {
      const int64_t ix = ox * a.sw - a.pl + kx * a.dw;
      padded += iy < a.H + a.pb && ix < a.W + a.pr;
      if (iy < 0 || iy >= a.H || ix < 0 || ix >= a.W) continue;
      const float v = x[iy * a.W + ix];
      acc = a.max ? onnxlens::arith::max(acc, v) : acc + v;
      ++inside;
    }
  }
  if (a.max) return acc;
  return acc / static_cast<float>(a.count_include_pad ? padded : inside);
}

struct PoolKernel {
  static constexpr int kThreads = 256;
  using Args = PoolArgs;
  struct Shared {};
  struct Regs {};

  static Dim3 grid(const Args& a) { return cover(a.NC * a.OH * a.OW, kThreads); }
  static Dim3 block(const Args&) { return Dim3{kThreads, 1, 1}; }
  ONNXLENS_HD static int phases(const Args&) { return 0; }
  ONNXLENS_HD static void phase(const Args&, const Thread&, int, Shared&, Regs&) {}
  ONNXLENS_HD static void finish(const Args& a, const Thread& t, Shared&, Regs&) {
    const int64_t o = t.global_x();
    if (o < a.NC * a.OH * a.OW) a.y[o] = pool_at(a, o);
  }
};

}  // namespace onnxlens::cuda
