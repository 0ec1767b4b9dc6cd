// The plan's kernels (KernelSpec, as the CPU executor gets them) lowered to CUDA launches.
// Plain C++: the emulator's executor and the CUDA executor share it, so the tests exercise
// every argument the GPU would get.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "args.h"
#include "plan.h"

namespace onnxlens::cuda {

using Launch = std::variant<GemmArgs, DirectGemmArgs, PoolArgs, RowArgs, EwKernel::Args>;

// The kernel that runs each kind of launch arguments.
template <class Args> struct KernelOf;
template <> struct KernelOf<GemmArgs> { using type = GemmKernel; };
template <> struct KernelOf<DirectGemmArgs> { using type = DirectGemmKernel; };
template <> struct KernelOf<PoolArgs> { using type = PoolKernel; };
template <> struct KernelOf<RowArgs> { using type = RowKernel; };
template <> struct KernelOf<EwKernel::Args> { using type = EwKernel; };

// The launches of every step, their pointers into `tensors` (resolved on the device's memory).
// PlanError for a kernel with no CUDA version, or attributes these kernels do not take.
std::vector<std::vector<Launch>> lower_plan(const PlanSpec& plan,
                                            const std::vector<Tensor>& tensors);

// The kernel names of a plan the CUDA executor runs.
std::vector<std::string> cuda_kernel_ops();

}  // namespace onnxlens::cuda
