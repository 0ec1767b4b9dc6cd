// Host side: the arguments of the CUDA kernels from shapes and attributes, checked (PlanError).
// Plain C++, shared by the emulator's bindings and the CUDA executor; pointers may be host or
// device addresses, they are only stored.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "conv_geometry.h"
#include "ew.h"
#include "k_gemm.h"
#include "k_rows.h"
#include "k_window.h"
#include "plan.h"

namespace onnxlens::cuda {

// An operand of an elementwise program: its data seen with `shape`, broadcast to the output.
struct EwOperandIn {
  const float* data;
  std::vector<int64_t> shape;
};

EwProgramDev ew_program(const std::vector<InstrSpec>& code,
                        const std::vector<EwOperandIn>& operands,
                        const std::vector<int64_t>& out_shape);

// C[z] = A[z] B[z] (+ epilogue) for A [za, M, K] (trans_a: [za, K, M]) and B [zb, K, N]
// (trans_b: [zb, N, K]); za and zb are `batch` or 1 (broadcast). C is [batch, M, N].
GemmArgs matmul_args(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K,
                     int64_t batch, bool a_batched, bool b_batched, bool trans_a, bool trans_b,
                     const EwProgramDev& epilogue);

// y = conv(x, w) (+ epilogue) for x [N, C, H, W], w [M, C / group, kh, kw], y [N, M, OH, OW].
GemmArgs conv_args(const float* x, const float* w, float* y, const Window2d& g, int64_t M,
                   int64_t group, const EwProgramDev& epilogue);

// The program of a strided copy: output element i reads x[offset + sum_d i_d * strides[d]];
// PlanError if that reaches outside x's `numel` elements.
EwProgramDev strided_copy(const float* x, int64_t numel, int64_t offset,
                          const std::vector<int64_t>& strides,
                          const std::vector<int64_t>& out_shape);

// A product of few rows runs untiled (DirectGemmKernel): at most this many rows per batch.
constexpr int64_t kDirectMaxRows = 8;

// The launch for a product: tiled, or direct for few rows; `kernel` "tiled" or "direct" forces
// one (tests run both), "" chooses.
std::variant<GemmArgs, DirectGemmArgs> gemm_launch(const GemmArgs& g, const std::string& kernel);

PoolArgs pool_args(const float* x, float* y, const Window2d& g, bool max, bool include_pad);

// Softmax / LogSoftmax along `axis` (`flatten`: axis..end, opset < 13), LayerNorm over axis..end
// with `scale` / `bias` (may be null), Mean / Max over the trailing dims from `axis` on.
RowArgs row_args(RowOp op, const float* x, float* y, const std::vector<int64_t>& shape,
                 int64_t axis, bool flatten, const float* scale, const float* bias,
                 float epsilon);

}  // namespace onnxlens::cuda
