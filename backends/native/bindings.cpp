// The Python binding of the native executor: it only converts the plan (lists and tuples built by
// backends/native/plan.py) into the core's structs and passes numpy buffers across. Arrays are
// never copied here: constants are referenced (and kept alive), inputs and outputs are the
// caller's buffers, checked for size.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "ewprog.h"
#include "executor.h"
#include "plan_args.h"

namespace nb = nanobind;
using namespace onnxlens;
using namespace onnxlens::py;

namespace {

using Array = nb::ndarray<nb::c_contig, nb::device::cpu>;

class PyExecutor {
 public:
  PyExecutor(const std::vector<TensorT>& tensors, const std::vector<ConstArray>& constants,
             const std::vector<int>& inputs, const std::vector<int>& outputs,
             const std::vector<StepT>& steps, int64_t arena_bytes, int64_t scratch_bytes,
             int threads, const std::string& isa) {
    executor_ = std::make_unique<Executor>(
        plan_spec(tensors, constants, inputs, outputs, steps, arena_bytes, scratch_bytes, keep_),
        threads, isa);
  }

  // Fills `outputs` (and the capture buffers) and returns each step's seconds.
  std::vector<double> run(const std::vector<ConstArray>& inputs, const std::vector<Array>& outputs,
                          const std::vector<std::tuple<int, int, Array>>& captures) {
    const auto& plan = executor_->plan();
    const auto& tensors = executor_->tensors();
    auto check = [&](const auto& a, int id, const char* what) {
      const Tensor& t = tensors[static_cast<size_t>(id)];
      if (static_cast<int64_t>(a.nbytes()) != t.nbytes) {
        throw RunError(cat(what, " ", t.name, ": ", a.nbytes(), " bytes given, ", t.nbytes,
                           " expected"));
      }
      return const_cast<void*>(static_cast<const void*>(a.data()));
    };
    if (inputs.size() != plan.inputs.size() || outputs.size() != plan.outputs.size()) {
      throw RunError(cat("expected ", plan.inputs.size(), " inputs and ", plan.outputs.size(),
                         " output buffers"));
    }
    std::vector<const void*> in;
    std::vector<void*> out;
    for (size_t i = 0; i < inputs.size(); ++i) in.push_back(check(inputs[i], plan.inputs[i], "input"));
    for (size_t i = 0; i < outputs.size(); ++i) out.push_back(check(outputs[i], plan.outputs[i], "output"));
    std::vector<Capture> caps;
    for (const auto& [step, tensor, array] : captures) {
      if (tensor < 0 || tensor >= static_cast<int>(tensors.size())) throw RunError("bad capture");
      caps.push_back({step, tensor, check(array, tensor, "capture")});
    }
    std::vector<double> seconds;
    {
      nb::gil_scoped_release release;
      executor_->run(in, out, seconds, caps);
    }
    return seconds;
  }

  const Executor& executor() const { return *executor_; }

 private:
  std::vector<nb::object> keep_;
  std::unique_ptr<Executor> executor_;
};

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (const char* name : {"avx512", "avx2", "generic"}) {
    if (simd_named(name)) names.emplace_back(name);
  }
  return names;
}

std::vector<std::string> kernel_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, entry] : kernel_registry()) ops.push_back(name);
  return ops;
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "onnxlens native executor (C++ core, see backends/native)";
  nb::exception<PlanError>(m, "PlanError");
  nb::exception<RunError>(m, "RunError");
  m.def("available_isas", &available_isas, "Instruction sets this CPU and build can run, best first");
  m.def("default_isa", [] { return std::string(simd().name); });
  m.def("winograd_lanes", [] { return simd().winograd_group ? simd().conv_lanes : 0; },
        "The channel block of the Winograd 3x3 convolution on this CPU; 0 where it has none");
  m.def("kernel_ops", &kernel_ops, "The kernel names a plan may use");
  m.def("ew_ops", &ew_ops, "The elementwise operations (ops.def) and their operand counts");
  nb::class_<PyExecutor>(m, "Executor")
      .def(nb::init<const std::vector<TensorT>&, const std::vector<ConstArray>&,
                    const std::vector<int>&, const std::vector<int>&, const std::vector<StepT>&,
                    int64_t, int64_t, int, const std::string&>(),
           nb::arg("tensors"), nb::arg("constants"), nb::arg("inputs"), nb::arg("outputs"),
           nb::arg("steps"), nb::arg("arena_bytes"), nb::arg("scratch_bytes"),
           nb::arg("threads"), nb::arg("isa") = "")
      .def("run", &PyExecutor::run, nb::arg("inputs"), nb::arg("outputs"),
           nb::arg("captures") = std::vector<std::tuple<int, int, Array>>{})
      .def_prop_ro("isa", [](const PyExecutor& e) { return std::string(e.executor().isa()); })
      .def_prop_ro("threads", [](const PyExecutor& e) { return e.executor().threads(); })
      .def_prop_ro("workspace_bytes",
                   [](const PyExecutor& e) { return e.executor().workspace_bytes(); })
      .def("producer_steps", [](const PyExecutor& e) { return e.executor().producer_steps(); })
      .def_prop_ro("tensor_blocks", [](const PyExecutor& e) {  // Tensor::block of each
        std::vector<int64_t> blocks;
        for (const Tensor& t : e.executor().tensors()) blocks.push_back(t.block);
        return blocks;
      });
}
