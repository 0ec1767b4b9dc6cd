// Elementwise kernels (an EwProgram over the output, float32), and the small ops of other
// element types: Cast, Where, comparisons, logical ops, integer Add / Sub / Mul. The last
// broadcast with numpy rules through an odometer: they are rare and small (masks, position
// ids). Where and the comparisons of float32, int64 and bool run typed loops over runs of
// elements instead (for_each_run): torch's SDPA guards every layer's probabilities with
// Where(IsNaN(p), 0, p), [heads, S, S] each, and DeBERTa masks its scores with a [1, 1, S, S]
// mask, on the hot path of HF exports (the per-element odometer took ~5 ns an element).
#include <cstring>
#include <type_traits>

#include "ewprog.h"
#include "kernel.h"
#include "wrapping.h"

namespace onnxlens {

namespace {

class ElementwiseKernel : public Kernel {
 public:
  explicit ElementwiseKernel(const KernelContext& ctx)
      : simd_(ctx.simd), y_(ctx.output(0)), program_(ctx, ctx.output(0).shape) {
    require(ctx.inputs() == 0 && ctx.spec.outputs.size() == 1,
            "Elementwise: operands only, one output");
    require(y_.dtype == DType::f32, "Elementwise: output must be float32");
    require(!program_.empty(), "Elementwise: empty program");
  }

  int64_t workspace_floats() const override { return program_.scratch_floats(); }

  void run(ThreadPool& pool, const Workspace& ws) override {
    pool.for_range(y_.numel, pool.chunk_for(y_.numel, 64),
                   [&](int tid, int64_t begin, int64_t end) {
                     program_.apply(simd_, y_.f32() + begin, begin, end - begin, ws.get(tid));
                   }, y_.numel * 4);
  }

 private:
  const SimdKernels& simd_;
  const Tensor& y_;
  EwProgram program_;
};

// Broadcast strides of each input against the output (numpy rules).
std::vector<std::vector<int64_t>> broadcast_all(const KernelContext& ctx, const Tensor& y) {
  std::vector<std::vector<int64_t>> all;
  for (int i = 0; i < ctx.inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    require(t.rank() <= y.rank(), ctx.spec.op, ": input ", show(t.shape), " vs ",
            show(y.shape));
    std::vector<int64_t> s(static_cast<size_t>(y.rank()), 0);
    int64_t stride = 1;
    for (int d = t.rank(); d-- > 0;) {
      const int yd = d + y.rank() - t.rank();
      require(t.dim(d) == y.dim(yd) || t.dim(d) == 1, ctx.spec.op, ": ", show(t.shape),
              " does not broadcast to ", show(y.shape));
      s[static_cast<size_t>(yd)] = t.dim(d) == 1 ? 0 : stride;
      stride *= t.dim(d);
    }
    all.push_back(std::move(s));
  }
  return all;
}

// Each input's step through the output's elements when none broadcasts partially: 1 for an
// input of the output's size (the same order: broadcasting only adds dims of size 1), 0 for a
// single element; empty when some input broadcasts along some dims only.
std::vector<int64_t> flat_steps(const KernelContext& ctx, const Tensor& y) {
  std::vector<int64_t> steps;
  for (int i = 0; i < ctx.inputs(); ++i) {
    const int64_t n = ctx.input(i).numel;
    if (n != y.numel && n != 1) return {};
    steps.push_back(n == y.numel ? 1 : 0);
  }
  return steps;
}

// Calls f(out_index, in_index...) for every output element.
template <typename F>
void for_each(const Tensor& y, const std::vector<std::vector<int64_t>>& strides, F f) {
  std::vector<int64_t> at(static_cast<size_t>(y.rank()), 0), idx(strides.size(), 0);
  for (int64_t o = 0; o < y.numel; ++o) {
    f(o, idx);
    for (int d = y.rank(); d-- > 0;) {
      for (size_t i = 0; i < idx.size(); ++i) idx[i] += strides[i][d];
      if (++at[d] < y.dim(d)) break;
      for (size_t i = 0; i < idx.size(); ++i) idx[i] -= strides[i][d] * y.dim(d);
      at[d] = 0;
    }
  }
}

// Calls f(out_index, in_index..., n, steps) for runs of n output elements along which input i
// steps by steps[i] (0 or 1): the whole output at once when `flat` (flat_steps) has them, else
// each row of the last dim, its start found by the odometer over the outer dims (a mask
// [1, 1, S, S] broadcast over heads: one odometer step a row, not an element).
template <typename F>
void for_each_run(const Tensor& y, const std::vector<std::vector<int64_t>>& strides,
                  const std::vector<int64_t>& flat, F f) {
  if (!flat.empty()) {
    f(int64_t{0}, std::vector<int64_t>(flat.size(), 0), y.numel, flat);
    return;
  }
  const int last = y.rank() - 1;  // >= 0: a 0-d output has flat steps
  const int64_t n = y.dim(last);
  std::vector<int64_t> at(static_cast<size_t>(y.rank()), 0), idx(strides.size(), 0),
      steps(strides.size());
  for (size_t i = 0; i < steps.size(); ++i) steps[i] = strides[i][static_cast<size_t>(last)];
  for (int64_t o = 0; o < y.numel; o += n) {
    f(o, idx, n, steps);
    for (int d = last; d-- > 0;) {
      for (size_t i = 0; i < idx.size(); ++i) idx[i] += strides[i][d];
      if (++at[d] < y.dim(d)) break;
      for (size_t i = 0; i < idx.size(); ++i) idx[i] -= strides[i][d] * y.dim(d);
      at[d] = 0;
    }
  }
}

double load(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::f32: return t.as<float>()[i];
    case DType::f64: return t.as<double>()[i];
    case DType::i64: return static_cast<double>(t.as<int64_t>()[i]);
    case DType::i32: return t.as<int32_t>()[i];
    case DType::i16: return t.as<int16_t>()[i];
    case DType::i8: return t.as<int8_t>()[i];
    case DType::u8: case DType::boolean: return t.as<uint8_t>()[i];
    case DType::u16: return t.as<uint16_t>()[i];
    case DType::u32: return t.as<uint32_t>()[i];
    default: return 0.0;
  }
}

void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::f32: t.as<float>()[i] = static_cast<float>(v); break;
    case DType::f64: t.as<double>()[i] = v; break;
    case DType::i64: t.as<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::i32: t.as<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::i16: t.as<int16_t>()[i] = static_cast<int16_t>(v); break;
    case DType::i8: t.as<int8_t>()[i] = static_cast<int8_t>(v); break;
    case DType::u8: t.as<uint8_t>()[i] = static_cast<uint8_t>(v); break;
    case DType::boolean: t.as<uint8_t>()[i] = v != 0.0; break;
    case DType::u16: t.as<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DType::u32: t.as<uint32_t>()[i] = static_cast<uint32_t>(v); break;
    default: break;
  }
}

