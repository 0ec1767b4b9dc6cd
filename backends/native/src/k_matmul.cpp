// MatMul (numpy semantics: batched, broadcast, 1-D operands) and Gemm (2-D, transposes; alpha,
// beta and C are folded into the epilogue by the planner). A constant B (the weights of a
// linear layer) is packed once.
#include <algorithm>

#include "gemm.h"
#include "kernel.h"

namespace onnxlens {

namespace {

struct Operand2d {
  int64_t rs, cs;                    // element (i, j) of one matrix
  std::vector<int64_t> batch_strides;  // per output batch dim, 0 where broadcast
  int64_t matrix;                    // elements per matrix
};

class MatMulKernel : public Kernel {
 public:
  MatMulKernel(const KernelContext& ctx, bool gemm) : simd_(ctx.simd), y_(ctx.output(0)) {
    ctx.expect_arity(2, 2, 1);
    ctx.expect_f32_io();
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    a_ = a.f32();
    b_ = b.f32();
    if (gemm) {
      setup_gemm(ctx, a, b);
    } else {
      setup_matmul(a, b);
    }
    epilogue_ = EwProgram(ctx, y_.shape);
    const int64_t m_rows = M_;
    fold_batch();
    if (y_.rank() >= 2 && K_ > 0 && a.rank() >= 2 && b.rank() >= 2) {
      fast_ = epilogue_.fast(y_.rank() - 2, m_rows, y_.dim(y_.rank() - 1) == N_);
      // Per-row values index rows of one matrix: only without batches.
      if (!fast_.row_scale.empty() && (a_off_.size() > 1 || M_ != m_rows)) fast_.ok = false;
    }
    a_once_ = gemm_a_once_floats(simd_, M_, K_, N_, am_.rs, am_.cs);
    if (b.storage == Storage::constant) {
      for (int64_t off : distinct_b_offsets()) {
        packed_.emplace_back(off, pack_b_const(simd_, b_ + off, bm_.rs, bm_.cs, K_, N_));
      }
    }
  }

  int64_t workspace_floats() const override {
    return gemm_workspace_floats(simd_, &epilogue_, a_once_);
  }

  void run(ThreadPool& pool, const Workspace& ws) override {
    const int64_t items = static_cast<int64_t>(a_off_.size());
    const int64_t work = items * M_ * N_ * std::max<int64_t>(K_, 1);
    if (items >= pool.size()) {  // whole products per chunk
      pool.for_range(items, pool.chunk_for(items),
                   [&](int tid, int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          product(item, {0, M_}, {0, N_}, ws.get(tid));
        }
      }, work);
      return;
    }
    // One product (or fewer than the threads): its rows or columns, one chunk a thread, as
    // each chunk packs all of the operand it does not split (B's prepacked panels start at
    // multiples of nr, A's at multiples of mr).
    const bool by_rows = M_ >= N_ || N_ < int64_t{2} * simd_.nr * pool.size();
    const int64_t total = by_rows ? M_ : N_;
    const int64_t chunk = pool.chunk_for(total, by_rows ? simd_.mr : simd_.nr, 1);
    for (int64_t item = 0; item < items; ++item) {
      pool.for_range(total, chunk, [&](int tid, int64_t begin, int64_t end) {
        product(item, by_rows ? Range{begin, end} : Range{0, M_},
                by_rows ? Range{0, N_} : Range{begin, end}, ws.get(tid));
      }, work);
    }
  }

 private:
  void setup_gemm(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
    require(a.rank() == 2 && b.rank() == 2 && y_.rank() == 2, "Gemm: operands must be 2-D");
    const bool ta = ctx.attr("transA", 0) != 0, tb = ctx.attr("transB", 0) != 0;
    M_ = ta ? a.dim(1) : a.dim(0);
    K_ = ta ? a.dim(0) : a.dim(1);
    N_ = tb ? b.dim(0) : b.dim(1);
    require((tb ? b.dim(1) : b.dim(0)) == K_, "Gemm: inner dims differ: ", show(a.shape), " ",
            show(b.shape));
    am_ = {ta ? 1 : K_, ta ? M_ : 1, {}, a.numel};
    bm_ = {tb ? 1 : N_, tb ? K_ : 1, {}, b.numel};
    require(y_.shape == std::vector<int64_t>{M_, N_}, "Gemm: output ", show(y_.shape));
    a_off_ = {0};
    b_off_ = {0};
  }

