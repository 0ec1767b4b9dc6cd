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
#define ONNXLENS_CUDA_KERNELS(X) X(GemmKernel) X(PoolKernel) X(RowKernel) X(EwKernel)

}  // namespace onnxlens::cuda