bool exact_type(DType t) { return t != DType::f16 && t != DType::u64; }

// Cast between numeric types; int64 <-> int64 and same-size copies stay exact.
class CastKernel : public Kernel {
 public:
  explicit CastKernel(const KernelContext& ctx) : x_(ctx.input(0)), y_(ctx.output(0)) {
    ctx.expect_arity(1, 1, 1);
    require(x_.shape == y_.shape, "Cast: shapes differ");
    require(exact_type(x_.dtype) && exact_type(y_.dtype), "Cast: ", dtype_name(x_.dtype),
            " to ", dtype_name(y_.dtype), " is not supported");
  }

  void run(ThreadPool&, const Workspace&) override {
    if (x_.dtype == y_.dtype) {
      std::memcpy(y_.data, x_.data, static_cast<size_t>(x_.nbytes));
    } else if (x_.dtype == DType::i64 && y_.dtype != DType::f32 && y_.dtype != DType::f64) {
      for (int64_t i = 0; i < x_.numel; ++i) {  // integer to integer: no trip through double
        const int64_t v = x_.as<int64_t>()[i];
        store(y_, i, y_.dtype == DType::boolean ? (v != 0) : static_cast<double>(v));
      }
    } else {
      for (int64_t i = 0; i < x_.numel; ++i) store(y_, i, load(x_, i));
    }
  }

 private:
  const Tensor& x_;
  const Tensor& y_;
};

class WhereKernel : public Kernel {
 public:
  explicit WhereKernel(const KernelContext& ctx) : y_(ctx.output(0)) {
    ctx.expect_arity(3, 3, 1);
    c_ = &ctx.input(0);
    a_ = &ctx.input(1);
    b_ = &ctx.input(2);
    require(c_->dtype == DType::boolean && a_->dtype == y_.dtype && b_->dtype == y_.dtype,
            "Where: bool condition and matching value types");
    size_ = dtype_size(static_cast<int>(y_.dtype));
    require(size_ == 1 || size_ == 2 || size_ == 4 || size_ == 8,
            "Where: values of 1, 2, 4 or 8 bytes");
    strides_ = broadcast_all(ctx, y_);
    steps_ = flat_steps(ctx, y_);
  }

  void run(ThreadPool&, const Workspace&) override {
    with_width(size_, [&](auto bits) { run_typed<decltype(bits)>(); });
  }