  void setup_matmul(const Tensor& a, const Tensor& b) {
    require(a.rank() >= 1 && b.rank() >= 1, "MatMul: scalar operand");
    std::vector<int64_t> as = a.shape, bs = b.shape;
    const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
    if (a_vec) as.insert(as.begin(), 1);
    if (b_vec) bs.push_back(1);
    M_ = as[as.size() - 2];
    K_ = as.back();
    N_ = bs.back();
    require(bs[bs.size() - 2] == K_, "MatMul: inner dims differ: ", show(a.shape), " ",
            show(b.shape));
    const size_t rank = std::max(as.size(), bs.size()) - 2;
    std::vector<int64_t> batch(rank, 1);
    am_ = {K_, 1, broadcast(as, rank, batch), M_ * K_};
    bm_ = {N_, 1, broadcast(bs, rank, batch), K_ * N_};
    std::vector<int64_t> expect = batch;
    if (!a_vec) expect.push_back(M_);
    if (!b_vec) expect.push_back(N_);
    require(y_.shape == expect, "MatMul: output ", show(y_.shape), ", expected ", show(expect));
    batch_ = batch;
    const int64_t items = checked_product(batch);
    for (int64_t item = 0; item < items; ++item) {
      int64_t rest = item, ao = 0, bo = 0;
      for (size_t d = rank; d-- > 0;) {
        const int64_t at = rest % batch[d];
        rest /= batch[d];
        ao += at * am_.batch_strides[d];
        bo += at * bm_.batch_strides[d];
      }
      a_off_.push_back(ao);
      b_off_.push_back(bo);
    }
  }

  // Batch strides of an operand (matrix dims last) against the output batch, which it widens.
  std::vector<int64_t> broadcast(const std::vector<int64_t>& shape, size_t rank,
                                 std::vector<int64_t>& batch) {
    const size_t own = shape.size() - 2, lead = rank - own;
    std::vector<int64_t> strides(rank, 0);
    int64_t stride = checked_mul(shape[own], shape[own + 1]);
    for (size_t d = own; d-- > 0;) {
      const int64_t n = shape[d];
      int64_t& out = batch[lead + d];
      require(n == out || n == 1 || out == 1, "MatMul: batch dims do not broadcast");
      if (n != 1) out = n;
      strides[lead + d] = n == 1 ? 0 : stride;
      stride = checked_mul(stride, n);
    }
    return strides;
  }

  // One B for all items and A's items contiguous: one product with the batch in M.
  void fold_batch() {
    const auto items = static_cast<int64_t>(a_off_.size());
    if (items <= 1) return;
    for (int64_t i = 0; i < items; ++i) {
      if (b_off_[i] != 0 || a_off_[i] != i * M_ * K_) return;
    }
    M_ *= items;
    a_off_ = {0};
    b_off_ = {0};
  }

  std::vector<int64_t> distinct_b_offsets() const {
    std::vector<int64_t> offs = b_off_;
    std::sort(offs.begin(), offs.end());
    offs.erase(std::unique(offs.begin(), offs.end()), offs.end());
    return offs;
  }

  void product(int64_t item, Range rows, Range cols, float* ws) const {
    GemmA a;
    a.p = a_ + a_off_[item];
    a.rs = am_.rs;
    a.cs = am_.cs;
    a.pack_once = a_once_ > 0;
    GemmB b;
    for (const auto& [off, p] : packed_) {
      if (off == b_off_[item]) b.packed = &p;
    }
    b.p = b_ + b_off_[item];
    b.rs = bm_.rs;
    b.cs = bm_.cs;
    b.in_place = M_ == 1;  // a row of A against B read once: packing B would read it twice
    GemmC c;
    c.p = y_.f32() + item * M_ * N_;
    c.ldc = N_;
    c.epilogue = &epilogue_;
    c.out_base = y_.f32();
    c.fast = fast_.ok ? &fast_ : nullptr;
    gemm(simd_, M_, N_, K_, a, b, c, rows.begin, rows.end, cols.begin, cols.end, ws);
  }

  const SimdKernels& simd_;
  const Tensor& y_;
  const float* a_ = nullptr;
  const float* b_ = nullptr;
  int64_t M_ = 0, N_ = 0, K_ = 0;
  int64_t a_once_ = 0;  // workspace floats of A packed once (gemm.h GemmA::pack_once)
  Operand2d am_{}, bm_{};
  std::vector<int64_t> batch_, a_off_, b_off_;
  std::vector<std::pair<int64_t, PackedOperand>> packed_;
  EwProgram epilogue_;
  FastEpilogue fast_;
};

}  // namespace

void register_matmul(KernelRegistry& r) {
  add_kernel(r, "MatMul", make_kernel<MatMulKernel>(false));
  add_kernel(r, "Gemm", make_kernel<MatMulKernel>(true));
}

}  // namespace onnxlens
