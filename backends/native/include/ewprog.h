// Elementwise programs: the fused epilogue of a Conv/Gemm/MatMul kernel, and the whole of an
// elementwise kernel.
//
// A program is a list of instructions over float registers. Register 0 is the kernel's output
// (holding the main op's result when the program runs as an epilogue); registers 1.. are
// scratch chunks. A source >= 0 names a register; a source < 0 names operand -1 - src, a
// tensor of the plan broadcast (numpy rules) against the output. The last instruction writes
// register 0. The program runs on runs of consecutive output elements, in chunks, so every
// intermediate value stays in L1.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan.h"
#include "simd.h"

namespace onnxlens {

class KernelContext;

// A program of the form the micro-kernels apply as they store (see TileEpilogue): per-row
// affine ops on constants folded into one scale and bias per row, or a per-column bias; then a
// residual of the output's shape; then Relu or Clip. `ok` is false for any other program.
struct FastEpilogue {
  bool ok = false;
  std::vector<float> row_scale, row_bias;  // empty when not needed
  const float* col_bias = nullptr;
  const float* residual = nullptr;  // laid out like the output
  int residual_operand = -1;         // its index in the spec's operands
  float lo = -INFINITY, hi = INFINITY;
};

class EwProgram {
 public:
  static constexpr int64_t kChunk = 512;
  static constexpr size_t kMaxRank = 12;

  EwProgram() = default;
  // Checks the program of `ctx.spec` against `out_shape` (operands broadcastable, registers
  // and sources in range, op names known, the last instruction writing register 0).
  EwProgram(const KernelContext& ctx, const std::vector<int64_t>& out_shape);

  bool empty() const { return code_.empty(); }
  // Floats of per-thread scratch apply() needs.
  int64_t scratch_floats() const { return (nregs_ > 1 ? nregs_ - 1 : 0) * kChunk; }
  // The program as a FastEpilogue, for an output whose GEMM rows run along `row_dim` (of
  // `rows` elements) and columns along the last dim (`col_dim_ok`: a MatMul's C).
  FastEpilogue fast(int row_dim, int64_t rows, bool col_dim_ok) const;
  // Runs the program on out[0, n), which are output elements flat .. flat + n - 1.
  void apply(const SimdKernels& s, float* out, int64_t flat, int64_t n, float* scratch) const;

 private:
  struct Operand {
    const float* data;
    bool constant;
    std::vector<int64_t> strides;  // per output dim, 0 where broadcast
    int64_t block;                 // runs of this many elements (aligned) have a fixed stride
    int64_t block_stride;          // 0 or 1
  };
  struct Instr {
    EwOp op;
    int dst;
    int nsrc;
    int src[3];
    float p0, p1;
  };

  Src source(int src, float* out, float* scratch, const int64_t* at) const;
  // The one output dim an operand varies along (-1: none, -2: several).
  int varying_dim(const Operand& o) const;
  bool chain(std::vector<Instr>& out) const;
  bool fold_row_op(const Instr& in, FastEpilogue& f, int row_dim) const;

  std::vector<int64_t> shape_;
  std::vector<Operand> operands_;
  std::vector<Instr> code_;
  int nregs_ = 1;
};

// EwOp by ONNX-like name ("Relu", "Add", "MulAdd", ...) and its operand count.
EwOp ew_op(const std::string& name, int& arity);
// Every operation of the catalogue (ops.def) this build knows: name and operand count.
std::vector<std::pair<std::string, int>> ew_ops();

}  // namespace onnxlens
