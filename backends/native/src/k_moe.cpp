// MoE (ONNX Runtime's mixture-of-experts contrib op, as onnxruntime-genai writes gpt-oss; its
// QMoE reaches here with 4-bit experts laid out as MatMulNBits' weights, 8-bit ones
// dequantized by the planner): each token row's router logits softmaxed over the E experts,
// its top k picked (ties to the higher index, as ORT's partial sort of (probability, index)
// pairs), their probabilities renormalized to sum 1 when normalize_routing_weights; then for
// each picked expert e
//   h = fc1[e] · x + b1[e]    (fc1 [E, F·I, H], rows of H: F = 2 for SwiGLU's gate and linear
//                              interleaved, gate first)
//   a = act(h)                (relu, gelu (tanh form), silu, identity; SwiGLU: g = min(g,
//                              limit), l = clamp(l, ±limit), a = g · σ(alpha · g) · (l + beta))
//   y += weight · (fc2[e] · a + b2[e])   (fc2 [E, H, I])
// Experts are taken in order, each over the rows routed to it at once: two products on the
// core's GEMM (gemm.h, the float weights packed once as its B panels) or on MatMulNBits'
// 4-bit product (nbits.h), the columns split among the threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "gemm.h"
#include "kernel.h"
#include "nbits.h"

