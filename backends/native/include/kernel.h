// A kernel: built once from its spec (validated, weights packed), then run many times.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checked.h"
#include "huge_pages.h"
#include "plan.h"
#include "simd.h"
#include "threadpool.h"

namespace onnxlens {

// Per-thread scratch memory for kernels (packing buffers, register chunks), 64-byte aligned.
class Workspace {
 public:
  void reserve(int threads, int64_t floats_per_thread);
  float* get(int tid) const { return base_ + static_cast<int64_t>(tid) * stride_; }

 private:
  HugeVector<float> storage_;  // 64-byte aligned (huge_pages.h)
  float* base_ = nullptr;       // storage_'s, writable through a const Workspace
  int64_t stride_ = 0;
};

// What a kernel factory sees: its spec, the plan's tensors and the chosen SIMD table.
class KernelContext {
 public:
  KernelContext(const KernelSpec& spec, const std::vector<Tensor>& tensors,
                const SimdKernels& simd, int threads)
      : spec(spec), tensors(tensors), simd(simd), threads(threads) {}

  const KernelSpec& spec;
  const std::vector<Tensor>& tensors;
  const SimdKernels& simd;
  int threads;

  int inputs() const { return static_cast<int>(spec.inputs.size()); }
  bool has_input(int i) const { return i < inputs() && spec.inputs[i] >= 0; }
  const Tensor& input(int i) const;
  const Tensor& output(int i) const;
  int64_t attr(const std::string& name, int64_t fallback) const;
  std::vector<int64_t> ints(const std::string& name) const;  // empty if absent
  double attr_f(const std::string& name, double fallback) const;
  std::vector<double> floats(const std::string& name) const;

  // Requires exactly these input/output counts (inputs: a range, for optional ones).
  void expect_arity(int min_in, int max_in, int outs) const;
  // Requires the dtype of every listed tensor (input index >= 0, output -1 - index).
  void expect_f32_io() const;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(ThreadPool& pool, const Workspace& ws) = 0;
  virtual int64_t workspace_floats() const { return 0; }  // per thread
};

// The common front of kernels that read input 0 and write output 0, all float32: checks
// min_in..max_in inputs, `outs` outputs and the dtypes before the tensors are bound.
class XyKernel : public Kernel {
 protected:
  XyKernel(const KernelContext& ctx, int min_in, int max_in, int outs = 1)
      : simd_(ctx.simd), x_(checked(ctx, min_in, max_in, outs).input(0)), y_(ctx.output(0)) {}

  const SimdKernels& simd_;
  const Tensor& x_;
  const Tensor& y_;

 private:
  static const KernelContext& checked(const KernelContext& ctx, int min_in, int max_in,
                                      int outs) {
    ctx.expect_arity(min_in, max_in, outs);
    ctx.expect_f32_io();
    return ctx;
  }
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const KernelContext&)>;

// A factory building K(ctx, args...), the args copied into it.
template <class K, class... Args>
KernelFactory make_kernel(Args... args) {
  return [args...](const KernelContext& ctx) -> std::unique_ptr<Kernel> {
    return std::make_unique<K>(ctx, args...);
  };
}

// A kernel's own hot loop compiled for an instruction set (x86-64 with GCC or Clang; elsewhere
// the attribute is empty and every build is the generic one).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ONNXLENS_TARGET(isa) __attribute__((target(isa)))
#else
#define ONNXLENS_TARGET(isa)
#endif

// A hot loop `Body` (an always_inline function) built three times, inlined into a function
// compiled for each instruction set.
template <class Fn>
struct IsaBuilds;
template <class R, class... A>
struct IsaBuilds<R (*)(A...)> {
  template <R (*Body)(A...)>
  static R generic(A... a) { return Body(a...); }
  template <R (*Body)(A...)>
  ONNXLENS_TARGET("avx2,fma") static R avx2(A... a) { return Body(a...); }
  template <R (*Body)(A...)>
  ONNXLENS_TARGET("avx512f,avx512bw,avx512vl,avx512dq,fma") static R avx512(A... a) {
    return Body(a...);
  }
};

// Of `Body`'s three builds (IsaBuilds), the one for the SIMD table's instruction set: the
// choice ONNXLENS_NATIVE_ISA makes for simd_kernels.inc.
template <auto Body>
decltype(Body) isa_build(const SimdKernels& simd) {
  using Builds = IsaBuilds<decltype(Body)>;
  if (&simd == simd_named("avx512")) return &Builds::template avx512<Body>;
  if (&simd == simd_named("avx2")) return &Builds::template avx2<Body>;
  return &Builds::template generic<Body>;
}

// Σ a[i]·b[i] in sixteen independent sums (one vector of AVX-512, two of AVX2), which the
// compiler keeps in flight without reassociating one chain: inlined into a hot loop built per
// instruction set (isa_build), a dot product of a head or a weight row.
__attribute__((always_inline)) inline float dot16(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// Calls f(T{}) with T the unsigned integer of `size` bytes (1, 2, 4, else 8): kernels that
// move elements as bits of their width, whatever their type (Where, GatherElements, strided
// copies).
template <typename F>
void with_width(int64_t size, F f) {
  switch (size) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

// What a kernel can do with channel-blocked tensors (Tensor::block, in blocks of the SIMD
// table's conv_lanes): read its input 0 so, write its output 0 so, the operands in `tied`
// (tensor ids: a residual, an elementwise kernel's operands) then laid out the same; and
// whether it does either with the other tensor planar: a blocked output from a planar input
// (`from_planar`), a planar output from a blocked input (`to_planar`).
struct BlockedIo {
  bool reads = false, writes = false, from_planar = false, to_planar = false;
  std::vector<int> tied;
};
// An op's BlockedIo for one spec (it may throw PlanError where the kernel would refuse it).
using BlockedIoRule = BlockedIo (*)(const KernelContext& ctx);

// Whether t can live channel-blocked: 4-D float32 with whole blocks of `lanes` channels.
inline bool whole_channel_blocks(const Tensor& t, int64_t lanes) {
  return t.rank() == 4 && t.dtype == DType::f32 && t.dim(1) % lanes == 0;
}

// An op's kernel factory and, for kernels that run on blocked tensors (Conv, Elementwise,
// MaxPool), its BlockedIoRule (null: the op touches only tensors laid out as their shapes).
struct KernelEntry {
  KernelFactory make;
  BlockedIoRule blocked_io = nullptr;
};
using KernelRegistry = std::map<std::string, KernelEntry>;

// Each kernel family adds its ops; registering an op twice is an error.
void add_kernel(KernelRegistry& r, const std::string& op, KernelFactory f,
                BlockedIoRule blocked_io = nullptr);
void register_conv(KernelRegistry& r);
void register_matmul(KernelRegistry& r);
void register_pool(KernelRegistry& r);
void register_norm(KernelRegistry& r);
void register_rms_norm(KernelRegistry& r);
void register_attention(KernelRegistry& r);
void register_nbits(KernelRegistry& r);
void register_moe(KernelRegistry& r);
void register_reduce(KernelRegistry& r);
void register_data(KernelRegistry& r);
void register_misc(KernelRegistry& r);
void register_elementwise(KernelRegistry& r);
const KernelRegistry& kernel_registry();

}  // namespace onnxlens
