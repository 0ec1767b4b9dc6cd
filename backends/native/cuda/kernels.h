// The CUDA kernels, and their launch: defined in kernels.cu (nvcc), declared here for plain C++
// callers, which need no CUDA header.
#pragma once

#include "ew.h"
#include "k_gemm.h"
#include "k_rows.h"
#include "k_window.h"

namespace onnxlens::cuda {

// Launches K on `stream` (a cudaStream_t); the cudaError_t of the launch as an int.
template <class K>
int launch(const typename K::Args& args, void* stream);

// Every kernel, for explicit instantiations (X-macro).
#define ONNXLENS_CUDA_KERNELS(X) \
  X(GemmKernel) X(DirectGemmKernel) X(PoolKernel) X(RowKernel) X(EwKernel)

// Kernel arguments travel as __global__ parameters, at most 4 KiB before CUDA 12.1.
#define ONNXLENS_PARAM_SIZE(K) static_assert(sizeof(K::Args) <= 4096, #K " arguments too big");
ONNXLENS_CUDA_KERNELS(ONNXLENS_PARAM_SIZE)
#undef ONNXLENS_PARAM_SIZE

}  // namespace onnxlens::cuda
