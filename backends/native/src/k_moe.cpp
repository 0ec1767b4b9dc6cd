// MoE (ONNX Runtime's mixture-of-experts contrib op, as onnxruntime-genai writes gpt-oss; its
// QMoE reaches here with the expert weights dequantized by the planner): each token row's
// router logits softmaxed over the E experts, its top k picked (ties to the higher index, as
// ORT's partial sort of (probability, index) pairs), their probabilities renormalized to sum 1
// when normalize_routing_weights; then for each picked expert e
//   h = fc1[e] · x + b1[e]    (fc1 [E, F·I, H], rows of H: F = 2 for SwiGLU's gate and linear
//                              interleaved, gate first)
//   a = act(h)                (relu, gelu (tanh form), silu, identity; SwiGLU: g = min(g,
//                              limit), l = clamp(l, ±limit), a = g · σ(alpha · g) · (l + beta))
//   y += weight · (fc2[e] · a + b2[e])   (fc2 [E, H, I])
// Experts are taken in order, each over the rows routed to it at once: two products on the
// core's GEMM (gemm.h), the expert weights packed once as its B panels, the columns split
// among the threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "gemm.h"
#include "kernel.h"

namespace onnxlens {

namespace {

enum class Activation : int64_t { kRelu = 0, kGelu = 1, kSilu = 2, kIdentity = 3, kSwiGlu = 4 };

float sigmoid(float x) {
  return x > 0.0f ? 1.0f / (1.0f + std::exp(-x)) : std::exp(x) / (1.0f + std::exp(x));
}

// Inputs: input [.., H], router_probs [T, E], fc1 [E, F·I, H], fc1 bias [E, F·I] (-1 without),
// fc2 [E, H, I], fc2 bias [E, H] (-1 without). Output: [.., H].
class MoEKernel : public Kernel {
 public:
  explicit MoEKernel(const KernelContext& ctx)
      : simd_(checked(ctx).simd),
        k_(ctx.attr("k", 1)),
        activation_(static_cast<Activation>(ctx.attr("activation", 0))),
        normalize_(ctx.attr("normalize_routing_weights", 0) != 0),
        alpha_(static_cast<float>(ctx.attr_f("activation_alpha", 1.0))),
        beta_(static_cast<float>(ctx.attr_f("activation_beta", 0.0))),
        limit_(static_cast<float>(ctx.attr_f("swiglu_limit", INFINITY))),
        x_(ctx.input(0)), router_(ctx.input(1)), fc1_(ctx.input(2)), fc2_(ctx.input(4)),
        y_(ctx.output(0)) {
    require(x_.rank() >= 2 && router_.rank() == 2 && fc1_.rank() == 3 && fc2_.rank() == 3,
            "MoE: input ", show(x_.shape), ", router ", show(router_.shape), ", fc1 ",
            show(fc1_.shape), ", fc2 ", show(fc2_.shape));
    hidden_ = x_.shape.back();
    tokens_ = x_.numel / std::max<int64_t>(hidden_, 1);
    experts_ = router_.dim(1);
    const int64_t fusion = activation_ == Activation::kSwiGlu ? 2 : 1;
    inter_ = fc2_.dim(2);
    fc1_rows_ = fusion * inter_;
    require(router_.dim(0) == tokens_ && fc1_.shape == std::vector<int64_t>{experts_, fc1_rows_,
                                                                            hidden_} &&
                fc2_.shape == std::vector<int64_t>{experts_, hidden_, inter_} &&
                y_.shape == x_.shape && k_ >= 1 && k_ <= experts_,
            "MoE: input ", show(x_.shape), ", router ", show(router_.shape), ", fc1 ",
            show(fc1_.shape), ", fc2 ", show(fc2_.shape), ", k ", k_);
    if (ctx.has_input(3)) {
      require(ctx.input(3).numel == experts_ * fc1_rows_, "MoE: fc1 bias ",
              show(ctx.input(3).shape));
      b1_ = ctx.input(3).f32();
    }
    if (ctx.has_input(5)) {
      require(ctx.input(5).numel == experts_ * hidden_, "MoE: fc2 bias ",
              show(ctx.input(5).shape));
      b2_ = ctx.input(5).f32();
    }
    rows_.resize(static_cast<size_t>(tokens_ * (hidden_ + fc1_rows_ + inter_ + hidden_)));
    routes_.resize(static_cast<size_t>(experts_));
    // B(k, j) = w[e][j, k]: each expert's rows of k values as the GEMM's columns.
    for (int64_t e = 0; e < experts_; ++e) {
      fc1_packed_.push_back(pack_b_const(simd_, fc1_.f32() + e * fc1_rows_ * hidden_, 1,
                                         hidden_, hidden_, fc1_rows_));
      fc2_packed_.push_back(pack_b_const(simd_, fc2_.f32() + e * hidden_ * inter_, 1, inter_,
                                         inter_, hidden_));
    }
  }

  int64_t workspace_floats() const override { return gemm_workspace_floats(simd_, nullptr); }

