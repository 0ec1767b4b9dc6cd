// Softmax / LogSoftmax along one axis, LayerNormalization over the trailing axes,
// InstanceNormalization per channel plane.
#include <algorithm>
#include <cmath>

#include "kernel.h"

namespace onnxlens {

namespace {

// [outer, len, inner] around `axis`; with `flatten` (opset < 13), len covers axis..end.
void split_axis(const Tensor& x, int64_t axis, bool flatten, int64_t& outer, int64_t& len,
                int64_t& inner) {
  require(axis >= 0 && axis < std::max(x.rank(), 1), "axis ", axis, " out of range for ",
          show(x.shape));
  outer = 1;
  len = 1;
  inner = 1;
  for (int d = 0; d < x.rank(); ++d) {
    int64_t& part = d < axis ? outer : (d == axis || flatten ? len : inner);
    part *= x.dim(d);
  }
}

class SoftmaxKernel : public XyKernel {
 public:
  SoftmaxKernel(const KernelContext& ctx, bool log) : XyKernel(ctx, 1, 1), log_(log) {
    require(x_.shape == y_.shape, ctx.spec.op, ": output shape differs");
    int64_t axis = ctx.attr("axis", -1);
    if (axis < 0) axis += x_.rank();
    split_axis(x_, axis, ctx.attr("flatten", 0) != 0, outer_, len_, inner_);
  }

  int64_t workspace_floats() const override { return inner_ > 1 ? 2 * len_ : 0; }

  void run(ThreadPool& pool, const Workspace& ws) override {
    pool.for_range(outer_ * inner_, pool.chunk_for(outer_ * inner_),
                   [&](int tid, int64_t begin, int64_t end) {
      const Range r{begin, end};
      float* buf = ws.get(tid);
      for (int64_t row = r.begin; row < r.end; ++row) {
        const int64_t o = row / inner_, i = row % inner_;
        const float* in = x_.f32() + o * len_ * inner_ + i;
        float* out = y_.f32() + o * len_ * inner_ + i;
        if (inner_ == 1) {
          one(in, out);
          continue;
        }
        for (int64_t k = 0; k < len_; ++k) buf[k] = in[k * inner_];
        one(buf, buf + len_);
        for (int64_t k = 0; k < len_; ++k) out[k * inner_] = buf[len_ + k];
      }
    }, x_.numel * 4);
  }

 private:
  void one(const float* in, float* out) const {
    if (len_ == 0) return;
    const float m = simd_.max(in, len_);
    const float s = simd_.exp_shift_sum(out, in, m, len_);
    if (log_) {
      const float shift = m + std::log(s);
      for (int64_t k = 0; k < len_; ++k) out[k] = in[k] - shift;
    } else {
      simd_.unary(EwOp::Affine, out, {out, 1}, len_, 1.0f / s, 0.0f);
    }
  }

  bool log_;
  int64_t outer_ = 1, len_ = 1, inner_ = 1;
};

// Mean and 1/sqrt(var + eps) of n values, two passes.
void moments(const SimdKernels& s, const float* x, int64_t n, float eps, float* buf,
             float& mean, float& rstd) {
  mean = s.sum(x, n) / static_cast<float>(n);
  s.unary(EwOp::Affine, buf, {x, 1}, n, 1.0f, -mean);
  s.binary(EwOp::Mul, buf, {buf, 1}, {buf, 1}, n);
  const float var = s.sum(buf, n) / static_cast<float>(n);
  rstd = 1.0f / std::sqrt(var + eps);
}

// Rows of len_ values, each normalized by its own mean and variance; apply() writes a row.
class MomentsKernel : public XyKernel {
 public:
  int64_t workspace_floats() const override { return len_; }

  void run(ThreadPool& pool, const Workspace& ws) override {
    pool.for_range(rows_, pool.chunk_for(rows_),
                   [&](int tid, int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const float* x = x_.f32() + row * len_;
        float mean, rstd;
        moments(simd_, x, len_, eps_, ws.get(tid), mean, rstd);
        apply(row, x, y_.f32() + row * len_, mean, rstd);
      }
    }, x_.numel * 4);
  }

