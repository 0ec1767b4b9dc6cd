// The plan as it comes from Python, and the tensors it resolves to.
//
// A plan lists tensors (dtype, shape, where they live) and steps; a step is one fused group of
// the analyzer and holds one kernel, or a short sequence of kernels. Activations that cross a
// group boundary live in one arena at offsets computed by liveness in Python; values passed
// between the kernels of one step live in a scratch area; weights are constants.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace onnxlens {

// ONNX TensorProto element types the executor knows.
enum class DType : int {
  f32 = 1, u8 = 2, i8 = 3, u16 = 4, i16 = 5, i32 = 6, i64 = 7, boolean = 9, f16 = 10, f64 = 11,
  u32 = 12, u64 = 13,
};

int64_t dtype_size(int code);  // bytes per element; PlanError for an unknown code
const char* dtype_name(DType t);

enum class Storage : int {
#define STORAGE(name, code) name = code,
#include "ops.def"
};

struct TensorSpec {
  std::string name;
  int dtype = 1;
  std::vector<int64_t> shape;
  int storage = 0;
  int64_t offset = 0;  // bytes into the arena or scratch; the constant's index
  // The arena tensor whose bytes this one shares (a reshape's input: plan.py's
  // aliases_of_copies), or -1. Same offset and size; no kernel writes an alias.
  int alias = -1;
};

// One elementwise instruction: dst = op(srcs...) (see ewprog.h for the encoding).
struct InstrSpec {
  std::string op;
  int dst = 0;
  std::vector<int> srcs;
  std::vector<double> params;
};

// A tensor read by an elementwise program, seen with `view` as its shape (same element count;
// empty: the tensor's own shape), broadcast against the kernel's output.
struct OperandSpec {
  int tensor = -1;
  std::vector<int64_t> view;
};

struct KernelSpec {
  std::string op;
  std::vector<int> inputs;  // tensor ids; -1 for an omitted optional input
  std::vector<int> outputs;
  std::map<std::string, std::vector<int64_t>> ints;
  std::map<std::string, std::vector<double>> floats;
  std::vector<OperandSpec> operands;
  std::vector<InstrSpec> program;  // the fused epilogue, run on the kernel's output
};

struct StepSpec {
  int group = 0;
  std::string name;
  std::vector<KernelSpec> kernels;
};

// A constant's bytes, kept alive by `owner` (the numpy array on the Python side).
struct ConstBuffer {
  const void* data = nullptr;
  int64_t nbytes = 0;
  std::shared_ptr<const void> owner;
};

struct PlanSpec {
  std::vector<TensorSpec> tensors;
  std::vector<ConstBuffer> constants;
  std::vector<int> inputs;   // graph inputs (arena tensors), in order
  std::vector<int> outputs;  // graph outputs
  std::vector<StepSpec> steps;
  int64_t arena_bytes = 0;
  int64_t scratch_bytes = 0;
};

// A tensor of the plan with its size checked and its data resolved.
struct Tensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t nbytes = 0;
  Storage storage = Storage::arena;
  int64_t offset = 0;
  void* data = nullptr;
  // 0: laid out as its shape says. Else channels in blocks of this many (NCHWc): image n's
  // channel c at pixel p at ((n * C / block + c / block) * pixels + p) * block + c % block,
  // the same bytes reordered; the executor chooses it (blocked_layouts) where every kernel
  // that touches the tensor reads or writes it so.
  int64_t block = 0;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  float* f32() const { return static_cast<float*>(data); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

// Checks every tensor's dtype, shape, size and placement (inside its area, arena lifetimes
// disjoint) and resolves its data pointer. `arena` and `scratch` are the allocated areas.
std::vector<Tensor> resolve_tensors(const PlanSpec& plan, char* arena, char* scratch);

// Checks that no two arena tensors whose lifetimes (first write .. last read, inputs from the
// start, outputs to the end) overlap in time also overlap in bytes.
void check_arena_lifetimes(const PlanSpec& plan, const std::vector<Tensor>& tensors);

}  // namespace onnxlens
