#include "ewprog.h"

#include <algorithm>
#include <map>
#include <string>

#include "checked.h"
#include "kernel.h"

namespace onnxlens {

namespace {

struct OpInfo {
  EwOp op;
  int arity;
};

const std::map<std::string, OpInfo>& op_table() {
  static const std::map<std::string, OpInfo> table = {
#define EW_UNARY(name, params, expr) {#name, {EwOp::name, 1}},
#define EW_BINARY(name, expr) {#name, {EwOp::name, 2}},
#define EW_TERNARY(name) {#name, {EwOp::name, 3}},
#include "ops.def"
  };
  return table;
}

// Broadcast strides of `view` (right-aligned) against `out`; PlanError if not broadcastable.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& view,
                                       const std::vector<int64_t>& out, const std::string& name) {
  require(view.size() <= out.size(), "operand ", name, " ", show(view),
          " has more dims than the output ", show(out));
  const size_t lead = out.size() - view.size();
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = view.size(); i-- > 0;) {
    const int64_t d = view[i];
    require(d == out[lead + i] || d == 1, "operand ", name, " ", show(view),
            " does not broadcast to ", show(out));
    strides[lead + i] = d == 1 ? 0 : stride;
    stride = checked_mul(stride, d);
  }
  return strides;
}

// The longest suffix of output dims over which the operand's index rises by a fixed stride
// (0: broadcast, 1: contiguous) with the flat output index.
void suffix_block(const std::vector<int64_t>& out, const std::vector<int64_t>& strides,
                  int64_t& block, int64_t& block_stride) {
  block = 1;
  int mode = -1;
  for (size_t i = out.size(); i-- > 0;) {
    if (out[i] == 1) continue;
    const int m = strides[i] == 0 ? 0 : 1;
    if (mode == -1) mode = m;
    if (m != mode || (m == 1 && strides[i] != block)) break;
    block *= out[i];
  }
  block_stride = mode == 1 ? 1 : 0;
}

}  // namespace

std::vector<std::pair<std::string, int>> ew_ops() {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, info] : op_table()) out.emplace_back(name, info.arity);
  return out;
}

EwOp ew_op(const std::string& name, int& arity) {
  const auto& table = op_table();
  const auto it = table.find(name);
  require(it != table.end(), "unknown elementwise op ", name);
  arity = it->second.arity;
  return it->second.op;
}

EwProgram::EwProgram(const KernelContext& ctx, const std::vector<int64_t>& out_shape)
    : shape_(out_shape) {
  require(out_shape.size() <= kMaxRank, "elementwise output of rank ", out_shape.size(),
          " (at most ", kMaxRank, ")");
  const KernelSpec& spec = ctx.spec;
  const int64_t numel = checked_product(out_shape);
  for (const OperandSpec& o : spec.operands) {
    require(o.tensor >= 0 && o.tensor < static_cast<int>(ctx.tensors.size()),
            "operand: no tensor #", o.tensor);
    const Tensor& t = ctx.tensors[static_cast<size_t>(o.tensor)];
    require(t.dtype == DType::f32, "operand ", t.name, " is ", dtype_name(t.dtype),
            ", not float32");
    const std::vector<int64_t>& view = o.view.empty() ? t.shape : o.view;
    require(checked_product(view) == t.numel, "operand ", t.name, ": view ", show(view),
            " does not hold its ", t.numel, " elements");
    Operand op{t.f32(), t.storage == Storage::constant,
               broadcast_strides(view, out_shape, t.name), 1, 0};
    suffix_block(out_shape, op.strides, op.block, op.block_stride);
    operands_.push_back(std::move(op));
  }
  const auto nops = static_cast<int>(operands_.size());
  for (const InstrSpec& in : spec.program) {
    int arity = 0;
    Instr instr{ew_op(in.op, arity), in.dst, arity, {0, 0, 0}, 0.0f, 0.0f};
    require(static_cast<int>(in.srcs.size()) == arity, in.op, " takes ", arity, " sources");
    require(in.dst >= 0 && in.dst < 64, in.op, ": register ", in.dst, " out of range");
    require(in.params.size() <= 2, in.op, ": at most 2 parameters");
    for (int i = 0; i < arity; ++i) {
      const int s = in.srcs[static_cast<size_t>(i)];
      require((s >= 0 && s < 64) || (s < 0 && -1 - s < nops), in.op, ": bad source ", s);
      instr.src[i] = s;
      if (s >= 0) nregs_ = std::max(nregs_, s + 1);
    }
    if (!in.params.empty()) instr.p0 = static_cast<float>(in.params[0]);
    if (in.params.size() > 1) instr.p1 = static_cast<float>(in.params[1]);
    nregs_ = std::max(nregs_, in.dst + 1);
    code_.push_back(instr);
  }
  require(code_.empty() || code_.back().dst == 0, "the program's last instruction must write "
          "register 0");
  require(numel >= 0, "bad output");
}

int EwProgram::varying_dim(const Operand& o) const {
  int dim = -1;
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (o.strides[d] == 0 || shape_[d] == 1) continue;
    if (dim != -1) return -2;
    dim = static_cast<int>(d);
  }
  return dim;
}

// The instructions as a chain on one running value: each reads the value the one before
// wrote (first: register 0) and operands only. False if the program is not such a chain.
bool EwProgram::chain(std::vector<Instr>& out) const {
  int cur = 0;
  for (Instr in : code_) {
    if (in.nsrc >= 2 && in.src[0] != cur && in.src[1] == cur &&
        (in.op == EwOp::Add || in.op == EwOp::Mul)) {
      std::swap(in.src[0], in.src[1]);
    }
    if (in.src[0] != cur) return false;
    for (int k = 1; k < in.nsrc; ++k) {
      if (in.src[k] >= 0) return false;
    }
    cur = in.dst;
    out.push_back(in);
  }
  return cur == 0;
}