 protected:
  MomentsKernel(const KernelContext& ctx, int min_in, int max_in, int outs = 1)
      : XyKernel(ctx, min_in, max_in, outs),
        eps_(static_cast<float>(ctx.attr_f("epsilon", 1e-5))) {}

  virtual void apply(int64_t row, const float* x, float* y, float mean, float rstd) const = 0;

  const float* scale_ = nullptr;
  const float* bias_ = nullptr;
  int64_t rows_ = 1, len_ = 1;
  float eps_;
};

// Rows over the trailing axes from `axis`; scale and bias (optional) per element of a row.
// Outputs 1 and 2, when present, take each row's mean and 1 / standard deviation.
class LayerNormKernel : public MomentsKernel {
 public:
  explicit LayerNormKernel(const KernelContext& ctx)
      : MomentsKernel(ctx, 1, 3, std::clamp(static_cast<int>(ctx.spec.outputs.size()), 1, 3)) {
    require(x_.shape == y_.shape, "LayerNormalization: output shape differs");
    int64_t axis = ctx.attr("axis", -1);
    if (axis < 0) axis += x_.rank();
    int64_t inner = 1;
    split_axis(x_, axis, true, rows_, len_, inner);
    for (size_t i = 1; i < ctx.spec.outputs.size(); ++i) {
      const Tensor& t = ctx.output(static_cast<int>(i));
      require(t.numel == rows_, "LayerNormalization: ", t.name, " ", show(t.shape), " for ",
              rows_, " rows");
      (i == 1 ? mean_ : rstd_) = t.f32();
    }
    for (int i = 1; i <= 2; ++i) {
      if (!ctx.has_input(i)) continue;
      const Tensor& t = ctx.input(i);
      require(t.numel == len_, "LayerNormalization: ", t.name, " ", show(t.shape), " for rows of ",
              len_);
      (i == 1 ? scale_ : bias_) = t.f32();
    }
  }

 private:
  void apply(int64_t row, const float* x, float* y, float mean, float rstd) const override {
    simd_.normalize(y, x, mean, rstd, scale_, bias_, len_);
    if (mean_) mean_[row] = mean;
    if (rstd_) rstd_[row] = rstd;
  }

  float* mean_ = nullptr;
  float* rstd_ = nullptr;
};

// One row per (image, channel) plane; scale and bias per channel.
class InstanceNormKernel : public MomentsKernel {
 public:
  explicit InstanceNormKernel(const KernelContext& ctx) : MomentsKernel(ctx, 3, 3) {
    require(x_.rank() >= 3 && x_.shape == y_.shape, "InstanceNormalization: ", show(x_.shape));
    channels_ = x_.dim(1);
    require(ctx.input(1).numel == channels_ && ctx.input(2).numel == channels_,
            "InstanceNormalization: scale and bias need ", channels_, " values");
    scale_ = ctx.input(1).f32();
    bias_ = ctx.input(2).f32();
    rows_ = x_.dim(0) * channels_;
    len_ = rows_ ? x_.numel / rows_ : 0;
  }

 private:
  void apply(int64_t row, const float* x, float* y, float mean, float rstd) const override {
    const int64_t c = row % channels_;
    simd_.unary(EwOp::Affine, y, {x, 1}, len_, rstd * scale_[c],
                bias_[c] - mean * rstd * scale_[c]);
  }

  int64_t channels_ = 1;
};

}  // namespace

void register_norm(KernelRegistry& r) {
  add_kernel(r, "Softmax", make_kernel<SoftmaxKernel>(false));
  add_kernel(r, "LogSoftmax", make_kernel<SoftmaxKernel>(true));
  add_kernel(r, "LayerNormalization", make_kernel<LayerNormKernel>());
  add_kernel(r, "InstanceNormalization", make_kernel<InstanceNormKernel>());
}

}  // namespace onnxlens
