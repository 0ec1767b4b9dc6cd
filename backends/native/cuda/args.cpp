#include "args.h"

#include <string>

#include "checked.h"
#include "ewprog.h"

namespace onnxlens::cuda {

namespace {

// Broadcast strides of `view` (right-aligned) against `out` into `strides`.
void broadcast(const std::vector<int64_t>& view, const std::vector<int64_t>& out,
               int64_t* strides) {
  require(view.size() <= out.size(), "operand ", show(view), " has more dims than the output ",
          show(out));
  const size_t lead = out.size() - view.size();
  int64_t stride = 1;
  for (size_t i = view.size(); i-- > 0;) {
    require(view[i] == out[lead + i] || view[i] == 1, "operand ", show(view),
            " does not broadcast to ", show(out));
    strides[lead + i] = view[i] == 1 ? 0 : stride;
    stride = checked_mul(stride, view[i]);
  }
}

EwInstr instr(const InstrSpec& s, int noperand) {
  int arity = 0;
  EwInstr in{};
  in.op = ew_op(s.op, arity);
  require(static_cast<int>(s.srcs.size()) == arity, s.op, ": ", s.srcs.size(),
          " sources, expected ", arity);
  require(s.dst >= 0 && s.dst < kEwMaxRegs, s.op, ": register ", s.dst, " beyond the ",
          kEwMaxRegs, " of the CUDA kernels");
  in.dst = static_cast<int8_t>(s.dst);
  in.nsrc = static_cast<int8_t>(arity);
  for (int j = 0; j < arity; ++j) {
    const int src = s.srcs[static_cast<size_t>(j)];
    require(src < kEwMaxRegs && src >= -noperand, s.op, ": source ", src, " out of range");
    in.src[j] = static_cast<int8_t>(src);
  }
  in.p0 = s.params.size() > 0 ? static_cast<float>(s.params[0]) : 0.0f;
  in.p1 = s.params.size() > 1 ? static_cast<float>(s.params[1]) : 0.0f;
  return in;
}

}  // namespace

EwProgramDev ew_program(const std::vector<InstrSpec>& code,
                        const std::vector<EwOperandIn>& operands,
                        const std::vector<int64_t>& out_shape) {
  EwProgramDev p;
  require(out_shape.size() <= static_cast<size_t>(kEwMaxRank), "output ", show(out_shape),
          ": the CUDA kernels take rank <= ", kEwMaxRank);
  require(code.size() <= static_cast<size_t>(kEwMaxInstrs), code.size(),
          " instructions: the CUDA kernels take <= ", kEwMaxInstrs);
  require(operands.size() <= static_cast<size_t>(kEwMaxOperands), operands.size(),
          " operands: the CUDA kernels take <= ", kEwMaxOperands);
  require(code.empty() || code.back().dst == 0, "the last instruction must write register 0");
  p.rank = static_cast<int>(out_shape.size());
  for (int d = 0; d < p.rank; ++d) p.shape[d] = out_shape[static_cast<size_t>(d)];
  p.noperand = static_cast<int>(operands.size());
  for (int k = 0; k < p.noperand; ++k) {
    const EwOperandIn& o = operands[static_cast<size_t>(k)];
    p.operands[k].data = o.data;
    broadcast(o.shape, out_shape, p.operands[k].strides);
  }
  p.ninstr = static_cast<int>(code.size());
  for (int i = 0; i < p.ninstr; ++i) p.code[i] = instr(code[static_cast<size_t>(i)], p.noperand);
  return p;
}

EwProgramDev strided_copy(const float* x, int64_t numel, int64_t offset,
                          const std::vector<int64_t>& strides,
                          const std::vector<int64_t>& out_shape) {
  EwProgramDev p = ew_program({InstrSpec{"Identity", 0, {-1}, {}}}, {{x, {}}}, out_shape);
  int64_t lo = offset, hi = offset;
  for (size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] == 0) return p;  // nothing is read
    const int64_t span = checked_mul(out_shape[d] - 1, strides[d] < 0 ? -strides[d] : strides[d]);
    (strides[d] < 0 ? lo : hi) += strides[d] < 0 ? -span : span;
    p.operands[0].strides[d] = strides[d];
  }
  require(lo >= 0 && hi < numel, "Copy: reads elements ", lo, "..", hi, " of ", numel);
  p.operands[0].data = x + offset;
  return p;
}

