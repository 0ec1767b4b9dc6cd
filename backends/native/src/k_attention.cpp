// GroupQueryAttention (ONNX Runtime's contrib op, as onnxruntime-genai's decoders use it): the
// new tokens' queries, keys and values (packed in one tensor, or three), rotary embedding on
// the queries and new keys, the KV cache extended (present = past + new), causal attention
// with one KV head per group of num_heads / kv_num_heads query heads.
//
// ONNX Runtime 1.31's semantics, read off its outputs (tests/test_native_decoder.py):
// - local_window_size W > 0: the query at position p attends the keys at (p - W, p], W of them;
// - sliding_window_cache: past and present are buffers of W rows (the builder's capacity
//   with its default cache_slack of 0) holding the latest tokens, oldest first. The new keys
//   are appended to the past's valid rows (min(past tokens, W)), and present keeps the last W
//   of them; rows past those are unspecified (zero here). A wider buffer is refused: ORT then
//   infers how full it is from the token count as if it had been filled one decode step at a
//   time (what it holds cycles with period C - W + 1);
// - a sink (head_sink[h], or 0 for every head with smooth_softmax): one more logit in each
//   softmax's denominator, with no value: p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k)).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel.h"

namespace onnxlens {

namespace {

// Query rows a KV head serves from which its keys are transposed first (transposed_scores).
constexpr int64_t kTransposeRows = 8;

// scores[j] = scale · q · k_j for `keys` rows of `head` values.
__attribute__((always_inline)) inline void key_scores(const float* q, const float* k,
                                                      int64_t keys, int64_t head, float scale,
                                                      float* scores) {
  for (int64_t j = 0; j < keys; ++j) scores[j] = scale * dot16(q, k + j * head, head);
}

// scores[j] = scale · Σ_d q[d] · kt[d, first + j] for `keys` columns of a head's keys stored
// transposed (kt: [head, stride]): every pass runs along the keys, no horizontal sums.
__attribute__((always_inline)) inline void transposed_scores(const float* q, const float* kt,
                                                             int64_t stride, int64_t keys,
                                                             int64_t head, float scale,
                                                             float* scores) {
  std::fill(scores, scores + keys, 0.0f);
  int64_t d = 0;
  for (; d + 4 <= head; d += 4) {
    const float* r = kt + d * stride;
    const float q0 = q[d], q1 = q[d + 1], q2 = q[d + 2], q3 = q[d + 3];
    for (int64_t j = 0; j < keys; ++j) {
      scores[j] += q0 * r[j] + q1 * r[stride + j] + q2 * r[2 * stride + j] +
                   q3 * r[3 * stride + j];
    }
  }
  for (; d < head; ++d) {
    for (int64_t j = 0; j < keys; ++j) scores[j] += q[d] * kt[d * stride + j];
  }
  for (int64_t j = 0; j < keys; ++j) scores[j] *= scale;
}

using TransposedFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float,
                              float*);

// acc = Σ_j p_j · scale · v_j.
__attribute__((always_inline)) inline void weighted_values(const float* p, const float* v,
                                                           int64_t keys, int64_t head,
                                                           float scale, float* acc) {
  std::fill(acc, acc + head, 0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    const float w = p[j] * scale;
    for (int64_t d = 0; d < head; ++d) acc[d] += w * v[j * head + d];
  }
}

// The two products' signature: their builds for the table's instruction set (isa_build).
using ProductFn = void (*)(const float*, const float*, int64_t, int64_t, float, float*);

// Inputs: query, key, value (key and value -1 when the query packs all three), past_key,
// past_value (-1 with no cache), seqlens_k (int32, per batch: total length - 1), cos_cache,
// sin_cache (-1 without rotary), head_sink (-1 without). Outputs: output, present_key,
// present_value.
class GroupQueryAttentionKernel : public Kernel {
 public:
  explicit GroupQueryAttentionKernel(const KernelContext& ctx)
      : simd_(ctx.simd),
        scores_(isa_build<&key_scores>(ctx.simd)),
        transposed_(isa_build<&transposed_scores>(ctx.simd)),
        values_(isa_build<&weighted_values>(ctx.simd)),
        heads_(ctx.attr("num_heads", 0)), kv_heads_(ctx.attr("kv_num_heads", 0)),
        rotary_(ctx.attr("do_rotary", 0) != 0),
        interleaved_(ctx.attr("rotary_interleaved", 0) != 0),
        softcap_(static_cast<float>(ctx.attr_f("softcap", 0.0))),
        window_(ctx.attr("local_window_size", -1)),
        sliding_(ctx.attr("sliding_window_cache", 0) != 0),
        smooth_(ctx.attr("smooth_softmax", 0) != 0) {
    require(ctx.inputs() == 9 && ctx.spec.outputs.size() == 3 && ctx.has_input(0) &&
                ctx.has_input(5),
            "GroupQueryAttention: 9 inputs (query and seqlens_k given) and 3 outputs");
    for (int i = 0; i < 9; ++i) {
      const DType want = i == 5 ? DType::i32 : DType::f32;
      require(!ctx.has_input(i) || ctx.input(i).dtype == want, "GroupQueryAttention: input ", i,
              " is ", ctx.has_input(i) ? dtype_name(ctx.input(i).dtype) : "", ", expected ",
              dtype_name(want));
    }
    for (int i = 0; i < 3; ++i) {
      require(ctx.output(i).dtype == DType::f32, "GroupQueryAttention: output ", i,
              " must be float32");
    }
    require(ctx.has_input(3) == ctx.has_input(4) && ctx.has_input(1) == ctx.has_input(2) &&
                ctx.has_input(6) == rotary_ && ctx.has_input(7) == rotary_,
            "GroupQueryAttention: key with value, past_key with past_value, cos/sin caches "
            "exactly when do_rotary");
    const Tensor& q = ctx.input(0);
    require(heads_ > 0 && kv_heads_ > 0 && heads_ % kv_heads_ == 0, "GroupQueryAttention: ",
            heads_, " heads over ", kv_heads_, " KV heads");
    out_ = &ctx.output(0);
    present_k_ = &ctx.output(1);
    present_v_ = &ctx.output(2);
    require(present_k_->rank() == 4 && present_k_->shape == present_v_->shape,
            "GroupQueryAttention: present ", show(present_k_->shape), " and ",
            show(present_v_->shape));
    batch_ = present_k_->dim(0);
    total_ = present_k_->dim(2);
    head_ = present_k_->dim(3);
    require(present_k_->dim(1) == kv_heads_ && q.rank() == 3 && q.dim(0) == batch_,
            "GroupQueryAttention: query ", show(q.shape), " for present ",
            show(present_k_->shape));
    seq_ = q.dim(1);
    const bool packed = !ctx.has_input(1);
    const int64_t q_width = heads_ * head_, kv_width = kv_heads_ * head_;
    q_ = q.f32();
    q_stride_ = packed ? q_width + 2 * kv_width : q_width;
    require(q.dim(2) == q_stride_, "GroupQueryAttention: query ", show(q.shape), " for ",
            heads_, " + ", packed ? 2 * kv_heads_ : 0, " heads of ", head_);
    if (packed) {
      k_ = q_ + q_width;
      v_ = k_ + kv_width;
      kv_stride_ = q_stride_;
    } else {
      require(ctx.has_input(2) && ctx.input(1).shape == std::vector<int64_t>{batch_, seq_, kv_width}
                  && ctx.input(2).shape == ctx.input(1).shape,
              "GroupQueryAttention: key and value must be [", batch_, ", ", seq_, ", ",
              kv_width, "]");
      k_ = ctx.input(1).f32();
      v_ = ctx.input(2).f32();
      kv_stride_ = kv_width;
    }
    require(out_->shape == std::vector<int64_t>{batch_, seq_, q_width},
            "GroupQueryAttention: output ", show(out_->shape));
    if (ctx.has_input(3)) {
      past_k_ = &ctx.input(3);
      past_v_ = &ctx.input(4);
      require(past_k_->rank() == 4 && past_k_->shape == past_v_->shape &&
                  past_k_->dim(0) == batch_ && past_k_->dim(1) == kv_heads_ &&
                  past_k_->dim(3) == head_ && past_k_->dim(2) <= total_,
              "GroupQueryAttention: past ", show(past_k_->shape), " for present ",
              show(present_k_->shape));
    }
    seqlens_ = &ctx.input(5);
    require(seqlens_->numel == batch_, "GroupQueryAttention: seqlens_k ", show(seqlens_->shape),
            " for batch ", batch_);
    if (rotary_) {
      const Tensor& cos = ctx.input(6);
      require(cos.rank() == 2 && cos.shape == ctx.input(7).shape && 2 * cos.dim(1) <= head_,
              "GroupQueryAttention: cos/sin caches ", show(cos.shape), " for heads of ", head_);
      cos_ = cos.f32();
      sin_ = ctx.input(7).f32();
      half_ = cos.dim(1);
      positions_ = cos.dim(0);
    }
    if (ctx.has_input(8)) {
      require(ctx.input(8).numel == heads_, "GroupQueryAttention: head_sink ",
              show(ctx.input(8).shape), " for ", heads_, " heads");
      sinks_ = ctx.input(8).f32();
    }
    if (sliding_) {
      require(window_ > 0 && past_k_ && past_k_->dim(2) == total_ && total_ == window_,
              "GroupQueryAttention: a sliding_window_cache needs past and present of ",
              "local_window_size rows, got window ", window_, ", present ",
              show(present_k_->shape));
      key_rows_ = total_ + seq_;
      keys_.assign(static_cast<size_t>(2 * batch_ * kv_heads_ * key_rows_ * head_), 0.0f);
    } else {
      key_rows_ = total_;
    }
    // With several query rows to a KV head (prefill, a chunk), its keys are transposed once
    // so that each row's scores run along the keys.
    if (seq_ * (heads_ / kv_heads_) >= kTransposeRows) {
      kt_.assign(static_cast<size_t>(batch_ * kv_heads_ * head_ * key_rows_), 0.0f);
    }
    const double scale = ctx.attr_f("scale", 0.0);
    scale_ = static_cast<float>(scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_)));
  }

  // A query head after rotary, the scores of one row, the weighted sum.
  int64_t workspace_floats() const override { return 2 * head_ + key_rows_; }

  void run(ThreadPool& pool, const Workspace& ws) override {
    past_lengths();
    const int64_t kv_rows = batch_ * kv_heads_;
    pool.for_range(kv_rows, 1, [&](int, int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) extend_cache(r / kv_heads_, r % kv_heads_);
    }, present_k_->nbytes * 2);
    const int64_t rows = batch_ * heads_ * seq_;
    pool.for_range(rows, pool.chunk_for(rows), [&](int tid, int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        attend(r / (heads_ * seq_), (r / seq_) % heads_, r % seq_, ws.get(tid));
      }
    }, rows * key_rows_ * head_ * 8);
    if (!sliding_) return;
    pool.for_range(kv_rows, 1, [&](int, int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) keep_latest(r / kv_heads_, r % kv_heads_);
    }, present_k_->nbytes * 2);
  }

 private:
  // Each batch's tokens before the new ones (its total, seqlens_k + 1, less the new tokens) and
  // the past rows it reads: all of them, which must fit the cache, or in a sliding window's
  // buffer the latest it holds.
  void past_lengths() {
    seen_.assign(static_cast<size_t>(batch_), 0);
    past_len_.assign(static_cast<size_t>(batch_), 0);
    lengths_.assign(static_cast<size_t>(batch_), 0);
    const int64_t cached = past_k_ ? past_k_->dim(2) : 0;
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t total = static_cast<int64_t>(seqlens_->as<int32_t>()[b]) + 1;
      const int64_t seen = std::max<int64_t>(total - seq_, 0);
      const int64_t past = sliding_ ? std::min(seen, cached) : seen;
      if (total < 1 || past > cached || (!sliding_ && past + seq_ > total_) ||
          (rotary_ && seen + seq_ > positions_)) {
        throw RunError(cat("GroupQueryAttention: seqlens_k[", b, "] = ", total - 1, " for ",
                           seq_, " new tokens, a cache of ", cached, ", present ", total_,
                           rotary_ ? ", positions " : "", rotary_ ? positions_ : 0));
      }
      seen_[static_cast<size_t>(b)] = seen;
      past_len_[static_cast<size_t>(b)] = past;
      lengths_[static_cast<size_t>(b)] = total - (seen - past);  // in rows of the keys
    }
  }

  // Where batch b's KV head kvh keeps its keys (values: `value` true) while the node runs:
  // the present itself, or with a sliding window a buffer of past + new rows apart.
  float* keys_of(int64_t b, int64_t kvh, bool value) const {
    const int64_t at = (b * kv_heads_ + kvh) * key_rows_ * head_;
    if (!sliding_) return (value ? present_v_ : present_k_)->f32() + at;
    return keys_.data() + (value ? batch_ * kv_heads_ * key_rows_ * head_ : 0) + at;
  }

  // Rotates a head of the token at `pos` (ONNX Runtime's rotary: halves, or interleaved pairs;
  // dims past the rotary ones copied).
  void rotate(const float* x, float* y, int64_t pos) const {
    std::memcpy(y, x, static_cast<size_t>(head_) * sizeof(float));
    if (!rotary_) return;
    const float* c = cos_ + pos * half_;
    const float* s = sin_ + pos * half_;
    for (int64_t i = 0; i < half_; ++i) {
      const int64_t a = interleaved_ ? 2 * i : i, b = interleaved_ ? 2 * i + 1 : i + half_;
      y[a] = x[a] * c[i] - x[b] * s[i];
      y[b] = x[b] * c[i] + x[a] * s[i];
    }
  }

  // keys[b, kvh] = past[b, kvh, :past] + the new keys (rotated) and values; rows past the
  // batch's total are zero.
  void extend_cache(int64_t b, int64_t kvh) const {
    const int64_t past = past_len_[static_cast<size_t>(b)];
    const int64_t seen = seen_[static_cast<size_t>(b)];
    const size_t row = static_cast<size_t>(head_) * sizeof(float);
    float* pk = keys_of(b, kvh, false);
    float* pv = keys_of(b, kvh, true);
    if (past > 0) {
      const int64_t from = (b * kv_heads_ + kvh) * past_k_->dim(2) * head_;
      std::memcpy(pk, past_k_->f32() + from, static_cast<size_t>(past) * row);
      std::memcpy(pv, past_v_->f32() + from, static_cast<size_t>(past) * row);
    }
    for (int64_t s = 0; s < seq_; ++s) {
      const int64_t at = (b * seq_ + s) * kv_stride_ + kvh * head_;
      rotate(k_ + at, pk + (past + s) * head_, seen + s);
      std::memcpy(pv + (past + s) * head_, v_ + at, row);
    }
    const int64_t rest = key_rows_ - past - seq_;
    std::memset(pk + (past + seq_) * head_, 0, static_cast<size_t>(rest) * row);
    std::memset(pv + (past + seq_) * head_, 0, static_cast<size_t>(rest) * row);
    if (kt_.empty()) return;
    float* kt = kt_.data() + (b * kv_heads_ + kvh) * head_ * key_rows_;
    for (int64_t j = 0; j < past + seq_; ++j) {
      for (int64_t d = 0; d < head_; ++d) kt[d * key_rows_ + j] = pk[j * head_ + d];
    }
  }

  // A sliding window's present: the buffer's last W rows (all of them when fewer), the rest
  // zero.
  void keep_latest(int64_t b, int64_t kvh) const {
    const int64_t rows = past_len_[static_cast<size_t>(b)] + seq_;
    const int64_t kept = std::min(rows, total_);
    const size_t row = static_cast<size_t>(head_) * sizeof(float);
    for (const bool value : {false, true}) {
      float* present = (value ? present_v_ : present_k_)->f32() +
                       (b * kv_heads_ + kvh) * total_ * head_;
      std::memcpy(present, keys_of(b, kvh, value) + (rows - kept) * head_,
                  static_cast<size_t>(kept) * row);
      std::memset(present + kept * head_, 0, static_cast<size_t>(total_ - kept) * row);
    }
  }

  // One query row: scores over the keys up to its own position (the last W with a window),
  // softmax (with the head's sink), the weighted values.
  void attend(int64_t b, int64_t h, int64_t s, float* buf) const {
    const int64_t past = past_len_[static_cast<size_t>(b)], kvh = h / (heads_ / kv_heads_);
    // Causal, and never past the batch's own length: a right-padded prompt's pad rows attend to
    // its tokens only, as ONNX Runtime's do.
    const int64_t end = std::min(past + s + 1, lengths_[static_cast<size_t>(b)]);
    const int64_t first = window_ > 0 ? std::max<int64_t>(end - window_, 0) : 0;
    const int64_t keys = end - first;
    float* q = buf;
    float* acc = buf + head_;
    float* scores = buf + 2 * head_;
    rotate(q_ + (b * seq_ + s) * q_stride_ + h * head_, q, seen_[static_cast<size_t>(b)] + s);
    const float* pk = keys_of(b, kvh, false) + first * head_;
    const float* pv = keys_of(b, kvh, true) + first * head_;
    // With a softcap c: c · tanh(score / c), the 1 / c folded into the scale.
    const float scale = softcap_ > 0.0f ? scale_ / softcap_ : scale_;
    if (kt_.empty()) {
      scores_(q, pk, keys, head_, scale, scores);
    } else {
      transposed_(q, kt_.data() + (b * kv_heads_ + kvh) * head_ * key_rows_ + first,
                  key_rows_, keys, head_, scale, scores);
    }
    if (softcap_ > 0.0f) {
      simd_.unary(EwOp::Tanh, scores, Src{scores, 1}, keys, 0.0f, 0.0f);
      for (int64_t j = 0; j < keys; ++j) scores[j] *= softcap_;
    }
    const bool sink = sinks_ != nullptr || smooth_;
    const float sink_logit = sinks_ ? sinks_[h] : 0.0f;
    const float m = sink ? std::max(simd_.max(scores, keys), sink_logit)
                         : simd_.max(scores, keys);
    const float sum = simd_.exp_shift_sum(scores, scores, m, keys);
    const float inv = 1.0f / (sink ? sum + std::exp(sink_logit - m) : sum);
    values_(scores, pv, keys, head_, inv, acc);
    std::memcpy(out_->f32() + (b * seq_ + s) * heads_ * head_ + h * head_, acc,
                static_cast<size_t>(head_) * sizeof(float));
  }

  const SimdKernels& simd_;
  ProductFn scores_;  // the products' builds for the table's instruction set
  TransposedFn transposed_;
  ProductFn values_;
  int64_t heads_, kv_heads_;
  bool rotary_, interleaved_;
  float softcap_;
  int64_t window_;       // local_window_size; <= 0: none
  bool sliding_, smooth_;  // sliding_window_cache; smooth_softmax (a sink of 0 per head)
  float scale_ = 1.0f;
  int64_t batch_ = 0, seq_ = 0, total_ = 0, head_ = 0, q_stride_ = 0, kv_stride_ = 0;
  int64_t key_rows_ = 0;  // rows of keys a KV head attends over: present's, or past + new
  int64_t half_ = 0, positions_ = 0;
  const float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;  // the new tokens' Q, K, V
  const float *cos_ = nullptr, *sin_ = nullptr;  // the rotary caches
  const float* sinks_ = nullptr;                  // head_sink, or null
  const Tensor* past_k_ = nullptr;
  const Tensor* past_v_ = nullptr;
  const Tensor* seqlens_ = nullptr;
  const Tensor* out_ = nullptr;
  const Tensor* present_k_ = nullptr;
  const Tensor* present_v_ = nullptr;
  // Per batch: tokens before the new ones, past rows read, and the rows of keys its queries
  // may attend (seqlens_k + 1 less the tokens a sliding window's buffer has dropped).
  std::vector<int64_t> seen_, past_len_, lengths_;
  // A sliding window's keys and values, past + new rows a KV head (written by run through
  // its const helpers, as the outputs are).
  mutable std::vector<float> keys_;
  // Per batch and KV head its keys transposed, [head, key rows] (empty: not worth it).
  mutable std::vector<float> kt_;
};

}  // namespace

void register_attention(KernelRegistry& r) {
  add_kernel(r, "GroupQueryAttention", make_kernel<GroupQueryAttentionKernel>());
}

}  // namespace onnxlens
