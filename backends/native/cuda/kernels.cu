// The __global__ side of the kernels of launch.h: one function template runs any kernel's
// phases with __syncthreads() between them, the same phases the emulator runs on the CPU.
#include <cuda_runtime.h>

#include "kernels.h"

namespace onnxlens::cuda {

namespace {

__device__ Thread this_thread() {
  Thread t;
  t.block = Dim3{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                 static_cast<int>(blockIdx.z)};
  t.thread = Dim3{static_cast<int>(threadIdx.x), static_cast<int>(threadIdx.y),
                  static_cast<int>(threadIdx.z)};
  t.grid = Dim3{static_cast<int>(gridDim.x), static_cast<int>(gridDim.y),
                static_cast<int>(gridDim.z)};
  t.dim = Dim3{static_cast<int>(blockDim.x), static_cast<int>(blockDim.y),
               static_cast<int>(blockDim.z)};
  return t;
}

template <class K>
__global__ void __launch_bounds__(256) run_phases(const typename K::Args args) {
  __shared__ typename K::Shared shared;
  typename K::Regs regs{};
  const Thread t = this_thread();
  const int phases = K::phases(args);
  for (int p = 0; p < phases; ++p) {
    K::phase(args, t, p, shared, regs);
    __syncthreads();
  }
  K::finish(args, t, shared, regs);
}

}  // namespace

template <class K>
int launch(const typename K::Args& args, void* stream) {
  const Dim3 g = K::grid(args), b = K::block(args);
  if (g.x == 0 || g.y == 0 || g.z == 0) return cudaSuccess;
  run_phases<K><<<dim3(g.x, g.y, g.z), dim3(b.x, b.y, b.z), 0,
                  static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

#define ONNXLENS_INSTANTIATE(K) template int launch<K>(const K::Args&, void*);
ONNXLENS_CUDA_KERNELS(ONNXLENS_INSTANTIATE)
#undef ONNXLENS_INSTANTIATE

}  // namespace onnxlens::cuda
