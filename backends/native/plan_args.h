// The plan as Python passes it (the tuples of backends/native/plan.py's native_args) turned into
// the core's PlanSpec. Shared by the binding of the CPU executor (bindings.cpp) and those of the
// CUDA executor and its emulator (cuda/). Constants are referenced, never copied.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <utility>

#include "plan.h"

namespace onnxlens::py {

namespace nb = nanobind;

using ConstArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using TensorT = std::tuple<std::string, int, std::vector<int64_t>, int, int64_t, int>;
using OperandT = std::tuple<int, std::vector<int64_t>>;
using InstrT = std::tuple<std::string, int, std::vector<int>, std::vector<double>>;
using KernelT = std::tuple<std::string, std::vector<int>, std::vector<int>,
                           std::map<std::string, std::vector<int64_t>>,
                           std::map<std::string, std::vector<double>>, std::vector<OperandT>,
                           std::vector<InstrT>>;
using StepT = std::tuple<int, std::string, std::vector<KernelT>>;

inline KernelSpec kernel_spec(const KernelT& k) {
  KernelSpec s;
  std::vector<OperandT> operands;
  std::vector<InstrT> program;
  std::tie(s.op, s.inputs, s.outputs, s.ints, s.floats, operands, program) = k;
  for (const auto& [tensor, view] : operands) s.operands.push_back({tensor, view});
  for (const auto& [op, dst, srcs, params] : program) s.program.push_back({op, dst, srcs, params});
  return s;
}

// `keep` receives the constants' arrays, which the plan points into: keep them alive as long.
inline PlanSpec plan_spec(const std::vector<TensorT>& tensors,
                          const std::vector<ConstArray>& constants, const std::vector<int>& inputs,
                          const std::vector<int>& outputs, const std::vector<StepT>& steps,
                          int64_t arena_bytes, int64_t scratch_bytes,
                          std::vector<nb::object>& keep) {
  PlanSpec plan;
  for (const auto& [name, dtype, shape, storage, offset, alias] : tensors) {
    plan.tensors.push_back({name, dtype, shape, storage, offset, alias});
  }
  for (const ConstArray& a : constants) {
    plan.constants.push_back({a.data(), static_cast<int64_t>(a.nbytes()), nullptr});
    keep.push_back(nb::cast(a));
  }
  plan.inputs = inputs;
  plan.outputs = outputs;
  for (const auto& [group, name, kernels] : steps) {
    StepSpec s{group, name, {}};
    for (const KernelT& k : kernels) s.kernels.push_back(kernel_spec(k));
    plan.steps.push_back(std::move(s));
  }
  plan.arena_bytes = arena_bytes;
  plan.scratch_bytes = scratch_bytes;
  return plan;
}

}  // namespace onnxlens::py
