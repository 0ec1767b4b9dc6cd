// RMS normalization (ONNX Runtime's SimplifiedLayerNormalization and the contrib
// SkipSimplifiedLayerNormalization): rows over the trailing axes, y = s / sqrt(mean(s^2) + eps)
// * gamma, where s = x (+ skip (+ bias)) and the skip sum may be an output of its own (the
// residual stream a decoder carries to its next layer).
#include <algorithm>
#include <cmath>

#include "kernel.h"

namespace onnxlens {

namespace {

// Inputs: x, gamma, then skip and bias (either may be -1). Outputs: y, then the sum s when the
// graph reads it. `axis`: the first normalized axis (the planner resolves a negative one).
class RmsNormKernel : public XyKernel {
 public:
  explicit RmsNormKernel(const KernelContext& ctx)
      : XyKernel(ctx, 2, 4, std::clamp(static_cast<int>(ctx.spec.outputs.size()), 1, 2)),
        eps_(static_cast<float>(ctx.attr_f("epsilon", 1e-5))) {
    require(x_.shape == y_.shape, "RMSNormalization: output ", show(y_.shape), " for ",
            show(x_.shape));
    int64_t axis = ctx.attr("axis", -1);
    if (axis < 0) axis += x_.rank();
    require(axis >= 0 && axis < std::max(x_.rank(), 1), "RMSNormalization: axis ", axis,
            " out of range for ", show(x_.shape));
    for (int d = static_cast<int>(axis); d < x_.rank(); ++d) len_ *= x_.dim(d);
    rows_ = len_ ? x_.numel / len_ : 0;
    gamma_ = row_vector(ctx, 1, "gamma");
    if (ctx.has_input(2)) {
      const Tensor& skip = ctx.input(2);
      require(skip.numel > 0 && skip.numel % len_ == 0 && x_.numel % skip.numel == 0,
              "RMSNormalization: skip ", show(skip.shape), " does not broadcast to ",
              show(x_.shape));
      skip_ = skip.f32();
      skip_rows_ = skip.numel / len_;
    }
    if (ctx.has_input(3)) bias_ = row_vector(ctx, 3, "bias");
    if (ctx.spec.outputs.size() == 2) {
      require(ctx.output(1).shape == x_.shape, "RMSNormalization: skip sum ",
              show(ctx.output(1).shape), " for ", show(x_.shape));
      sum_ = ctx.output(1).f32();
    }
  }

  int64_t workspace_floats() const override { return 2 * len_; }

  void run(ThreadPool& pool, const Workspace& ws) override {
    pool.for_range(rows_, pool.chunk_for(rows_), [&](int tid, int64_t begin, int64_t end) {
      float* buf = ws.get(tid);
      for (int64_t row = begin; row < end; ++row) one(row, buf);
    }, x_.numel * 4);
  }

 private:
  const float* row_vector(const KernelContext& ctx, int i, const char* what) const {
    const Tensor& t = ctx.input(i);
    require(t.numel == len_, "RMSNormalization: ", what, " ", show(t.shape), " for rows of ",
            len_);
    return t.f32();
  }

  // s into the sum output (or scratch), then its mean square and the scaled row.
  void one(int64_t row, float* buf) const {
    const float* x = x_.f32() + row * len_;
    const float* s = x;
    if (skip_) {
      float* out = sum_ ? sum_ + row * len_ : buf + len_;
      simd_.binary(EwOp::Add, out, {x, 1}, {skip_ + (row % skip_rows_) * len_, 1}, len_);
      if (bias_) simd_.binary(EwOp::Add, out, {out, 1}, {bias_, 1}, len_);
      s = out;
    }
    simd_.binary(EwOp::Mul, buf, {s, 1}, {s, 1}, len_);
    const float mean_square = len_ ? simd_.sum(buf, len_) / static_cast<float>(len_) : 0.0f;
    const float rstd = 1.0f / std::sqrt(mean_square + eps_);
    simd_.normalize(y_.f32() + row * len_, s, 0.0f, rstd, gamma_, nullptr, len_);
  }

  float eps_;
  int64_t len_ = 1, rows_ = 0, skip_rows_ = 1;
  const float* gamma_ = nullptr;
  const float* skip_ = nullptr;
  const float* bias_ = nullptr;
  float* sum_ = nullptr;
};

}  // namespace

void register_rms_norm(KernelRegistry& r) {
  add_kernel(r, "RMSNormalization", make_kernel<RmsNormKernel>());
}

}  // namespace onnxlens
