#include "lower.h"

#include <algorithm>
#include <functional>
#include <map>

#include "checked.h"
#include "kernel.h"

namespace onnxlens::cuda {

namespace {

using Lowering = std::function<Launch(const KernelContext&)>;

// The kernel's fused program over its output 0 (empty: none).
EwProgramDev epilogue(const KernelContext& ctx) {
  const Tensor& y = ctx.output(0);
  std::vector<EwOperandIn> operands;
  for (const OperandSpec& o : ctx.spec.operands) {
    require(o.tensor >= 0 && o.tensor < static_cast<int>(ctx.tensors.size()), ctx.spec.op,
            ": operand tensor #", o.tensor);
    const Tensor& t = ctx.tensors[static_cast<size_t>(o.tensor)];
    require(t.dtype == DType::f32, ctx.spec.op, ": operand ", t.name, " is not float32");
    require(o.view.empty() || checked_product(o.view) == t.numel, ctx.spec.op, ": view ",
            show(o.view), " of ", t.name, " ", show(t.shape));
    operands.push_back({t.f32(), o.view.empty() ? t.shape : o.view});
  }
  return ew_program(ctx.spec.program, operands, y.shape);
}

// A product's launch, tiled or direct (args.h).
Launch product(const GemmArgs& g) {
  return std::visit([](const auto& a) { return Launch(a); }, gemm_launch(g, ""));
}

const KernelContext& checked(const KernelContext& ctx, int min_in, int max_in) {
  ctx.expect_arity(min_in, max_in, 1);
  ctx.expect_f32_io();
  return ctx;
}

Launch conv(const KernelContext& c) {
  const KernelContext& ctx = checked(c, 2, 2);
  const Tensor &x = ctx.input(0), &w = ctx.input(1), &y = ctx.output(0);
  require(w.rank() == x.rank(), "Conv: weight ", show(w.shape), " for input ", show(x.shape));
  const std::vector<int64_t> kernel(w.shape.begin() + 2, w.shape.end());
  const Window2d g = window_2d(ctx, x, kernel, y.shape);
  const int64_t group = ctx.attr("group", 1);
  require(group >= 1 && w.dim(1) * group == g.C && y.dim(1) == w.dim(0), "Conv: weight ",
          show(w.shape), " for ", g.C, " channels in ", group, " groups");
  return product(conv_args(x.f32(), w.f32(), y.f32(), g, w.dim(0), group, epilogue(ctx)));
}

Launch gemm(const KernelContext& c) {
  const KernelContext& ctx = checked(c, 2, 2);
  const Tensor &a = ctx.input(0), &b = ctx.input(1), &y = ctx.output(0);
  require(a.rank() == 2 && b.rank() == 2, "Gemm: 2-D operands");
  const bool ta = ctx.attr("transA", 0) != 0, tb = ctx.attr("transB", 0) != 0;
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  const int64_t N = tb ? b.dim(0) : b.dim(1);
  require((tb ? b.dim(1) : b.dim(0)) == K && y.shape == std::vector<int64_t>{M, N},
          "Gemm: ", show(a.shape), " x ", show(b.shape), " -> ", show(y.shape));
  return product(
      matmul_args(a.f32(), b.f32(), y.f32(), M, N, K, 1, false, false, ta, tb, epilogue(ctx)));
}

// numpy MatMul where each operand's batch is the output's or absent (all 1s); a batched A times
// an unbatched B is one GEMM with the batch folded into M.
Launch matmul(const KernelContext& c) {
  const KernelContext& ctx = checked(c, 2, 2);
  const Tensor &a = ctx.input(0), &b = ctx.input(1), &y = ctx.output(0);
  std::vector<int64_t> as = a.shape, bs = b.shape;
  require(!as.empty() && !bs.empty(), "MatMul: scalar operand");
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  require(bs[bs.size() - 2] == K, "MatMul: inner dims differ: ", show(a.shape), " ",
          show(b.shape));
  const std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const std::vector<int64_t>& batch = ab.size() >= bb.size() ? ab : bb;
  const int64_t na = checked_product(ab), nb = checked_product(bb), items = checked_product(batch);
  require((na == items || na == 1) && (nb == items || nb == 1) &&
              (na == 1 || nb == 1 || ab == bb),
          "MatMul: the CUDA kernel broadcasts whole batches only: ", show(a.shape), " x ",
          show(b.shape));
  std::vector<int64_t> expect = batch;
  if (!a_vec) expect.push_back(M);
  if (!b_vec) expect.push_back(N);
  require(y.shape == expect, "MatMul: output ", show(y.shape), ", expected ", show(expect));
  const EwProgramDev epi = epilogue(ctx);
  if (nb == 1) {  // rows of every batch of A against the one B
    return product(matmul_args(a.f32(), b.f32(), y.f32(), checked_mul(na, M), N, K, 1, false,
                               false, false, false, epi));
  }
  return product(
      matmul_args(a.f32(), b.f32(), y.f32(), M, N, K, items, na > 1, true, false, false, epi));
}

Launch pool(const KernelContext& c, bool max) {
  const KernelContext& ctx = checked(c, 1, 1);
  const Tensor &x = ctx.input(0), &y = ctx.output(0);
  require(ctx.spec.program.empty(), ctx.spec.op, ": no fused program on the CUDA kernel");
  const Window2d g = window_2d(ctx, x, ctx.ints("kernel_shape"), y.shape,
                               ctx.attr("ceil_mode", 0) != 0);
  require(y.dim(1) == g.C, ctx.spec.op, ": output channels");
  return pool_args(x.f32(), y.f32(), g, max, ctx.attr("count_include_pad", 0) != 0);
}

Launch global_pool(const KernelContext& c, RowOp op) {
  const KernelContext& ctx = checked(c, 1, 1);
  const Tensor &x = ctx.input(0), &y = ctx.output(0);
  require(x.rank() >= 2 && y.numel == x.dim(0) * x.dim(1), ctx.spec.op, ": ", show(x.shape),
          " -> ", show(y.shape));
  return row_args(op, x.f32(), y.f32(), x.shape, 2, false, nullptr, nullptr, 0.0f);
}

Launch softmax(const KernelContext& c, RowOp op) {
  const KernelContext& ctx = checked(c, 1, 1);
  const Tensor &x = ctx.input(0), &y = ctx.output(0);
  require(x.shape == y.shape, ctx.spec.op, ": output shape differs");
  int64_t axis = ctx.attr("axis", -1);
  if (axis < 0) axis += x.rank();
  require(axis >= 0 && axis < std::max(x.rank(), 1), ctx.spec.op, ": axis out of range");
  return row_args(op, x.f32(), y.f32(), x.shape, axis, ctx.attr("flatten", 0) != 0, nullptr,
                  nullptr, 0.0f);
}

Launch layer_norm(const KernelContext& c) {
  const KernelContext& ctx = checked(c, 1, 3);
  const Tensor &x = ctx.input(0), &y = ctx.output(0);
  require(x.shape == y.shape, "LayerNormalization: output shape differs");
  int64_t axis = ctx.attr("axis", -1);
  if (axis < 0) axis += x.rank();
  RowArgs a = row_args(RowOp::LayerNorm, x.f32(), y.f32(), x.shape, axis, false, nullptr,
                       nullptr, static_cast<float>(ctx.attr_f("epsilon", 1e-5)));
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    require(ctx.input(i).numel == a.len, "LayerNormalization: input ", i, " has ",
            ctx.input(i).numel, " values for rows of ", a.len);
    (i == 1 ? a.scale : a.bias) = ctx.input(i).f32();
  }
  return a;
}

Launch elementwise(const KernelContext& c) {
  const KernelContext& ctx = checked(c, 0, 0);
  const Tensor& y = ctx.output(0);
  return EwKernel::Args{y.f32(), y.numel, epilogue(ctx)};
}

// Copy (reshape, slice, transpose): y[i] = x[offset + i . strides], of 4-byte elements.
Launch copy(const KernelContext& ctx) {
  ctx.expect_arity(1, 1, 1);
  const Tensor &x = ctx.input(0), &y = ctx.output(0);
  require(x.dtype == y.dtype && dtype_size(static_cast<int>(y.dtype)) == 4,
          "Copy: the CUDA kernel copies 4-byte elements of one type");
  std::vector<int64_t> strides = ctx.ints("strides");
  if (!ctx.spec.ints.count("strides")) {
    require(x.numel == y.numel, "Copy: ", show(x.shape), " to ", show(y.shape));
    strides.assign(y.shape.size(), 1);
    for (size_t d = y.shape.size(); d-- > 1;) strides[d - 1] = strides[d] * y.shape[d];
  }
  const int64_t offset = ctx.attr("offset", 0);
  require(strides.size() == y.shape.size(), "Copy: ", strides.size(), " strides for ",
          show(y.shape));
  return EwKernel::Args{y.f32(), y.numel,
                        strided_copy(x.f32(), x.numel, offset, strides, y.shape)};
}

const std::map<std::string, Lowering>& lowerings() {
  static const std::map<std::string, Lowering> table = {
      {"Conv", conv},
      {"Gemm", gemm},
      {"MatMul", matmul},
      {"MaxPool", [](const KernelContext& c) { return pool(c, true); }},
      {"AveragePool", [](const KernelContext& c) { return pool(c, false); }},
      {"GlobalAveragePool", [](const KernelContext& c) { return global_pool(c, RowOp::Mean); }},
      {"GlobalMaxPool", [](const KernelContext& c) { return global_pool(c, RowOp::Max); }},
      {"Softmax", [](const KernelContext& c) { return softmax(c, RowOp::Softmax); }},
      {"LogSoftmax", [](const KernelContext& c) { return softmax(c, RowOp::LogSoftmax); }},
      {"LayerNormalization", layer_norm},
      {"Elementwise", elementwise},
      {"Copy", copy},
  };
  return table;
}

}  // namespace

std::vector<std::vector<Launch>> lower_plan(const PlanSpec& plan,
                                            const std::vector<Tensor>& tensors) {
  std::vector<std::vector<Launch>> steps;
  for (const StepSpec& step : plan.steps) {
    std::vector<Launch> launches;
    for (const KernelSpec& spec : step.kernels) {
      const auto it = lowerings().find(spec.op);
      require(it != lowerings().end(), "native-cuda: no CUDA kernel for ", spec.op,
              " (step ", step.name, ")");
      const KernelContext ctx(spec, tensors, simd(), 1);
      launches.push_back(it->second(ctx));
    }
    steps.push_back(std::move(launches));
  }
  return steps;
}

std::vector<std::string> cuda_kernel_ops() {
  std::vector<std::string> ops;
  for (const auto& entry : lowerings()) ops.push_back(entry.first);
  return ops;
}

}  // namespace onnxlens::cuda
