// MaxPool, AveragePool (1-D and 2-D windows; pads explicit, auto_pad resolved by the planner),
// GlobalAveragePool, GlobalMaxPool. One channel plane per task.
#include <algorithm>
#include <cmath>

#include "conv_geometry.h"

namespace onnxlens {

namespace {

class PoolKernel : public XyKernel {
 public:
  PoolKernel(const KernelContext& ctx, bool max) : XyKernel(ctx, 1, 1), max_(max) {
    g_ = window_2d(ctx, x_, ctx.ints("kernel_shape"), y_.shape, ctx.attr("ceil_mode", 0) != 0);
    require(y_.dim(1) == g_.C, ctx.spec.op, ": output channels ", show(y_.shape));
    include_pad_ = ctx.attr("count_include_pad", 0) != 0;
    require(max_ || (g_.dh == 1 && g_.dw == 1), "AveragePool: dilations are not supported");
    columns();
  }

  // The window's rows reduced into one (PoolRowArgs::rows), and that row split into its even
  // and odd columns (PoolRowArgs::split) for stride 2.
  int64_t workspace_floats() const override { return g_.W + (split_rows() ? g_.W + 1 : 0); }

  void run(ThreadPool& pool, const Workspace& ws) override {
    if (x_.block != 0) return run_blocked(pool);
    pool.for_range(g_.N * g_.C, pool.chunk_for(g_.N * g_.C),
                   [&](int tid, int64_t begin, int64_t end) {
      const Range r{begin, end};
      for (int64_t p = r.begin; p < r.end; ++p) {
        float* rows = ws.get(tid);
        plane(x_.f32() + p * g_.H * g_.W, y_.f32() + p * g_.OH * g_.OW, rows,
              split_rows() ? rows + g_.W : nullptr);
      }
    }, y_.numel * g_.kh * g_.kw);
  }

 private:
  // A max pool over blocked tensors (pool_blocked_io).
  void run_blocked(ThreadPool& pool) const {
    run_blocked_window(pool, simd_, g_, x_.block, x_.f32(), y_.f32(), blocked_window_of(g_),
                       [](BlockedWindow&, int64_t) {});
  }

  // First on-grid index >= 0 of a window starting at `start` with step `d`, and its end.
  static void clip(int64_t start, int64_t k, int64_t d, int64_t n, int64_t& lo, int64_t& hi) {
    lo = start >= 0 ? start : start + (-start + d - 1) / d * d;
    hi = std::min(start + (k - 1) * d + 1, n);
  }

  void columns() {
    x0_.resize(static_cast<size_t>(g_.OW));
    x1_.resize(static_cast<size_t>(g_.OW));
    lo_ = g_.OW;
    hi_ = 0;
    for (int64_t ox = 0; ox < g_.OW; ++ox) {
      const int64_t start = ox * g_.sw - g_.pl;
      clip(start, g_.kw, g_.dw, g_.W, x0_[ox], x1_[ox]);
      if (start >= 0 && start + (g_.kw - 1) * g_.dw < g_.W) {
        lo_ = std::min(lo_, ox);
        hi_ = ox + 1;
      }
    }
  }

  bool split_rows() const { return g_.sw == 2 && g_.dw == 1; }

  void plane(const float* in, float* out, float* rows, float* split) const {
    PoolRowArgs a{in, nullptr, g_.W, g_.OW, g_.kw, g_.sw, g_.pl, g_.dh, g_.dw, 0, 0,
                  x0_.data(), x1_.data(), lo_, hi_, max_, rows, split};
    for (int64_t oy = 0; oy < g_.OH; ++oy) {
      a.out = out + oy * g_.OW;
      clip(oy * g_.sh - g_.pt, g_.kh, g_.dh, g_.H, a.y0, a.y1);
      simd_.pool_row(a);
      if (!max_) divide(a.out, oy, a.y1 - std::max<int64_t>(a.y0, 0));
    }
  }

  // ONNX Runtime's rule: with count_include_pad the divisor counts pad cells but not the
  // overhang of a ceil_mode window past the padding.
  void divide(float* row, int64_t oy, int64_t rows) const {
    const int64_t y0 = oy * g_.sh - g_.pt;
    const int64_t padded_rows = std::min(y0 + g_.kh, g_.H + g_.pb) - y0;
    for (int64_t ox = 0; ox < g_.OW; ++ox) {
      const int64_t x0 = ox * g_.sw - g_.pl;
      const int64_t padded = padded_rows * (std::min(x0 + g_.kw, g_.W + g_.pr) - x0);
      const int64_t count = include_pad_ ? padded : rows * (x1_[ox] - x0_[ox]);
      row[ox] = count > 0 ? row[ox] / static_cast<float>(count) : 0.0f;
    }
  }

  Window2d g_{};
  bool max_;
  bool include_pad_ = false;
  std::vector<int64_t> x0_, x1_;
  int64_t lo_ = 0, hi_ = 0;  // output columns whose window is inside the input
};

class GlobalPoolKernel : public XyKernel {
 public:
  GlobalPoolKernel(const KernelContext& ctx, bool max) : XyKernel(ctx, 1, 1), max_(max) {
    require(x_.rank() >= 2, ctx.spec.op, ": input ", show(x_.shape));
    std::vector<int64_t> expect(x_.shape.size(), 1);
    expect[0] = x_.dim(0);
    expect[1] = x_.dim(1);
    require(y_.shape == expect, ctx.spec.op, ": output ", show(y_.shape));
    planes_ = x_.dim(0) * x_.dim(1);
    size_ = planes_ ? x_.numel / planes_ : 0;
  }

  void run(ThreadPool& pool, const Workspace&) override {
    pool.for_range(planes_, pool.chunk_for(planes_),
                   [&](int, int64_t begin, int64_t end) {
      const Range r{begin, end};
      for (int64_t p = r.begin; p < r.end; ++p) {
        const float* in = x_.f32() + p * size_;
        y_.f32()[p] = max_ ? simd_.max(in, size_)
                           : simd_.sum(in, size_) / static_cast<float>(size_);
      }
    }, x_.numel);
  }

 private:
  bool max_;
  int64_t planes_ = 0, size_ = 0;
};

// A 2-D MaxPool with one output reads and writes blocked tensors, both or neither.
BlockedIo pool_blocked_io(const KernelContext& ctx) {
  if (ctx.inputs() != 1 || ctx.spec.outputs.size() != 1) return {};
  if (!whole_channel_blocks(ctx.input(0), ctx.simd.conv_lanes)) return {};
  return {true, true, false, false, {}};
}

}  // namespace

void register_pool(KernelRegistry& r) {
  add_kernel(r, "MaxPool", make_kernel<PoolKernel>(true), pool_blocked_io);
  add_kernel(r, "AveragePool", make_kernel<PoolKernel>(false));
  add_kernel(r, "GlobalMaxPool", make_kernel<GlobalPoolKernel>(true));
  add_kernel(r, "GlobalAveragePool", make_kernel<GlobalPoolKernel>(false));
}

}  // namespace onnxlens
