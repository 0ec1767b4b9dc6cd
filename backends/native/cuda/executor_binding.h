// The Python class of a GpuExecutor, for the CUDA module and the emulator's: the constructor and
// run() of the CPU executor's binding (bindings.cpp), so native_cpu's plan handling drives it
// unchanged. PlanError / RunError are _native's: its translators turn the core's exceptions
// into them in every module of the family.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_executor.h"
#include "plan_args.h"

namespace onnxlens::cuda {

namespace nb = nanobind;

template <class Device>
class PyGpuExecutor {
 public:
  using Array = nb::ndarray<nb::c_contig, nb::device::cpu>;

  PyGpuExecutor(const std::vector<py::TensorT>& tensors,
                const std::vector<py::ConstArray>& constants, const std::vector<int>& inputs,
                const std::vector<int>& outputs, const std::vector<py::StepT>& steps,
                int64_t arena_bytes, int64_t scratch_bytes, Device device) {
    // The constants are uploaded by the constructor: nothing needs to keep them alive after.
    std::vector<nb::object> keep;
    executor_ = std::make_unique<GpuExecutor<Device>>(
        py::plan_spec(tensors, constants, inputs, outputs, steps, arena_bytes, scratch_bytes,
                      keep),
        std::move(device));
  }

  std::vector<double> run(const std::vector<py::ConstArray>& inputs,
                          const std::vector<Array>& outputs,
                          const std::vector<std::tuple<int, int, Array>>& captures) {
    const PlanSpec& plan = executor_->plan();
    if (inputs.size() != plan.inputs.size() || outputs.size() != plan.outputs.size()) {
      throw RunError(cat("expected ", plan.inputs.size(), " inputs and ", plan.outputs.size(),
                         " output buffers"));
    }
    std::vector<const void*> in;
    std::vector<void*> out;
    std::vector<Capture> caps;
    for (size_t i = 0; i < inputs.size(); ++i) in.push_back(checked(inputs[i], plan.inputs[i]));
    for (size_t i = 0; i < outputs.size(); ++i) {
      out.push_back(checked(outputs[i], plan.outputs[i]));
    }
    for (const auto& [step, tensor, array] : captures) {
      caps.push_back({step, tensor, checked(array, tensor)});
    }
    std::vector<double> seconds;
    {
      nb::gil_scoped_release release;
      executor_->run(in, out, seconds, caps);
    }
    return seconds;
  }

  // The step that writes each tensor (-1: a graph input or constant), as Executor's.
  std::vector<int> producer_steps() const {
    std::vector<int> step_of(executor_->tensors().size(), -1);
    const auto& steps = executor_->plan().steps;
    for (size_t s = 0; s < steps.size(); ++s) {
      for (const KernelSpec& k : steps[s].kernels) {
        for (int id : k.outputs) step_of[static_cast<size_t>(id)] = static_cast<int>(s);
      }
    }
    return step_of;
  }

  const GpuExecutor<Device>& executor() const { return *executor_; }

  // Binds the class as `Executor` in `m`; `make` builds the device from (threads, isa).
  template <class Make>
  static void bind(nb::module_& m, Make make) {
    nb::object native = nb::module_::import_("onnxlens.backends._native");
    m.attr("PlanError") = native.attr("PlanError");
    m.attr("RunError") = native.attr("RunError");
    nb::class_<PyGpuExecutor>(m, "Executor")
        .def("__init__",
             [make](PyGpuExecutor* self, const std::vector<py::TensorT>& tensors,
                    const std::vector<py::ConstArray>& constants, const std::vector<int>& inputs,
                    const std::vector<int>& outputs, const std::vector<py::StepT>& steps,
                    int64_t arena_bytes, int64_t scratch_bytes, int threads,
                    const std::string& isa) {
               new (self) PyGpuExecutor(tensors, constants, inputs, outputs, steps, arena_bytes,
                                        scratch_bytes, make(threads, isa));
             },
             nb::arg("tensors"), nb::arg("constants"), nb::arg("inputs"), nb::arg("outputs"),
             nb::arg("steps"), nb::arg("arena_bytes"), nb::arg("scratch_bytes"),
             nb::arg("threads") = 1, nb::arg("isa") = "")
        .def("run", &PyGpuExecutor::run, nb::arg("inputs"), nb::arg("outputs"),
             nb::arg("captures") = std::vector<std::tuple<int, int, Array>>{})
        .def_prop_ro("isa", [](const PyGpuExecutor& e) {
          return std::string(e.executor().device().name());
        })
        .def_prop_ro("threads", [](const PyGpuExecutor&) { return 1; })
        .def_prop_ro("workspace_bytes", [](const PyGpuExecutor&) { return int64_t{0}; })
        .def("producer_steps", &PyGpuExecutor::producer_steps);
  }

 private:
  template <class A>
  void* checked(const A& a, int id) const {
    const auto& tensors = executor_->tensors();
    if (id < 0 || id >= static_cast<int>(tensors.size())) throw RunError("no such tensor");
    const Tensor& t = tensors[static_cast<size_t>(id)];
    if (static_cast<int64_t>(a.nbytes()) != t.nbytes) {
      throw RunError(cat(t.name, ": ", a.nbytes(), " bytes given, ", t.nbytes, " expected"));
    }
    return const_cast<void*>(static_cast<const void*>(a.data()));
  }

  std::unique_ptr<GpuExecutor<Device>> executor_;
};

}  // namespace onnxlens::cuda
