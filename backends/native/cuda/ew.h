// Elementwise programs on the GPU: the fused epilogue of the GEMM/conv kernel, and the whole of
// the elementwise kernel. The encoding is the CPU's (ewprog.h): register 0 is the output value,
// a source < 0 is operand -1 - src broadcast against the output. Here every output element
// evaluates the program on its own, in registers, from its flat index.
#pragma once

#include <cstdint>

#include "arith.h"
#include "launch.h"
#include "simd.h"

namespace onnxlens::cuda {

constexpr int kEwMaxRank = 8;
constexpr int kEwMaxOperands = 8;
constexpr int kEwMaxInstrs = 32;
constexpr int kEwMaxRegs = 8;

struct EwInstr {
  EwOp op;
  int8_t dst, nsrc;
  int8_t src[3];
  float p0, p1;
};

struct EwOperand {
  const float* data;
  int64_t strides[kEwMaxRank];  // per output dim; 0 where broadcast
};

// A program over an output of `shape` (passed by value as a kernel argument: fixed arrays).
struct EwProgramDev {
  int rank = 0, ninstr = 0, noperand = 0;
  int64_t shape[kEwMaxRank] = {};
  EwOperand operands[kEwMaxOperands] = {};
  EwInstr code[kEwMaxInstrs] = {};
};

// One instruction on scalars; the same arith:: functions as the CPU kernels.
ONNXLENS_HD float ew_unary(EwOp op, float a, float p0, float p1) {
  namespace ar = onnxlens::arith;
  switch (op) {
    case EwOp::Identity: return a;
    case EwOp::Neg: return -a;
    case EwOp::Abs: return fabsf(a);
    case EwOp::Relu: return ar::relu(a);
    case EwOp::Sigmoid: return ar::sigmoid(a);
    case EwOp::Tanh: return ar::tanh(a);
    case EwOp::Exp: return ar::exp(a);
    case EwOp::Log: return logf(a);
    case EwOp::Sqrt: return sqrtf(a);
    case EwOp::Reciprocal: return 1.0f / a;
    case EwOp::Erf: return ar::erf(a);
    case EwOp::Floor: return floorf(a);
    case EwOp::Ceil: return ceilf(a);
    case EwOp::Round: return nearbyintf(a);
    case EwOp::Sign: return ar::sign(a);
    case EwOp::Sin: return sinf(a);
    case EwOp::Cos: return cosf(a);
    case EwOp::Gelu: return ar::gelu(a);
    case EwOp::GeluTanh: return ar::gelu_tanh(a);
    case EwOp::SiLU: return ar::silu(a);
    case EwOp::HardSwish: return ar::hard_swish(a);
    case EwOp::Softplus: return ar::softplus(a);
    case EwOp::Softsign: return ar::softsign(a);
    case EwOp::Mish: return ar::mish(a);
    case EwOp::LeakyRelu: return ar::leaky_relu(a, p0);
    case EwOp::Clip: return ar::clip(a, p0, p1);
    case EwOp::HardSigmoid: return ar::hard_sigmoid(a, p0, p1);
    case EwOp::Elu: return ar::elu(a, p0);
    case EwOp::Selu: return ar::selu(a, p0, p1);
    case EwOp::Celu: return ar::celu(a, p0);
    case EwOp::ThresholdedRelu: return ar::thresholded_relu(a, p0);
    case EwOp::Shrink: return ar::shrink(a, p0, p1);
    case EwOp::Affine: return p0 * a + p1;
    default: return a;
  }
}

ONNXLENS_HD float ew_binary(EwOp op, float a, float b) {
  switch (op) {
    case EwOp::Add: return a + b;
    case EwOp::Sub: return a - b;
    case EwOp::Mul: return a * b;
    case EwOp::Div: return a / b;
    case EwOp::Pow: return onnxlens::arith::pow(a, b);
    case EwOp::Max: return onnxlens::arith::max(a, b);
    case EwOp::Min: return onnxlens::arith::min(a, b);
    case EwOp::Mod: return onnxlens::arith::mod(a, b);
    case EwOp::PRelu: return a < 0.0f ? a * b : a;
    default: return a;
  }
}

// The value of `p` at output element `flat`, register 0 starting as `v`.
ONNXLENS_HD float ew_eval(const EwProgramDev& p, int64_t flat, float v) {
  int64_t offset[kEwMaxOperands] = {};
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t i = flat % p.shape[d];
    flat /= p.shape[d];
    for (int k = 0; k < p.noperand; ++k) offset[k] += i * p.operands[k].strides[d];
  }
  float r[kEwMaxRegs] = {};
  r[0] = v;
  for (int i = 0; i < p.ninstr; ++i) {
    const EwInstr& in = p.code[i];
    float s[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < in.nsrc; ++j) {
      const int src = in.src[j];
      s[j] = src >= 0 ? r[src] : p.operands[-1 - src].data[offset[-1 - src]];
    }
    r[in.dst] = in.nsrc == 1   ? ew_unary(in.op, s[0], in.p0, in.p1)
                : in.nsrc == 2 ? ew_binary(in.op, s[0], s[1])
                               : s[0] * s[1] + s[2];  // MulAdd, the only ternary op
  }
  return r[0];
}

// The elementwise kernel: one thread per output element, no shared memory.
struct EwKernel {
  static constexpr int kThreads = 256;
  struct Args {
    float* out;
    int64_t n;
    EwProgramDev program;
  };
  struct Shared {};
  struct Regs {};

  static Dim3 grid(const Args& a) { return cover(a.n, kThreads); }
  static Dim3 block(const Args&) { return Dim3{kThreads, 1, 1}; }
  ONNXLENS_HD static int phases(const Args&) { return 0; }
  ONNXLENS_HD static void phase(const Args&, const Thread&, int, Shared&, Regs&) {}
  ONNXLENS_HD static void finish(const Args& a, const Thread& t, Shared&, Regs&) {
    const int64_t i = t.global_x();
    if (i < a.n) a.out[i] = ew_eval(a.program, i, 0.0f);
  }
};

}  // namespace onnxlens::cuda
