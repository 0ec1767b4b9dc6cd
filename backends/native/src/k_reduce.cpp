// Reductions over a set of axes (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
// ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp), ArgMax / ArgMin and the
// running sum along one axis (CumSum).
// The planner gives the axes sorted and non-negative. Axes that form one block run as
// [outer, len, inner] rows; any other set runs through an odometer.
#include <algorithm>
#include <cmath>

#include "kernel.h"
#include "wrapping.h"

namespace onnxlens {

namespace {

enum class Red {
#define REDUCE_OP(name, red) red,
#include "ops.def"
};

Red parse(const std::string& op) {
  static const std::map<std::string, Red> names = {
#define REDUCE_OP(name, red) {#name, Red::red},
#include "ops.def"
  };
  return names.at(op);
}

float init(Red r) {
  switch (r) {
    case Red::Max: return -INFINITY;
    case Red::Min: return INFINITY;
    case Red::Prod: return 1.0f;
    default: return 0.0f;
  }
}

float step(Red r, float acc, float x) {
  switch (r) {
    case Red::Max: return std::fmax(acc, x);
    case Red::Min: return std::fmin(acc, x);
    case Red::Prod: return acc * x;
    case Red::SumSquare: case Red::L2: return acc + x * x;
    case Red::L1: return acc + std::fabs(x);
    case Red::LogSumExp: return acc + std::exp(x);
    default: return acc + x;
  }
}

float finish(Red r, float acc, int64_t n) {
  switch (r) {
    case Red::Mean: return acc / static_cast<float>(n);
    case Red::L2: return std::sqrt(acc);
    case Red::LogSum: case Red::LogSumExp: return std::log(acc);
    default: return acc;
  }
}

// The input seen as [kept..., reduced...] with strides, for the odometer.
struct ReduceLayout {
  std::vector<int64_t> kept_dims, kept_strides, red_dims, red_strides;
  int64_t outer = 1, len = 1, inner = 1;
  bool block = true;  // reduced axes are consecutive: [outer, len, inner]
};

ReduceLayout layout(const Tensor& x, const std::vector<int64_t>& axes) {
  ReduceLayout l;
  std::vector<bool> red(static_cast<size_t>(x.rank()), false);
  for (int64_t a : axes) {
    require(a >= 0 && a < x.rank(), "reduce axis ", a, " out of range for ", show(x.shape));
    red[static_cast<size_t>(a)] = true;
  }
  int64_t stride = 1;
  std::vector<int64_t> strides(static_cast<size_t>(x.rank()));
  for (int d = x.rank(); d-- > 0;) {
    strides[d] = stride;
    stride *= x.dim(d);
  }
  int first = -1, last = -1;
  for (int d = 0; d < x.rank(); ++d) {
    (red[d] ? l.red_dims : l.kept_dims).push_back(x.dim(d));
    (red[d] ? l.red_strides : l.kept_strides).push_back(strides[d]);
    if (red[d]) {
      if (first < 0) first = d;
      l.block = l.block && (last < 0 || last == d - 1);
      last = d;
    }
  }
  for (int d = 0; d < x.rank(); ++d) {
    (d < first ? l.outer : (red[d] ? l.len : l.inner)) *= x.dim(d);
  }
  if (first < 0) l.outer = x.numel;
  return l;
}

class ReduceKernel : public XyKernel {
 public:
  explicit ReduceKernel(const KernelContext& ctx)
      : XyKernel(ctx, 1, 1), op_(parse(ctx.spec.op)) {
    l_ = layout(x_, ctx.ints("axes"));
    require(y_.numel == checked_product(l_.kept_dims), ctx.spec.op, ": output ",
            show(y_.shape), " for input ", show(x_.shape));
    count_ = checked_product(l_.red_dims);
  }

  void run(ThreadPool& pool, const Workspace&) override {
    pool.for_range(y_.numel, pool.chunk_for(y_.numel),
                   [&](int, int64_t begin, int64_t end) {
      const Range r{begin, end};
      for (int64_t o = r.begin; o < r.end; ++o) y_.f32()[o] = one(o);
    }, x_.numel);
  }

 private:
  float one(int64_t o) const {
    const float* x = x_.f32();
    if (l_.block && l_.inner == 1 && (op_ == Red::Sum || op_ == Red::Mean)) {
      return finish(op_, simd_.sum(x + o * l_.len, l_.len), count_);
    }
    int64_t base = 0, rest = o;
    for (size_t d = l_.kept_dims.size(); d-- > 0;) {
      base += (rest % l_.kept_dims[d]) * l_.kept_strides[d];
      rest /= l_.kept_dims[d];
    }
    float acc = init(op_);
    float shift = 0.0f;
    if (op_ == Red::LogSumExp) {  // subtract the max first: no overflow
      shift = -INFINITY;
      visit(base, [&](float v) { shift = std::fmax(shift, v); });
      if (!std::isfinite(shift)) shift = 0.0f;
    }
    visit(base, [&](float v) { acc = step(op_, acc, v - shift); });
    return op_ == Red::LogSumExp ? finish(op_, acc, count_) + shift : finish(op_, acc, count_);
  }

