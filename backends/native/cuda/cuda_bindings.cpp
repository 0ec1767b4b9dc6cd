// onnxlens.backends._native_cuda: the CUDA executor (built only where nvcc is). The CUDA runtime
// is linked statically and finds the driver when first called, so importing this module on a
// machine without a GPU works and device_count() says 0; _native never depends on it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "cuda_device.h"
#include "executor_binding.h"

namespace nb = nanobind;
using namespace onnxlens;
using namespace onnxlens::cuda;

NB_MODULE(_native_cuda, m) {
  m.doc() = "onnxlens native executor on CUDA (kernels in backends/native/cuda)";
  m.def("device_count", [] { return device_count(); }, "CUDA devices (0 without driver or GPU)");
  m.def("unavailable_reason", [] {
    std::string why;
    return device_count(&why) > 0 ? std::string() : why;
  }, "Why no CUDA device can be used here, or \"\"");
  m.def("kernel_ops", &cuda_kernel_ops, "The kernel names of a plan the CUDA executor runs");
  PyGpuExecutor<CudaDevice>::bind(m, [](int, const std::string& isa) {
    require(isa.empty(), "native-cuda: no instruction set to choose (got ", isa, ")");
    return CudaDevice(0);
  });
}