 private:
  template <typename T>
  void run_typed() {
    for_each_run(y_, strides_, steps_, [&](int64_t o, const std::vector<int64_t>& i, int64_t n,
                                           const std::vector<int64_t>& s) {
      const uint8_t* c = c_->as<const uint8_t>() + i[0];
      const T* a = a_->as<const T>() + i[1];
      const T* b = b_->as<const T>() + i[2];
      T* y = y_.as<T>() + o;
      const int64_t sc = s[0], sa = s[1], sb = s[2];
      for (int64_t j = 0; j < n; ++j) y[j] = c[j * sc] ? a[j * sa] : b[j * sb];
    });
  }

  const Tensor& y_;
  const Tensor* c_;
  const Tensor* a_;
  const Tensor* b_;
  std::vector<std::vector<int64_t>> strides_;
  std::vector<int64_t> steps_;
  int64_t size_ = 1;
};

enum class Cmp { Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor, Not, IsNaN };

template <Cmp op, typename T>
bool compare(T a, T b) {
  if constexpr (op == Cmp::Equal) return a == b;
  if constexpr (op == Cmp::Less) return a < b;
  if constexpr (op == Cmp::Greater) return a > b;
  if constexpr (op == Cmp::LessOrEqual) return a <= b;
  if constexpr (op == Cmp::GreaterOrEqual) return a >= b;
  if constexpr (op == Cmp::And) return a != 0 && b != 0;
  if constexpr (op == Cmp::Or) return a != 0 || b != 0;
  if constexpr (op == Cmp::Xor) return (a != 0) != (b != 0);
  if constexpr (op == Cmp::Not) return a == 0;
  if constexpr (op == Cmp::IsNaN) return a != a;  // NaN is the one value unequal to itself
  return false;
}

// Calls f(std::integral_constant<Cmp, op>) for the run-time `op`: each loop then compiles for
// one comparison and vectorizes (IsNaN of [4, 197, 197]: 134 -> 20 us; with the comparison
// chosen per element, reading op_ again after every bool store, it did not).
template <typename F>
void with_cmp(Cmp op, F f) {
  switch (op) {
    case Cmp::Equal: return f(std::integral_constant<Cmp, Cmp::Equal>{});
    case Cmp::Less: return f(std::integral_constant<Cmp, Cmp::Less>{});
    case Cmp::Greater: return f(std::integral_constant<Cmp, Cmp::Greater>{});
    case Cmp::LessOrEqual: return f(std::integral_constant<Cmp, Cmp::LessOrEqual>{});
    case Cmp::GreaterOrEqual: return f(std::integral_constant<Cmp, Cmp::GreaterOrEqual>{});
    case Cmp::And: return f(std::integral_constant<Cmp, Cmp::And>{});
    case Cmp::Or: return f(std::integral_constant<Cmp, Cmp::Or>{});
    case Cmp::Xor: return f(std::integral_constant<Cmp, Cmp::Xor>{});
    case Cmp::Not: return f(std::integral_constant<Cmp, Cmp::Not>{});
    case Cmp::IsNaN: return f(std::integral_constant<Cmp, Cmp::IsNaN>{});
  }
}

class CompareKernel : public Kernel {
 public:
  CompareKernel(const KernelContext& ctx, Cmp op) : y_(ctx.output(0)), op_(op) {
    const int arity = op == Cmp::Not || op == Cmp::IsNaN ? 1 : 2;
    ctx.expect_arity(arity, arity, 1);
    require(y_.dtype == DType::boolean, ctx.spec.op, ": output must be bool");
    for (int i = 0; i < arity; ++i) {
      in_.push_back(&ctx.input(i));
      require(exact_type(in_.back()->dtype) && in_.back()->dtype == ctx.input(0).dtype,
              ctx.spec.op, ": operand types");
    }
    strides_ = broadcast_all(ctx, y_);
    steps_ = flat_steps(ctx, y_);
  }

  void run(ThreadPool&, const Workspace&) override {
    switch (in_[0]->dtype) {
      case DType::f32: return run_typed<float>();
      case DType::i64: return run_typed<int64_t>();
      case DType::boolean: return run_typed<uint8_t>();
      default: break;  // the other types through double, exact for each of them
    }
    with_cmp(op_, [&](auto op) {
      for_each(y_, strides_, [&](int64_t o, const std::vector<int64_t>& i) {
        y_.as<uint8_t>()[o] = compare<decltype(op)::value>(
            load(*in_[0], i[0]), in_.size() == 2 ? load(*in_[1], i[1]) : 0.0);
      });
    });
  }

 private:
  // A unary op reads its one input as both operands (step 0 for the second, ignored).
  template <typename T>
  void run_typed() {
    const bool unary = in_.size() == 1;
    with_cmp(op_, [&](auto op) {
      for_each_run(y_, strides_, steps_, [&](int64_t o, const std::vector<int64_t>& i,
                                             int64_t n, const std::vector<int64_t>& s) {
        const T* a = in_[0]->as<const T>() + i[0];
        const T* b = in_.back()->as<const T>() + i.back();
        const int64_t sa = s[0], sb = unary ? 0 : s[1];
        uint8_t* y = y_.as<uint8_t>() + o;
        for (int64_t j = 0; j < n; ++j) {
          y[j] = compare<decltype(op)::value>(a[j * sa], b[j * sb]);
        }
      });
    });
  }