  template <typename F>
  void visit(int64_t base, F f) const {
    const float* x = x_.f32();
    const size_t nd = l_.red_dims.size();
    std::vector<int64_t> at(nd, 0);
    for (int64_t k = 0; k < count_; ++k) {
      int64_t off = base;
      for (size_t d = 0; d < nd; ++d) off += at[d] * l_.red_strides[d];
      f(x[off]);
      for (size_t d = nd; d-- > 0;) {
        if (++at[d] < l_.red_dims[d]) break;
        at[d] = 0;
      }
    }
  }

  Red op_;
  ReduceLayout l_;
  int64_t count_ = 1;
};

class ArgKernel : public Kernel {
 public:
  ArgKernel(const KernelContext& ctx, bool max)
      : x_(ctx.input(0)), y_(ctx.output(0)), max_(max) {
    ctx.expect_arity(1, 1, 1);
    require(x_.dtype == DType::f32 && y_.dtype == DType::i64, ctx.spec.op,
            ": float32 in, int64 out");
    int64_t axis = ctx.attr("axis", 0);
    if (axis < 0) axis += x_.rank();
    l_ = layout(x_, {axis});
    require(y_.numel == l_.outer * l_.inner, ctx.spec.op, ": output ", show(y_.shape));
    last_ = ctx.attr("select_last_index", 0) != 0;
  }

  void run(ThreadPool& pool, const Workspace&) override {
    pool.for_range(y_.numel, pool.chunk_for(y_.numel),
                   [&](int, int64_t begin, int64_t end) {
      const Range r{begin, end};
      for (int64_t o = r.begin; o < r.end; ++o) {
        const float* x = x_.f32() + (o / l_.inner) * l_.len * l_.inner + o % l_.inner;
        int64_t best = 0;
        for (int64_t k = 1; k < l_.len; ++k) {
          const float v = x[k * l_.inner], b = x[best * l_.inner];
          const bool better = max_ ? (v > b || (last_ && v == b)) : (v < b || (last_ && v == b));
          if (better) best = k;
        }
        y_.as<int64_t>()[o] = best;
      }
    }, x_.numel);
  }

 private:
  const Tensor& x_;
  const Tensor& y_;
  bool max_;
  bool last_ = false;
  ReduceLayout l_;
};

// The running sum of one [len, inner] block along len, one row of `inner` at a time (each
// column summed in order, first to last: the order of numpy's cumsum, to the bit; integers
// wrap around as numpy's do). `exclusive`: row k holds the sum of the rows before it (row 0:
// zeros); `reverse`: sums from the last row.
template <typename T>
void scan_block(const T* x, T* y, int64_t len, int64_t inner, bool exclusive, bool reverse) {
  for (int64_t k = 0; k < len; ++k) {
    const int64_t row = reverse ? len - 1 - k : k, prev = reverse ? row + 1 : row - 1;
    T* out = y + row * inner;
    if (k == 0) {
      for (int64_t i = 0; i < inner; ++i) out[i] = exclusive ? T{0} : x[row * inner + i];
      continue;
    }
    const T* before = y + prev * inner;
    const T* add = x + (exclusive ? prev : row) * inner;
    for (int64_t i = 0; i < inner; ++i) out[i] = wrapping(Arith::Add, before[i], add[i]);
  }
}

// CumSum of float32, int32 or int64 along `axis` (the planner resolves ONNX's axis input).
class CumSumKernel : public Kernel {
 public:
  explicit CumSumKernel(const KernelContext& ctx) : x_(ctx.input(0)), y_(ctx.output(0)) {
    ctx.expect_arity(1, 1, 1);
    require(x_.dtype == y_.dtype && x_.shape == y_.shape, "CumSum: output ", show(y_.shape),
            " ", dtype_name(y_.dtype), " for input ", show(x_.shape), " ", dtype_name(x_.dtype));
    require(x_.dtype == DType::f32 || x_.dtype == DType::i32 || x_.dtype == DType::i64,
            "CumSum: ", dtype_name(x_.dtype), " (only float32, int32, int64)");
    const int64_t axis = ctx.attr("axis", 0);
    require(axis >= 0 && axis < x_.rank(), "CumSum: axis ", axis, " out of range for ",
            show(x_.shape));
    l_ = layout(x_, {axis});
    exclusive_ = ctx.attr("exclusive", 0) != 0;
    reverse_ = ctx.attr("reverse", 0) != 0;
  }

  void run(ThreadPool& pool, const Workspace&) override {
    switch (x_.dtype) {
      case DType::i32: return scan<int32_t>(pool);
      case DType::i64: return scan<int64_t>(pool);
      default: return scan<float>(pool);
    }
  }

 private:
  template <typename T>
  void scan(ThreadPool& pool) {
    const int64_t block = l_.len * l_.inner;
    pool.for_range(l_.outer, pool.chunk_for(l_.outer), [&](int, int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        scan_block(x_.as<const T>() + o * block, y_.as<T>() + o * block, l_.len, l_.inner,
                   exclusive_, reverse_);
      }
    }, x_.numel);
  }

  const Tensor& x_;
  const Tensor& y_;
  ReduceLayout l_;
  bool exclusive_ = false, reverse_ = false;
};

}  // namespace

void register_reduce(KernelRegistry& r) {
#define REDUCE_OP(name, red) add_kernel(r, #name, make_kernel<ReduceKernel>());
#include "ops.def"
  add_kernel(r, "ArgMax", make_kernel<ArgKernel>(true));
  add_kernel(r, "ArgMin", make_kernel<ArgKernel>(false));
  add_kernel(r, "CumSum", make_kernel<CumSumKernel>());
}

}  // namespace onnxlens