  void run(ThreadPool& pool, const Workspace& ws) override {
    route();
    float* y = y_.f32();
    std::fill(y, y + y_.numel, 0.0f);
    float* a = rows_.data();
    float* h = a + tokens_ * hidden_;
    float* act = h + tokens_ * fc1_rows_;
    float* out = act + tokens_ * inter_;
    for (int64_t e = 0; e < experts_; ++e) {
      const auto& routes = routes_[static_cast<size_t>(e)];
      const int64_t m = static_cast<int64_t>(routes.size());
      if (m == 0) continue;
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(a + r * hidden_, x_.f32() + routes[static_cast<size_t>(r)].first * hidden_,
                    static_cast<size_t>(hidden_) * sizeof(float));
      }
      product(pool, ws, a, m, fc1_packed_[static_cast<size_t>(e)], h);
      for (int64_t r = 0; r < m; ++r) {
        activate(h + r * fc1_rows_, b1_ ? b1_ + e * fc1_rows_ : nullptr, act + r * inter_);
      }
      product(pool, ws, act, m, fc2_packed_[static_cast<size_t>(e)], out);
      for (int64_t r = 0; r < m; ++r) {
        const auto [token, weight] = routes[static_cast<size_t>(r)];
        const float* bias = b2_ ? b2_ + e * hidden_ : nullptr;
        float* dst = y + token * hidden_;
        for (int64_t j = 0; j < hidden_; ++j) {
          dst[j] += weight * (out[r * hidden_ + j] + (bias ? bias[j] : 0.0f));
        }
      }
    }
  }

 private:
  static const KernelContext& checked(const KernelContext& ctx) {
    ctx.expect_arity(3, 6, 1);  // fc1 bias (3) and fc2 bias (5) optional
    ctx.expect_f32_io();
    return ctx;
  }

  // Each token's top k experts and weights, appended (in token order) to the experts' routes.
  void route() {
    for (auto& r : routes_) r.clear();
    std::vector<std::pair<float, int64_t>> probs(static_cast<size_t>(experts_));
    for (int64_t t = 0; t < tokens_; ++t) {
      const float* logits = router_.f32() + t * experts_;
      const float m = *std::max_element(logits, logits + experts_);
      float sum = 0.0f;
      for (int64_t e = 0; e < experts_; ++e) {
        probs[static_cast<size_t>(e)] = {std::exp(logits[e] - m), e};
        sum += probs[static_cast<size_t>(e)].first;
      }
      for (auto& p : probs) p.first /= sum;
      std::partial_sort(probs.begin(), probs.begin() + k_, probs.end(), std::greater<>());
      float picked = 0.0f;
      for (int64_t j = 0; j < k_; ++j) picked += probs[static_cast<size_t>(j)].first;
      for (int64_t j = 0; j < k_; ++j) {
        const auto [p, e] = probs[static_cast<size_t>(j)];
        const float weight = normalize_ ? p / picked : p;
        if (weight > 0.0f) routes_[static_cast<size_t>(e)].push_back({t, weight});
      }
    }
  }

  // out [m, N] = a [m, K] · B (an expert's packed weight), B's column tiles split among the
  // threads.
  void product(ThreadPool& pool, const Workspace& ws, const float* a, int64_t m,
               const PackedOperand& b, float* out) const {
    const int64_t k = b.rows, n = b.cols, tiles = (n + simd_.nr - 1) / simd_.nr;
    GemmA ga;
    ga.p = a;
    ga.rs = k;
    ga.cs = 1;
    GemmB gb;
    gb.packed = &b;
    GemmC gc;
    gc.p = out;
    gc.ldc = n;
    pool.for_range(tiles, pool.chunk_for(tiles), [&](int tid, int64_t begin, int64_t end) {
      gemm(simd_, m, n, k, ga, gb, gc, 0, m, begin * simd_.nr,
           std::min(end * simd_.nr, n), ws.get(tid));
    }, 2 * m * n * k);
  }

  // One routed row's activation of h (+ fc1's bias) into `a` (inter_ values).
  void activate(const float* h, const float* bias, float* a) const {
    auto at = [&](int64_t i) { return h[i] + (bias ? bias[i] : 0.0f); };
    for (int64_t i = 0; i < inter_; ++i) {
      switch (activation_) {
        case Activation::kRelu: a[i] = std::max(at(i), 0.0f); break;
        case Activation::kGelu: {
          const float v = at(i);
          a[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
          break;
        }
        case Activation::kSilu: a[i] = at(i) * sigmoid(at(i)); break;
        case Activation::kIdentity: a[i] = at(i); break;
        case Activation::kSwiGlu: {
          const float gate = std::min(at(2 * i), limit_);
          const float linear = std::clamp(at(2 * i + 1), -limit_, limit_);
          a[i] = gate * sigmoid(alpha_ * gate) * (linear + beta_);
          break;
        }
      }
    }
  }

  const SimdKernels& simd_;
  int64_t k_;
  Activation activation_;
  bool normalize_;
  float alpha_, beta_, limit_;
  const Tensor& x_;
  const Tensor& router_;
  const Tensor& fc1_;
  const Tensor& fc2_;
  const Tensor& y_;
  const float* b1_ = nullptr;
  const float* b2_ = nullptr;
  int64_t hidden_ = 0, tokens_ = 0, experts_ = 0, inter_ = 0, fc1_rows_ = 0;
  std::vector<PackedOperand> fc1_packed_, fc2_packed_;  // per expert
  std::vector<float> rows_;  // the routed rows of x, h, act(h) and fc2's products
  std::vector<std::vector<std::pair<int64_t, float>>> routes_;  // per expert: token, weight
};

}  // namespace

void register_moe(KernelRegistry& r) { add_kernel(r, "MoE", make_kernel<MoEKernel>()); }

}  // namespace onnxlens
