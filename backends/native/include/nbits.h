// The 4-bit weight product of k_nbits.cpp (MatMulNBits), shared with the mixture of experts
// (k_moe.cpp's QMoE experts).
#pragma once

#include <cstdint>

#include "simd.h"
#include "threadpool.h"

namespace onnxlens {

// A K x N weight of 4-bit values as the planner lays it out (decoder.py `matmul_nbits`):
// `packed` [blocks, block / 2, N] bytes (byte t of a block: values 2t, low nibble, and 2t + 1
// of every column), `scales` and `zeros` [blocks, N]; w = (q - zero) · scale.
struct NbitsWeight {
  const uint8_t* packed;
  const float* scales;
  const float* zeros;
  int64_t k, n, block;
};

// y [rows, N] = a [rows, K] · W (+ bias [N] when not null), W's columns split among the
// pool's threads, on the SIMD table's instruction set.
void nbits_product(const SimdKernels& simd, ThreadPool& pool, const float* a, int64_t rows,
                   const NbitsWeight& w, const float* bias, float* y);

}  // namespace onnxlens
