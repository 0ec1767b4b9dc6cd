#include "executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "checked.h"

namespace onnxlens {

// ---- kernel context and registry -------------------------------------------------------------

namespace {

// Tensor ids[i] of the plan; `side` ("input", "output") names it in errors.
const Tensor& nth_tensor(const KernelContext& ctx, const std::vector<int>& ids, int i,
                         const char* side) {
  require(i >= 0 && i < static_cast<int>(ids.size()) && ids[static_cast<size_t>(i)] >= 0,
          ctx.spec.op, ": ", side, " ", i, " is missing");
  const int id = ids[static_cast<size_t>(i)];
  require(id < static_cast<int>(ctx.tensors.size()), ctx.spec.op, ": no tensor #", id);
  return ctx.tensors[static_cast<size_t>(id)];
}

// All values of attribute `name` in `table` (spec.ints or spec.floats); empty if absent.
template <class T>
std::vector<T> values(const std::map<std::string, std::vector<T>>& table,
                      const std::string& name) {
  const auto it = table.find(name);
  return it == table.end() ? std::vector<T>{} : it->second;
}

// The one value of attribute `name`, or `fallback` if absent.
template <class T>
T one_value(const KernelSpec& spec, const std::map<std::string, std::vector<T>>& table,
            const std::string& name, T fallback, const char* kind) {
  const auto it = table.find(name);
  if (it == table.end()) return fallback;
  require(it->second.size() == 1, spec.op, ": attribute ", name, " must be one ", kind);
  return it->second[0];
}

}  // namespace

const Tensor& KernelContext::input(int i) const {
  return nth_tensor(*this, spec.inputs, i, "input");
}

const Tensor& KernelContext::output(int i) const {
  const Tensor& t = nth_tensor(*this, spec.outputs, i, "output");
  require(t.storage != Storage::constant, spec.op, ": writes the constant ", t.name);
  return t;
}

int64_t KernelContext::attr(const std::string& name, int64_t fallback) const {
  return one_value(spec, spec.ints, name, fallback, "integer");
}

std::vector<int64_t> KernelContext::ints(const std::string& name) const {
  return values(spec.ints, name);
}

double KernelContext::attr_f(const std::string& name, double fallback) const {
  return one_value(spec, spec.floats, name, fallback, "number");
}

std::vector<double> KernelContext::floats(const std::string& name) const {
  return values(spec.floats, name);
}

void KernelContext::expect_arity(int min_in, int max_in, int outs) const {
  require(inputs() >= min_in && inputs() <= max_in, spec.op, ": ", inputs(),
          " inputs, expected ", min_in, "..", max_in);
  require(static_cast<int>(spec.outputs.size()) == outs, spec.op, ": ", spec.outputs.size(),
          " outputs, expected ", outs);
  for (int i = 0; i < min_in; ++i) input(i);
  for (int i = 0; i < outs; ++i) output(i);
}

void KernelContext::expect_f32_io() const {
  for (int i = 0; i < inputs(); ++i) {
    if (has_input(i)) {
      require(input(i).dtype == DType::f32, spec.op, ": input ", input(i).name, " is ",
              dtype_name(input(i).dtype), ", only float32 is supported");
    }
  }
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    const Tensor& t = output(static_cast<int>(i));
    require(t.dtype == DType::f32, spec.op, ": output ", t.name, " is ", dtype_name(t.dtype),
            ", only float32 is supported");
  }
}

void add_kernel(KernelRegistry& r, const std::string& op, KernelFactory f,
                BlockedIoRule blocked_io) {
  require(r.emplace(op, KernelEntry{std::move(f), blocked_io}).second, "kernel ", op,
          " registered twice");
}

const KernelRegistry& kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_conv(r);
    register_matmul(r);
    register_pool(r);
    register_norm(r);
    register_rms_norm(r);
    register_attention(r);
    register_nbits(r);
    register_moe(r);
    register_reduce(r);
    register_data(r);
    register_misc(r);
    register_elementwise(r);
    return r;
  }();
  return registry;
}