// Folds one instruction v = f(v, per-row constants) into the rows' scale and bias.
bool EwProgram::fold_row_op(const Instr& in, FastEpilogue& f, int row_dim) const {
  auto row_value = [&](int src, int64_t r, float& v) {
    const Operand& o = operands_[static_cast<size_t>(-1 - src)];
    const int dim = varying_dim(o);
    if (!o.constant || (dim != row_dim && dim != -1)) return false;
    v = o.data[dim == -1 ? 0 : r * o.strides[static_cast<size_t>(row_dim)]];
    return true;
  };
  const auto rows = static_cast<int64_t>(f.row_scale.size());
  for (int64_t r = 0; r < rows; ++r) {
    float& s = f.row_scale[r];
    float& b = f.row_bias[r];
    float u = 0.0f, v = 0.0f;
    switch (in.op) {
      case EwOp::Add: if (!row_value(in.src[1], r, v)) return false; b += v; break;
      case EwOp::Sub: if (!row_value(in.src[1], r, v)) return false; b -= v; break;
      case EwOp::Mul:
        if (!row_value(in.src[1], r, v)) return false;
        s *= v;
        b *= v;
        break;
      case EwOp::MulAdd:
        if (!row_value(in.src[1], r, u) || !row_value(in.src[2], r, v)) return false;
        s *= u;
        b = b * u + v;
        break;
      case EwOp::Affine: s *= in.p0; b = b * in.p0 + in.p1; break;
      default: return false;
    }
  }
  return true;
}

namespace {

// Whether a tile may apply `op` as it stores (ops.def's TILE_EPILOGUE list).
bool in_tile_epilogue(EwOp op) {
  switch (op) {
#define TILE_EPILOGUE(name) case EwOp::name:
#include "ops.def"
      return true;
    default:
      return false;
  }
}

}  // namespace

FastEpilogue EwProgram::fast(int row_dim, int64_t rows, bool col_dim_ok) const {
  FastEpilogue f;
  std::vector<Instr> code;
  if (code_.empty() || !chain(code)) return f;
  for (const Instr& in : code) {
    if (!in_tile_epilogue(in.op)) return f;
  }
  f.row_scale.assign(static_cast<size_t>(rows), 1.0f);
  f.row_bias.assign(static_cast<size_t>(rows), 0.0f);
  size_t i = 0;
  bool rows_used = false;
  for (; i < code.size() && fold_row_op(code[i], f, row_dim); ++i) rows_used = true;
  const int last_dim = static_cast<int>(shape_.size()) - 1;
  auto operand = [&](const Instr& in) { return &operands_[static_cast<size_t>(-1 - in.src[1])]; };
  if (!rows_used && col_dim_ok && i < code.size() && code[i].op == EwOp::Add &&
      varying_dim(*operand(code[i])) == last_dim) {
    f.col_bias = operand(code[i])->data;
    ++i;
  }
  if (i < code.size() && code[i].op == EwOp::Add) {
    const Operand* o = operand(code[i]);
    if (o->block_stride == 1 && o->block == checked_product(shape_)) {
      f.residual = o->data;
      f.residual_operand = -1 - code[i].src[1];
      ++i;
    }
  }
  if (i < code.size() && (code[i].op == EwOp::Relu || code[i].op == EwOp::Clip)) {
    f.lo = code[i].op == EwOp::Relu ? 0.0f : code[i].p0;
    f.hi = code[i].op == EwOp::Relu ? INFINITY : code[i].p1;
    ++i;
  }
  f.ok = i == code.size();
  if (!rows_used) {
    f.row_scale.clear();
    f.row_bias.clear();
  }
  return f;
}

Src EwProgram::source(int src, float* out, float* scratch, const int64_t* at) const {
  if (src == 0) return {out, 1};
  if (src > 0) return {scratch + (src - 1) * kChunk, 1};
  const Operand& o = operands_[static_cast<size_t>(-1 - src)];
  int64_t index = 0;
  for (size_t d = 0; d < shape_.size(); ++d) index += at[d] * o.strides[d];
  return {o.data + index, o.block_stride};
}

void EwProgram::apply(const SimdKernels& s, float* out, int64_t flat, int64_t n,
                      float* scratch) const {
  if (code_.empty()) return;
  int64_t at[kMaxRank];
  const int64_t end = flat + n;
  while (flat < end) {
    int64_t len = std::min(kChunk, end - flat);
    for (const Operand& o : operands_) len = std::min(len, o.block - flat % o.block);
    int64_t rest = flat;
    for (size_t d = shape_.size(); d-- > 0;) {
      at[d] = shape_[d] ? rest % shape_[d] : 0;
      rest = shape_[d] ? rest / shape_[d] : 0;
    }
    for (const Instr& in : code_) {
      float* dst = in.dst == 0 ? out : scratch + (in.dst - 1) * kChunk;
      const Src a = source(in.src[0], out, scratch, at);
      if (in.nsrc == 1) {
        s.unary(in.op, dst, a, len, in.p0, in.p1);
      } else if (in.nsrc == 2) {
        s.binary(in.op, dst, a, source(in.src[1], out, scratch, at), len);
      } else {
        s.ternary(in.op, dst, a, source(in.src[1], out, scratch, at),
                  source(in.src[2], out, scratch, at), len);
      }
    }
    flat += len;
    out += len;
  }
}

}  // namespace onnxlens
