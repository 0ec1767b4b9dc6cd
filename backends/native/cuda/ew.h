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
ONNXLENS_HD float ew_unary(EwOp op, float x, float p0, float p1) {
  namespace ar = onnxlens::arith;
  switch (op) {
#define EW_UNARY(name, params, expr) \
  case EwOp::name: return expr;
#include "ops.def"
    default: return NAN;  // not a unary op: a planner bug, made loud (no trap on a GPU thread)
  }
}

ONNXLENS_HD float ew_binary(EwOp op, float x, float y) {
  namespace ar = onnxlens::arith;
  switch (op) {
#define EW_BINARY(name, expr) \
  case EwOp::name: return expr;
#include "ops.def"
    default: return NAN;  // not a binary op: a planner bug, made loud
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