void Workspace::reserve(int threads, int64_t floats_per_thread) {
  stride_ = (floats_per_thread + 15) / 16 * 16;  // 64-byte rows from a 64-byte base
  storage_.assign(static_cast<size_t>(checked_mul(stride_, threads)), 0.0f);
  base_ = storage_.data();
}

// ---- executor ------------------------------------------------------------------------------

namespace {

HugeVector<char> allocate(int64_t bytes) {
  return HugeVector<char>(static_cast<size_t>(bytes > 0 ? bytes : 1));
}

const SimdKernels* pick(const std::string& isa) {
  if (isa.empty()) return &simd();
  const SimdKernels* t = simd_named(isa.c_str());
  require(t != nullptr, "instruction set ", isa, " is not available on this CPU or build");
  return t;
}

// Which tensors live channel-blocked (Tensor::block): those a Conv writes blocked whose every
// reader reads them so (BlockedIo: a Conv's input 0, a residual or an elementwise operand laid
// out as the output it is tied to). Graph inputs and outputs, tensors sharing bytes (an alias
// and its root) and tensors touched any other way keep their shape's layout; ruling one out
// can rule out those tied to it, so the rules run until nothing changes. A convolution that
// hands its layout to the next saves a pass over its output and the next one over its input,
// which is what ONNX Runtime's NCHWc transformer saves too.
std::vector<int64_t> blocked_layouts(const PlanSpec& plan, const std::vector<Tensor>& tensors,
                                     const SimdKernels& simd, int threads) {
  std::vector<int64_t> block(tensors.size(), 0);
  if (simd.conv_lanes == 0) return block;
  struct Use {
    const KernelSpec* spec;
    BlockedIo io;
  };
  std::vector<Use> uses;
  std::vector<char> on(tensors.size(), 0);
  const KernelRegistry& registry = kernel_registry();
  for (const StepSpec& step : plan.steps) {
    for (const KernelSpec& k : step.kernels) {
      const auto it = registry.find(k.op);
      BlockedIo io;
      if (it != registry.end() && it->second.blocked_io != nullptr) {
        try {
          io = it->second.blocked_io(KernelContext(k, tensors, simd, threads));
        } catch (const PlanError&) {
          // Nothing blocked; the kernel's constructor says what is wrong, naming the step.
        }
      }
      uses.push_back({&k, std::move(io)});
      if (uses.back().io.writes) on[static_cast<size_t>(k.outputs[0])] = 1;
    }
  }
  bool changed = false;
  auto off = [&](int id) {
    if (id >= 0 && on[static_cast<size_t>(id)]) {
      on[static_cast<size_t>(id)] = 0;
      changed = true;
    }
  };
  for (int id : plan.inputs) off(id);
  for (int id : plan.outputs) off(id);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (plan.tensors[i].alias >= 0) {
      off(static_cast<int>(i));
      off(plan.tensors[i].alias);
    }
  }
  do {
    changed = false;
    for (const Use& u : uses) {
      const KernelSpec& k = *u.spec;
      for (size_t i = 0; i < k.inputs.size(); ++i) {
        if (i != 0 || !u.io.reads) off(k.inputs[i]);
      }
      for (size_t i = 0; i < k.outputs.size(); ++i) {
        if (i != 0 || !u.io.writes) off(k.outputs[i]);
      }
      const bool reads = u.io.reads && on[static_cast<size_t>(k.inputs[0])];
      const bool writes = u.io.writes && on[static_cast<size_t>(k.outputs[0])];
      if (writes && !reads && !u.io.from_planar) off(k.outputs[0]);
      if (reads && !writes && !u.io.to_planar) off(k.inputs[0]);
      auto tied = [&](int id) {
        return std::find(u.io.tied.begin(), u.io.tied.end(), id) != u.io.tied.end();
      };
      for (const OperandSpec& o : k.operands) {
        if (!writes || !tied(o.tensor)) off(o.tensor);
      }
      for (int id : u.io.tied) {
        if (on[static_cast<size_t>(id)] != writes) {
          off(id);
          off(k.outputs[0]);
        }
      }
    }
  } while (changed);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (on[i]) block[i] = simd.conv_lanes;
  }
  return block;
}

