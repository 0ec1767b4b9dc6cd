// MaxPool, AveragePool (1-D and 2-D windows; pads explicit, auto_pad resolved by the planner),
// GlobalAveragePool, GlobalMaxPool. One channel plane per task.
#include <algorithm>
#include <cmath>

#include "conv_geometry.h"

namespace onnxlens {

namespace {

class PoolKernel : public Kernel {
 public:
  PoolKernel(const KernelContext& ctx, bool max)
      : simd_(ctx.simd), x_(ctx.input(0)), y_(ctx.output(0)), max_(max) {
    ctx.expect_arity(1, 1, 1);
    ctx.expect_f32_io();
    g_ = window_2d(ctx, x_, ctx.ints("kernel_shape"), y_.shape, ctx.attr("ceil_mode", 0) != 0);
    require(y_.dim(1) == g_.C, ctx.spec.op, ": output channels ", show(y_.shape));
    include_pad_ = ctx.attr("count_include_pad", 0) != 0;
    require(max_ || (g_.dh == 1 && g_.dw == 1), "AveragePool: dilations are not supported");
  }

  void run(ThreadPool& pool, const Workspace&) override {
    pool.run([&](int tid, int n) {
      const Range r = split_range(g_.N * g_.C, tid, n);
      for (int64_t p = r.begin; p < r.end; ++p) {
        plane(x_.f32() + p * g_.H * g_.W, y_.f32() + p * g_.OH * g_.OW);
      }
    });
  }

 private:
  void plane(const float* in, float* out) const {
    for (int64_t oy = 0; oy < g_.OH; ++oy) {
      for (int64_t ox = 0; ox < g_.OW; ++ox) {
        out[oy * g_.OW + ox] = max_ ? max_at(in, oy, ox) : avg_at(in, oy, ox);
      }
    }
  }

  float max_at(const float* in, int64_t oy, int64_t ox) const {
    float m = -INFINITY;
    for (int64_t ky = 0; ky < g_.kh; ++ky) {
      const int64_t iy = oy * g_.sh - g_.pt + ky * g_.dh;
      if (iy < 0 || iy >= g_.H) continue;
      for (int64_t kx = 0; kx < g_.kw; ++kx) {
        const int64_t ix = ox * g_.sw - g_.pl + kx * g_.dw;
        if (ix >= 0 && ix < g_.W) m = std::max(m, in[iy * g_.W + ix]);
      }
    }
    return m;
  }

  // ONNX Runtime's rule: with count_include_pad the divisor counts pad cells but not the
  // overhang of a ceil_mode window past the padding.
  float avg_at(const float* in, int64_t oy, int64_t ox) const {
    int64_t y0 = oy * g_.sh - g_.pt, x0 = ox * g_.sw - g_.pl;
    int64_t y1 = std::min(y0 + g_.kh, g_.H + g_.pb), x1 = std::min(x0 + g_.kw, g_.W + g_.pr);
    const int64_t padded = (y1 - y0) * (x1 - x0);
    y0 = std::max<int64_t>(y0, 0);
    x0 = std::max<int64_t>(x0, 0);
    y1 = std::min(y1, g_.H);
    x1 = std::min(x1, g_.W);
    float s = 0.0f;
    for (int64_t iy = y0; iy < y1; ++iy) {
      for (int64_t ix = x0; ix < x1; ++ix) s += in[iy * g_.W + ix];
    }
    const int64_t count = include_pad_ ? padded : (y1 - y0) * (x1 - x0);
    return count > 0 ? s / static_cast<float>(count) : 0.0f;
  }

  const SimdKernels& simd_;
  const Tensor& x_;
  const Tensor& y_;
  Window2d g_{};
  bool max_;
  bool include_pad_ = false;
};

class GlobalPoolKernel : public Kernel {
 public:
  GlobalPoolKernel(const KernelContext& ctx, bool max)
      : simd_(ctx.simd), x_(ctx.input(0)), y_(ctx.output(0)), max_(max) {
    ctx.expect_arity(1, 1, 1);
    ctx.expect_f32_io();
    require(x_.rank() >= 2, ctx.spec.op, ": input ", show(x_.shape));
    std::vector<int64_t> expect(x_.shape.size(), 1);
    expect[0] = x_.dim(0);
    expect[1] = x_.dim(1);
    require(y_.shape == expect, ctx.spec.op, ": output ", show(y_.shape));
    planes_ = x_.dim(0) * x_.dim(1);
    size_ = planes_ ? x_.numel / planes_ : 0;
  }

  void run(ThreadPool& pool, const Workspace&) override {
    pool.run([&](int tid, int n) {
      const Range r = split_range(planes_, tid, n);
      for (int64_t p = r.begin; p < r.end; ++p) {
        const float* in = x_.f32() + p * size_;
        y_.f32()[p] = max_ ? simd_.max(in, size_)
                           : simd_.sum(in, size_) / static_cast<float>(size_);
      }
    });
  }

 private:
  const SimdKernels& simd_;
  const Tensor& x_;
  const Tensor& y_;
  bool max_;
  int64_t planes_ = 0, size_ = 0;
};

template <typename K, bool Max>
KernelFactory make() {
  return [](const KernelContext& ctx) { return std::unique_ptr<Kernel>(new K(ctx, Max)); };
}

}  // namespace

void register_pool(KernelRegistry& r) {
  add_kernel(r, "MaxPool", make<PoolKernel, true>());
  add_kernel(r, "AveragePool", make<PoolKernel, false>());
  add_kernel(r, "GlobalMaxPool", make<GlobalPoolKernel, true>());
  add_kernel(r, "GlobalAveragePool", make<GlobalPoolKernel, false>());
}

}  // namespace onnxlens
