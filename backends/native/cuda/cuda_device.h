// The GPU as the Device of GpuExecutor (gpu_executor.h): memory, a stream, events between steps.
// Declared without CUDA headers; cuda_device.cpp is plain C++ against the CUDA runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace onnxlens::cuda {

// Devices the runtime sees; 0 when there is no driver or no GPU (`why` says which).
int device_count(std::string* why = nullptr);

class CudaDevice {
 public:
  explicit CudaDevice(int device);
  CudaDevice(CudaDevice&& other) noexcept;
  CudaDevice& operator=(CudaDevice&&) = delete;
  CudaDevice(const CudaDevice&) = delete;
  ~CudaDevice();

  void* alloc(int64_t bytes);
  void upload(void* dst, const void* src, int64_t n);
  void download(void* dst, const void* src, int64_t n);
  template <class K>
  void launch(const typename K::Args& args) {
    check(onnxlens::cuda::launch<K>(args, stream_), "kernel launch");
  }
  void mark();
  std::vector<double> seconds();
  const char* name() const { return name_.c_str(); }

 private:
  void check(int code, const char* what) const;

  int device_ = 0;
  void* stream_ = nullptr;
  std::vector<void*> blocks_, events_;
  size_t marks_ = 0;
  std::string name_;
};

}  // namespace onnxlens::cuda