GemmArgs matmul_args(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K,
                     int64_t batch, bool a_batched, bool b_batched, bool trans_a, bool trans_b,
                     const EwProgramDev& epilogue) {
  require(batch >= 1 && batch <= 65535, "MatMul: ", batch, " batches, the grid takes 1..65535");
  require(M >= 0 && N >= 0 && K >= 0 && (M + 63) / 64 <= 65535, "MatMul: bad sizes ", M, " x ",
          K, " x ", N);
  GemmArgs g{};
  g.M = M;
  g.N = N;
  g.K = K;
  g.batch = static_cast<int>(batch);
  g.a = a;
  g.a_rs = trans_a ? 1 : K;
  g.a_cs = trans_a ? M : 1;
  g.a_zs = a_batched ? checked_mul(M, K) : 0;
  g.b = b;
  g.b_rs = trans_b ? 1 : N;
  g.b_cs = trans_b ? K : 1;
  g.b_zs = b_batched ? checked_mul(K, N) : 0;
  g.c = c;
  g.c_rs = N;
  g.c_zs = checked_mul(M, N);
  g.c_split = N > 0 ? N : 1;
  g.c_split_s = 0;
  g.epilogue = epilogue;
  return g;
}

GemmArgs conv_args(const float* x, const float* w, float* y, const Window2d& g, int64_t M,
                   int64_t group, const EwProgramDev& epilogue) {
  require(group >= 1 && group <= 65535 && g.C % group == 0 && M % group == 0,
          "Conv: group ", group, " does not divide channels ", g.C, " and ", M);
  const int64_t cg = g.C / group, mg = M / group, ohw = checked_mul(g.OH, g.OW);
  GemmArgs a = matmul_args(w, nullptr, y, mg, checked_mul(g.N, ohw),
                           checked_mul(cg, checked_mul(g.kh, g.kw)), group, true, false, false,
                           false, epilogue);
  a.implicit = true;
  a.conv = ConvB{x, g.C, g.H, g.W, g.OH, g.OW, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, cg};
  a.c_rs = ohw;
  a.c_zs = checked_mul(mg, ohw);
  a.c_split = ohw > 0 ? ohw : 1;
  a.c_split_s = checked_mul(M, ohw);
  return a;
}

std::variant<GemmArgs, DirectGemmArgs> gemm_launch(const GemmArgs& g, const std::string& kernel) {
  require(kernel.empty() || kernel == "tiled" || kernel == "direct", "unknown GEMM kernel ",
          kernel);
  if (kernel == "direct" || (kernel.empty() && g.M <= kDirectMaxRows)) return DirectGemmArgs{g};
  return g;
}

PoolArgs pool_args(const float* x, float* y, const Window2d& g, bool max, bool include_pad) {
  return PoolArgs{x,    y,    checked_mul(g.N, g.C), g.H,  g.W,  g.OH, g.OW, g.kh, g.kw,
                  g.sh, g.sw, g.dh,                  g.dw, g.pt, g.pl, g.pb, g.pr, max,
                  include_pad};
}

RowArgs row_args(RowOp op, const float* x, float* y, const std::vector<int64_t>& shape,
                 int64_t axis, bool flatten, const float* scale, const float* bias,
                 float epsilon) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  require(axis >= 0 && axis <= rank, "axis ", axis, " out of range for ", show(shape));
  RowArgs a{op, x, y, 1, 1, 1, scale, bias, epsilon};
  // Softmax reduces one axis unless flattened; the others reduce everything from axis on.
  const bool one_axis = (op == RowOp::Softmax || op == RowOp::LogSoftmax) && !flatten;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t& part = d < axis ? a.rows : (d == axis || !one_axis ? a.len : a.inner);
    part = checked_mul(part, shape[static_cast<size_t>(d)]);
  }
  a.rows = checked_mul(a.rows, a.inner);
  require(a.rows <= 0x7fffffff, "more rows than a grid holds: ", a.rows);
  return a;
}

}  // namespace onnxlens::cuda