  const Tensor& y_;
  Cmp op_;
  std::vector<const Tensor*> in_;
  std::vector<std::vector<int64_t>> strides_;
  std::vector<int64_t> steps_;
};

// Add, Sub or Mul of two integer tensors of one type (float32 ones are Elementwise programs),
// broadcast, wrapping around as numpy's do.
class IntegerArithKernel : public Kernel {
 public:
  IntegerArithKernel(const KernelContext& ctx, Arith op)
      : a_(ctx.input(0)), b_(ctx.input(1)), y_(ctx.output(0)), op_(op) {
    ctx.expect_arity(2, 2, 1);
    require(a_.dtype == y_.dtype && b_.dtype == y_.dtype, ctx.spec.op, ": ",
            dtype_name(a_.dtype), ", ", dtype_name(b_.dtype), " to ", dtype_name(y_.dtype),
            " (operands and output of one type)");
    require(y_.dtype != DType::f32 && y_.dtype != DType::f64 && y_.dtype != DType::f16 &&
                y_.dtype != DType::boolean,
            ctx.spec.op, ": ", dtype_name(y_.dtype), " (integers only)");
    strides_ = broadcast_all(ctx, y_);
  }

  void run(ThreadPool&, const Workspace&) override {
    switch (y_.dtype) {
      case DType::i8: return apply<int8_t>();
      case DType::u8: return apply<uint8_t>();
      case DType::i16: return apply<int16_t>();
      case DType::u16: return apply<uint16_t>();
      case DType::i32: return apply<int32_t>();
      case DType::u32: return apply<uint32_t>();
      case DType::u64: return apply<uint64_t>();
      default: return apply<int64_t>();
    }
  }

 private:
  template <typename T>
  void apply() {
    for_each(y_, strides_, [&](int64_t o, const std::vector<int64_t>& i) {
      y_.as<T>()[o] = wrapping(op_, a_.as<const T>()[i[0]], b_.as<const T>()[i[1]]);
    });
  }

  const Tensor& a_;
  const Tensor& b_;
  const Tensor& y_;
  Arith op_;
  std::vector<std::vector<int64_t>> strides_;
};

// An elementwise program runs on the flat floats of its output and of operands of the same
// shape, so those may all be blocked, if together (operands of one element are broadcast,
// whatever the layout); any other operand keeps it planar.
BlockedIo elementwise_blocked_io(const KernelContext& ctx) {
  if (ctx.inputs() != 0 || ctx.spec.outputs.size() != 1) return {};
  const Tensor& y = ctx.tensors[static_cast<size_t>(ctx.spec.outputs[0])];
  if (!whole_channel_blocks(y, ctx.simd.conv_lanes)) return {};
  BlockedIo io{false, true, true, true, {}};
  for (const OperandSpec& o : ctx.spec.operands) {
    const Tensor& t = ctx.tensors[static_cast<size_t>(o.tensor)];
    if (t.numel == 1) continue;
    if (t.shape != y.shape || !(o.view.empty() || o.view == y.shape)) return {};
    io.tied.push_back(o.tensor);
  }
  return io;
}

}  // namespace

void register_elementwise(KernelRegistry& r) {
  add_kernel(r, "Elementwise", make_kernel<ElementwiseKernel>(), elementwise_blocked_io);
}

void register_misc(KernelRegistry& r) {
  add_kernel(r, "Cast", make_kernel<CastKernel>());
  add_kernel(r, "Where", make_kernel<WhereKernel>());
  const std::pair<const char*, Cmp> cmps[] = {
      {"Equal", Cmp::Equal}, {"Less", Cmp::Less}, {"Greater", Cmp::Greater},
      {"LessOrEqual", Cmp::LessOrEqual}, {"GreaterOrEqual", Cmp::GreaterOrEqual},
      {"And", Cmp::And}, {"Or", Cmp::Or}, {"Xor", Cmp::Xor}, {"Not", Cmp::Not},
      {"IsNaN", Cmp::IsNaN}};
  for (const auto& [name, op] : cmps) add_kernel(r, name, make_kernel<CompareKernel>(op));
  const std::pair<const char*, Arith> arith[] = {
      {"Add", Arith::Add}, {"Sub", Arith::Sub}, {"Mul", Arith::Mul}};
  for (const auto& [name, op] : arith) add_kernel(r, name, make_kernel<IntegerArithKernel>(op));
}

}  // namespace onnxlens
