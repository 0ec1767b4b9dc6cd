// The CUDA executor: a plan lowered to CUDA launches (lower.h), run on a Device.
//
// A Device owns memory and runs launches: CudaDevice (cuda_device.h) on the GPU, EmuDevice
// (below) on the CPU through the emulator. It provides
//   void* alloc(int64_t bytes);  upload(dst, src, n);  download(dst, src, n);
//   template <class K> void launch(const typename K::Args&);
//   void mark();                       // a timestamp between steps (CUDA: an event)
//   std::vector<double> seconds();     // the time between consecutive marks (waits)
// The arena, the scratch area and the constants live on the device; one run uploads the
// inputs, runs every step between marks and downloads the outputs.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <variant>
#include <utility>
#include <vector>

#include "checked.h"
#include "emulate.h"
#include "executor.h"
#include "lower.h"
#include "plan.h"

namespace onnxlens::cuda {

template <class Device>
class GpuExecutor {
 public:
  GpuExecutor(PlanSpec plan, Device device) : plan_(std::move(plan)), device_(std::move(device)) {
    char* arena = static_cast<char*>(device_.alloc(plan_.arena_bytes));
    char* scratch = static_cast<char*>(device_.alloc(plan_.scratch_bytes));
    for (ConstBuffer& c : plan_.constants) {
      void* on_device = device_.alloc(c.nbytes);
      device_.upload(on_device, c.data, c.nbytes);
      c.data = on_device;
    }
    tensors_ = resolve_tensors(plan_, arena, scratch);
    launches_ = lower_plan(plan_, tensors_);
  }

  // As Executor::run (executor.h): the callers' buffers were checked against the plan's sizes.
  void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
           std::vector<double>& step_seconds, const std::vector<Capture>& captures) {
    require_run(inputs.size() == plan_.inputs.size() && outputs.size() == plan_.outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = tensors_[static_cast<size_t>(plan_.inputs[i])];
      device_.upload(t.data, inputs[i], t.nbytes);
    }
    size_t next_capture = 0;
    device_.mark();
    for (size_t s = 0; s < launches_.size(); ++s) {
      for (const Launch& l : launches_[s]) {
        std::visit([&](const auto& args) { run_one(args); }, l);
      }
      device_.mark();
      for (; next_capture < captures.size() &&
             captures[next_capture].step == static_cast<int>(s); ++next_capture) {
        const Tensor& t = tensors_[static_cast<size_t>(captures[next_capture].tensor)];
        device_.download(captures[next_capture].dst, t.data, t.nbytes);
      }
    }
    step_seconds = device_.seconds();
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& t = tensors_[static_cast<size_t>(plan_.outputs[i])];
      device_.download(outputs[i], t.data, t.nbytes);
    }
  }

  const PlanSpec& plan() const { return plan_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Device& device() const { return device_; }

 private:
  template <class Args>
  void run_one(const Args& args) {
    device_.template launch<typename KernelOf<Args>::type>(args);
  }
  void require_run(bool ok) const {
    if (!ok) {
      throw RunError(cat("expected ", plan_.inputs.size(), " inputs and ", plan_.outputs.size(),
                         " outputs"));
    }
  }

  PlanSpec plan_;
  Device device_;
  std::vector<Tensor> tensors_;
  std::vector<std::vector<Launch>> launches_;
};

// The CPU as the device: host memory, launches run by the emulator, steps timed by the clock.
class EmuDevice {
 public:
  void* alloc(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    blocks_.push_back(std::make_unique<char[]>(static_cast<size_t>(bytes)));
    return blocks_.back().get();
  }
  void upload(void* dst, const void* src, int64_t n) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n));
  }
  void download(void* dst, const void* src, int64_t n) { upload(dst, src, n); }
  template <class K>
  void launch(const typename K::Args& args) {
    emulate<K>(args, reverse_);
  }
  void mark() { marks_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> seconds() {
    std::vector<double> s;
    for (size_t i = 1; i < marks_.size(); ++i) {
      s.push_back(std::chrono::duration<double>(marks_[i] - marks_[i - 1]).count());
    }
    marks_.clear();
    return s;
  }
  void set_reverse(bool reverse) { reverse_ = reverse; }
  const char* name() const { return "emulated"; }

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
  bool reverse_ = false;
};

}  // namespace onnxlens::cuda