namespace onnxlens {

namespace {

enum class Activation : int64_t { kRelu = 0, kGelu = 1, kSilu = 2, kIdentity = 3, kSwiGlu = 4 };

// Inputs: input [.., H], router_probs [T, E], then per fc (fc1 [E, F·I, H], fc2 [E, H, I],
// out rows of in values) either its float weight and bias [E, rows] (bits 0: six inputs), or
// (bits 4: QMoE's 4-bit experts, ten inputs) its weight laid out per expert as MatMulNBits'
// (nbits.h: packed [E, blocks, block / 2, rows], scales and zeros [E, blocks, rows]) and bias.
// Output: [.., H].
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
        x_(ctx.input(0)), router_(ctx.input(1)), y_(ctx.output(0)) {
    const bool nbits = ctx.attr("bits", 0) == 4;
    require(x_.rank() >= 2 && router_.rank() == 2 && y_.shape == x_.shape, "MoE: input ",
            show(x_.shape), ", router ", show(router_.shape), ", output ", show(y_.shape));
    hidden_ = x_.shape.back();
    tokens_ = x_.numel / std::max<int64_t>(hidden_, 1);
    experts_ = router_.dim(1);
    const Tensor& fc2 = ctx.input(nbits ? 6 : 4);
    inter_ = nbits ? ctx.attr("inter", 0) : fc2.rank() == 3 ? fc2.dim(2) : 0;
    fc1_rows_ = (activation_ == Activation::kSwiGlu ? 2 : 1) * inter_;
    require(router_.dim(0) == tokens_ && k_ >= 1 && k_ <= experts_ && inter_ > 0 &&
                ctx.attr("activation", 0) >= 0 &&
                ctx.attr("activation", 0) <= static_cast<int64_t>(Activation::kSwiGlu),
            "MoE: router ", show(router_.shape), " for ", tokens_, " tokens, k ", k_, ", inter ",
            inter_, ", activation ", ctx.attr("activation", 0));
    const int bias1 = nbits ? 5 : 3, bias2 = nbits ? 9 : 5;
    if (nbits) {
      const std::vector<int64_t> block = ctx.ints("block_size");  // fc1's, fc2's
      require(block.size() == 2, "MoE: 4-bit experts need fc1's and fc2's block_size");
      fc1_ = nbits_experts(ctx, 2, hidden_, fc1_rows_, block[0]);
      fc2_ = nbits_experts(ctx, 6, inter_, hidden_, block[1]);
    } else {
      fc1_ = gemm_experts(ctx.input(2), hidden_, fc1_rows_);
      fc2_ = gemm_experts(ctx.input(4), inter_, hidden_);
    }
    b1_ = bias(ctx, bias1, fc1_rows_);
    b2_ = bias(ctx, bias2, hidden_);
    rows_.resize(static_cast<size_t>(tokens_ * (hidden_ + fc1_rows_ + inter_ + hidden_) +
                                     inter_));
    routes_.resize(static_cast<size_t>(experts_));
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
      product(pool, ws, a, m, fc1_, e, h);
      for (int64_t r = 0; r < m; ++r) {
        activate(h + r * fc1_rows_, b1_ ? b1_ + e * fc1_rows_ : nullptr, act + r * inter_,
                 out + tokens_ * hidden_);
      }
      product(pool, ws, act, m, fc2_, e, out);
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
  // One fc's experts: float weights as the GEMM's packed B panels, or 4-bit ones.
  struct Experts {
    std::vector<PackedOperand> gemm;
    std::vector<NbitsWeight> nbits;
  };

  static const KernelContext& checked(const KernelContext& ctx) {
    ctx.expect_arity(3, ctx.attr("bits", 0) == 4 ? 10 : 6, 1);  // the biases optional
    for (int i : {0, 1}) {
      require(ctx.input(i).dtype == DType::f32, "MoE: input ", i, " must be float32");
    }
    require(ctx.output(0).dtype == DType::f32, "MoE: output must be float32");
    return ctx;
  }

  // B(k, j) = w[e][j, k]: each expert's rows of k values as the GEMM's columns.
  Experts gemm_experts(const Tensor& w, int64_t k, int64_t n) const {
    require(w.dtype == DType::f32 && w.shape == std::vector<int64_t>{experts_, n, k},
            "MoE: expert weight ", show(w.shape), ", expected [", experts_, ", ", n, ", ", k,
            "] float32");
    Experts out;
    for (int64_t e = 0; e < experts_; ++e) {
      out.gemm.push_back(pack_b_const(simd_, w.f32() + e * n * k, 1, k, k, n));
    }
    return out;
  }

  // Inputs at..at + 2: the packed weight, scales and zeros of E experts' k x n products in
  // blocks of `block` values of k.
  Experts nbits_experts(const KernelContext& ctx, int at, int64_t k, int64_t n,
                        int64_t block) const {
    const Tensor& packed = ctx.input(at);
    const Tensor& scales = ctx.input(at + 1);
    const Tensor& zeros = ctx.input(at + 2);
    const int64_t blocks = block > 0 ? (k + block - 1) / block : 0;
    require(block >= 2 && block % 2 == 0 && packed.dtype == DType::u8 &&
                packed.numel == experts_ * blocks * (block / 2) * n &&
                scales.dtype == DType::f32 && scales.numel == experts_ * blocks * n &&
                zeros.dtype == DType::f32 && zeros.numel == scales.numel,
            "MoE: 4-bit experts ", show(packed.shape), ", scales ", show(scales.shape),
            ", zeros ", show(zeros.shape), " for ", experts_, " x ", k, " x ", n, " in blocks of ",
            block);
    Experts out;
    for (int64_t e = 0; e < experts_; ++e) {
      out.nbits.push_back({packed.as<uint8_t>() + e * blocks * (block / 2) * n,
                           scales.f32() + e * blocks * n, zeros.f32() + e * blocks * n, k, n,
                           block});
    }
    return out;
  }

  // Input i as a float32 bias of `width` values an expert, or null when absent.
  const float* bias(const KernelContext& ctx, int i, int64_t width) const {
    if (!ctx.has_input(i)) return nullptr;
    const Tensor& b = ctx.input(i);
    require(b.dtype == DType::f32 && b.numel == experts_ * width, "MoE: bias ",
            show(b.shape), " for ", experts_, " experts of ", width);
    return b.f32();
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

  // out [m, N] = a [m, K] · expert e's weight, its columns split among the threads.
  void product(ThreadPool& pool, const Workspace& ws, const float* a, int64_t m,
               const Experts& experts, int64_t e, float* out) const {
    if (!experts.nbits.empty()) {
      nbits_product(simd_, pool, a, m, experts.nbits[static_cast<size_t>(e)], nullptr, out);
      return;
    }
    const PackedOperand& b = experts.gemm[static_cast<size_t>(e)];
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
  // One routed row's activation of h (+ fc1's bias) into `a` (inter_ values), the
  // transcendental part on the SIMD table's elementwise kernels; `sig` holds inter_ floats.
  void activate(const float* h, const float* bias, float* a, float* sig) const {
    auto at = [&](int64_t i) { return h[i] + (bias ? bias[i] : 0.0f); };
    if (activation_ != Activation::kSwiGlu) {
      for (int64_t i = 0; i < inter_; ++i) a[i] = at(i);
      static constexpr EwOp kOps[] = {EwOp::Relu, EwOp::GeluTanh, EwOp::SiLU, EwOp::Identity};
      const EwOp op = kOps[static_cast<int>(activation_)];
      if (op != EwOp::Identity) simd_.unary(op, a, Src{a, 1}, inter_, 0.0f, 0.0f);
      return;
    }
    // g = min(gate, limit), l = clamp(linear, ±limit): a = g · σ(alpha · g) · (l + beta).
    for (int64_t i = 0; i < inter_; ++i) {
      a[i] = std::min(at(2 * i), limit_);
      sig[i] = alpha_ * a[i];
    }
    simd_.unary(EwOp::Sigmoid, sig, Src{sig, 1}, inter_, 0.0f, 0.0f);
    for (int64_t i = 0; i < inter_; ++i) {
      a[i] *= sig[i] * (std::clamp(at(2 * i + 1), -limit_, limit_) + beta_);
    }
  }

  const SimdKernels& simd_;
  int64_t k_;
  Activation activation_;
  bool normalize_;
  float alpha_, beta_, limit_;
  const Tensor& x_;
  const Tensor& router_;
  const Tensor& y_;
  Experts fc1_, fc2_;
  const float* b1_ = nullptr;
  const float* b2_ = nullptr;
  int64_t hidden_ = 0, tokens_ = 0, experts_ = 0, inter_ = 0, fc1_rows_ = 0;
  // The routed rows of x, h, act(h) and fc2's products, and a row of sigmoids.
  std::vector<float> rows_;
  std::vector<std::vector<std::pair<int64_t, float>>> routes_;  // per expert: token, weight
};

}  // namespace

void register_moe(KernelRegistry& r) { add_kernel(r, "MoE", make_kernel<MoEKernel>()); }

}  // namespace onnxlens
