#include "cuda_device.h"

#include <cuda_runtime.h>

#include <utility>

#include "checked.h"

namespace onnxlens::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

CudaDevice::CudaDevice(int device) : device_(device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  name_ = cat("cuda:", device, " ", prop.name);
  cudaStream_t s = nullptr;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  stream_ = s;
}

CudaDevice::CudaDevice(CudaDevice&& o) noexcept
    : device_(o.device_), stream_(std::exchange(o.stream_, nullptr)),
      blocks_(std::move(o.blocks_)), events_(std::move(o.events_)), marks_(o.marks_),
      name_(std::move(o.name_)) {
  o.blocks_.clear();
  o.events_.clear();
}

CudaDevice::~CudaDevice() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (void* b : blocks_) cudaFree(b);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CudaDevice::check(int code, const char* what) const {
  if (code != cudaSuccess) {
    throw RunError(cat("native-cuda: ", what, ": ",
                       cudaGetErrorString(static_cast<cudaError_t>(code))));
  }
}

void* CudaDevice::alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(bytes)), "cudaMalloc");
  blocks_.push_back(p);
  return p;
}

void CudaDevice::upload(void* dst, const void* src, int64_t n) {
  if (n <= 0) return;
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyHostToDevice,
                        static_cast<cudaStream_t>(stream_)), "upload");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "upload");
}

void CudaDevice::download(void* dst, const void* src, int64_t n) {
  if (n <= 0) return;
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyDeviceToHost,
                        static_cast<cudaStream_t>(stream_)), "download");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "download");
}

// Events are made once and reused run after run.
void CudaDevice::mark() {
  if (marks_ == events_.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
  check(cudaEventRecord(static_cast<cudaEvent_t>(events_[marks_]),
                        static_cast<cudaStream_t>(stream_)), "cudaEventRecord");
  ++marks_;
}

std::vector<double> CudaDevice::seconds() {
  std::vector<double> s;
  if (marks_ > 0) {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[marks_ - 1])), "kernels");
  }
  for (size_t i = 1; i < marks_; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i - 1]),
                               static_cast<cudaEvent_t>(events_[i])), "cudaEventElapsedTime");
    s.push_back(ms * 1e-3);
  }
  marks_ = 0;
  return s;
}

}  // namespace onnxlens::cuda
