// The executor: a validated plan with its arena, kernels and threads, run many times.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "huge_pages.h"
#include "kernel.h"
#include "plan.h"

namespace onnxlens {

// After step `step`, copy tensor `tensor` (its nbytes) to `dst` (intermediate dumps).
struct Capture {
  int step;
  int tensor;
  void* dst;
};

class Executor {
 public:
  // Validates the whole plan and builds every kernel (packing weights) before returning;
  // PlanError on anything malformed. `isa`: "" for the best this CPU has, or a name.
  Executor(PlanSpec plan, int threads, const std::string& isa);

  // inputs[i]: the bytes of graph input i (nbytes checked by the caller against the plan's
  // tensor); outputs[i]: a buffer for graph output i. Fills `step_seconds` (one per step).
  void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
           std::vector<double>& step_seconds, const std::vector<Capture>& captures = {});

  const PlanSpec& plan() const { return plan_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const char* isa() const { return simd_->name; }
  int threads() const { return pool_.size(); }
  int64_t workspace_bytes() const { return workspace_floats_ * 4 * pool_.size(); }
  // The step that writes each tensor (-1: a graph input or constant).
  std::vector<int> producer_steps() const;

 private:
  PlanSpec plan_;
  const SimdKernels* simd_;
  HugeVector<char> arena_, scratch_;
  std::vector<Tensor> tensors_;
  std::vector<std::vector<std::unique_ptr<Kernel>>> steps_;
  ThreadPool pool_;
  Workspace workspace_;
  int64_t workspace_floats_ = 0;
};

}  // namespace onnxlens