// A blocked tensor's floats in the layout of its shape (a capture sees what a plain run holds).
void unblock(const SimdKernels& s, const Tensor& t, void* dst) {
  const int64_t lanes = t.block, planes = t.dim(0) * t.dim(1);
  if (planes == 0) return;
  const int64_t pixels = t.numel / planes;
  for (int64_t nb = 0; nb < planes / lanes; ++nb) {
    s.transpose(t.f32() + nb * pixels * lanes, lanes, pixels, lanes,
                static_cast<float*>(dst) + nb * lanes * pixels, pixels);
  }
}

}  // namespace

Executor::Executor(PlanSpec plan, int threads, const std::string& isa)
    : plan_(std::move(plan)), simd_(pick(isa)), pool_(threads) {
  require(threads >= 1 && threads <= 1024, "thread count ", threads);
  tensors_ = resolve_tensors(plan_, nullptr, nullptr);  // sizes checked before allocating
  arena_ = allocate(plan_.arena_bytes);
  scratch_ = allocate(plan_.scratch_bytes);
  tensors_ = resolve_tensors(plan_, arena_.data(), scratch_.data());
  check_arena_lifetimes(plan_, tensors_);
  const std::vector<int64_t> block = blocked_layouts(plan_, tensors_, *simd_, pool_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].block = block[i];
  const KernelRegistry& registry = kernel_registry();
  for (const StepSpec& step : plan_.steps) {
    std::vector<std::unique_ptr<Kernel>> kernels;
    for (const KernelSpec& spec : step.kernels) {
      const auto it = registry.find(spec.op);
      require(it != registry.end(), "step ", step.name, ": no kernel for ", spec.op);
      try {
        kernels.push_back(
            it->second.make(KernelContext(spec, tensors_, *simd_, pool_.size())));
      } catch (const PlanError& e) {
        throw PlanError(cat("step ", step.name, ": ", e.what()));
      }
      workspace_floats_ = std::max(workspace_floats_, kernels.back()->workspace_floats());
    }
    steps_.push_back(std::move(kernels));
  }
  workspace_.reserve(pool_.size(), workspace_floats_);
}

std::vector<int> Executor::producer_steps() const {
  std::vector<int> step_of(tensors_.size(), -1);
  for (size_t s = 0; s < plan_.steps.size(); ++s) {
    for (const KernelSpec& k : plan_.steps[s].kernels) {
      for (int id : k.outputs) step_of[static_cast<size_t>(id)] = static_cast<int>(s);
    }
  }
  return step_of;
}

void Executor::run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                   std::vector<double>& step_seconds, const std::vector<Capture>& captures) {
  if (inputs.size() != plan_.inputs.size() || outputs.size() != plan_.outputs.size()) {
    throw RunError(cat("expected ", plan_.inputs.size(), " inputs and ", plan_.outputs.size(),
                       " outputs"));
  }
  pool_.wake();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = tensors_[static_cast<size_t>(plan_.inputs[i])];
    std::memcpy(t.data, inputs[i], static_cast<size_t>(t.nbytes));
  }
  step_seconds.assign(steps_.size(), 0.0);
  size_t next_capture = 0;
  using clock = std::chrono::steady_clock;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const auto start = clock::now();
    for (auto& k : steps_[s]) k->run(pool_, workspace_);
    step_seconds[s] = std::chrono::duration<double>(clock::now() - start).count();
    for (; next_capture < captures.size() &&
           captures[next_capture].step == static_cast<int>(s); ++next_capture) {
      const Tensor& t = tensors_[static_cast<size_t>(captures[next_capture].tensor)];
      if (t.block != 0) {
        unblock(*simd_, t, captures[next_capture].dst);
      } else {
        std::memcpy(captures[next_capture].dst, t.data, static_cast<size_t>(t.nbytes));
      }
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = tensors_[static_cast<size_t>(plan_.outputs[i])];
    std::memcpy(outputs[i], t.data, static_cast<size_t>(t.nbytes));
  }
}

}  // namespace onnxlens
