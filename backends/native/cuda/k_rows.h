// Row kernels: one block per row, whose statistics are block reductions in shared memory.
// Softmax / LogSoftmax (max, then the sum of exp), LayerNormalization (mean, then the variance
// as the mean square of x - mean: two passes, no cancellation), GlobalAveragePool and
// GlobalMaxPool (one reduction). A row is `len` elements `inner` apart: row r of [outer, len,
// inner] starts at (r / inner) * len * inner + r % inner.
//
// A reduction takes 1 + kLog phases: each thread folds its strided share of the row into
// red[slot][tid], then halving steps fold the upper half into the lower. Reduction r uses slot
// r, so the first result (red[0][0]) is still there while the second is computed.
#pragma once

#include <cstdint>

#include "arith.h"
#include "launch.h"

namespace onnxlens::cuda {

enum class RowOp : int { Softmax = 0, LogSoftmax = 1, LayerNorm = 2, Mean = 3, Max = 4 };

struct RowArgs {
  RowOp op;
  const float* x;
  float* y;  // like x; Mean / Max: one value per row
  int64_t rows, len, inner;
  const float* scale;  // LayerNorm: len values, or null for 1
  const float* bias;   // LayerNorm: len values, or null for 0
  float epsilon;
};

struct RowKernel {
  static constexpr int kLog = 8, kThreads = 1 << kLog;
  using Args = RowArgs;
  struct Shared {
    float red[2][kThreads];
  };
  struct Regs {};

  ONNXLENS_HD static int reductions(RowOp op) {
    return op == RowOp::Mean || op == RowOp::Max ? 1 : 2;
  }
  // Reductions that take the max (else the sum).
  ONNXLENS_HD static bool is_max(RowOp op, int r) {
    return r == 0 && (op == RowOp::Softmax || op == RowOp::LogSoftmax || op == RowOp::Max);
  }
  ONNXLENS_HD static float fold(bool max, float a, float b) {
    return max ? onnxlens::arith::max(a, b) : a + b;
  }
  ONNXLENS_HD static int64_t base(const Args& a, const Thread& t) {
    const int64_t row = t.block.x;
    return row / a.inner * a.len * a.inner + row % a.inner;
  }
  ONNXLENS_HD static float mean(const Args& a, const Shared& s) {
    return s.red[0][0] / static_cast<float>(a.len);
  }

  // The term reduction r adds for element v (the second one needs the first's result).
  ONNXLENS_HD static float term(const Args& a, const Shared& s, int r, float v) {
    if (r == 0) return v;
    if (a.op == RowOp::LayerNorm) {
      const float d = v - mean(a, s);
      return d * d;
    }
    return onnxlens::arith::exp(v - s.red[0][0]);
  }

  static Dim3 grid(const Args& a) { return Dim3{static_cast<int>(a.rows), 1, 1}; }
  static Dim3 block(const Args&) { return Dim3{kThreads, 1, 1}; }
  ONNXLENS_HD static int phases(const Args& a) { return reductions(a.op) * (1 + kLog); }

  ONNXLENS_HD static void phase(const Args& a, const Thread& t, int p, Shared& s, Regs&) {
    const int r = p / (1 + kLog), step = p % (1 + kLog), tid = t.tid();
    const bool max = is_max(a.op, r);
    if (step == 0) {
      const float* x = a.x + base(a, t);
      float acc = max ? -INFINITY : 0.0f;
      for (int64_t k = tid; k < a.len; k += kThreads) {
        acc = fold(max, acc, term(a, s, r, x[k * a.inner]));
      }
      s.red[r][tid] = acc;
      return;
    }
    const int half = kThreads >> step;
    if (tid < half) s.red[r][tid] = fold(max, s.red[r][tid], s.red[r][tid + half]);
  }

  ONNXLENS_HD static void finish(const Args& a, const Thread& t, Shared& s, Regs&) {
    const int tid = t.tid();
    if (a.op == RowOp::Mean || a.op == RowOp::Max) {
      if (tid == 0) a.y[t.block.x] = a.op == RowOp::Max ? s.red[0][0] : mean(a, s);
      return;
    }
    const int64_t at = base(a, t);
    for (int64_t k = tid; k < a.len; k += kThreads) {
      const int64_t i = at + k * a.inner;
      a.y[i] = value(a, s, k, a.x[i]);
    }
  }

  ONNXLENS_HD static float value(const Args& a, const Shared& s, int64_t k, float v) {
    switch (a.op) {
      case RowOp::Softmax: return onnxlens::arith::exp(v - s.red[0][0]) / s.red[1][0];
      case RowOp::LogSoftmax: return v - s.red[0][0] - logf(s.red[1][0]);
      default: {
        const float var = s.red[1][0] / static_cast<float>(a.len);
        const float n = (v - mean(a, s)) / sqrtf(var + a.epsilon);
        return n * (a.scale ? a.scale[k] : 1.0f) + (a.bias ? a.bias[k] : 0.0f);
      }
    }
  }
};

}  // namespace onnxlens::cuda
