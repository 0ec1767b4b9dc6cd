// How a CUDA kernel of backends/native/cuda is written, so that the CPU emulator runs it too.
//
// A kernel is a struct K with
//   using Args = ...;       // its parameters, passed by value to the __global__ function
//   struct Shared {...};    // its __shared__ memory (plain arrays)
//   struct Regs {...};      // one thread's state that lives across barriers (registers)
//   static Dim3 grid(const Args&), block(const Args&);
//   ONNXLENS_HD static int phases(const Args&);
//   ONNXLENS_HD static void phase(const Args&, const Thread&, int p, Shared&, Regs&);
//   ONNXLENS_HD static void finish(const Args&, const Thread&, Shared&, Regs&);
// Every thread of a block runs phase 0, a barrier, phase 1, a barrier, ..., then finish. On the
// GPU (kernels.cu) the barrier is __syncthreads(); the emulator (emulate.h) runs phase p for
// every thread of a block before any thread starts phase p + 1, with Shared as one array per
// block. The number of phases depends on the arguments only, so every thread of a block reaches
// every barrier. The arithmetic is in the phase functions, written once for both.
#pragma once

#include <cstdint>

#include "arith.h"

namespace onnxlens::cuda {

struct Dim3 {
  int x = 1, y = 1, z = 1;
};

ONNXLENS_HD int volume(const Dim3& d) { return d.x * d.y * d.z; }

// A thread's coordinates: blockIdx, threadIdx, gridDim and blockDim on the GPU.
struct Thread {
  Dim3 block, thread, grid, dim;

  // The thread's index inside its block, x fastest (as CUDA numbers warps).
  ONNXLENS_HD int tid() const { return thread.x + dim.x * (thread.y + dim.y * thread.z); }
  // The index along x over the whole grid.
  ONNXLENS_HD int64_t global_x() const {
    return static_cast<int64_t>(block.x) * dim.x + thread.x;
  }
};

// Blocks of `threads` threads along x, enough to cover `n` items.
inline Dim3 cover(int64_t n, int threads) {
  Dim3 g;
  g.x = static_cast<int>((n + threads - 1) / threads);
  if (g.x < 1) g.x = 1;
  return g;
}

}  // namespace onnxlens::cuda
