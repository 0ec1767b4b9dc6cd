// onnxlens.backends._native_cuda_emu: the CUDA kernels run by the CPU emulator (emulate.h), for
// the tests. Plain C++: it builds wherever the native executor builds, GPU or not. The kernel
// functions write into the caller's `y` (float32, C order, of the output's shape); `reverse` runs
// each phase's threads in the opposite order (a race shows as a different result). Executor runs
// whole plans through the CUDA executor's host side (lower.h, gpu_executor.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "args.h"
#include "checked.h"
#include "emulate.h"
#include "executor_binding.h"
#include "lower.h"

namespace nb = nanobind;
using namespace onnxlens;
using namespace onnxlens::cuda;

namespace {

using In = nb::ndarray<const float, nb::ro, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using py::InstrT;
using Ints = std::vector<int64_t>;

template <class Array>
Ints shape_of(const Array& a) {
  Ints s;
  for (size_t d = 0; d < a.ndim(); ++d) s.push_back(static_cast<int64_t>(a.shape(d)));
  return s;
}

EwProgramDev program(const std::vector<InstrT>& code, const std::vector<In>& operands,
                     const Ints& out_shape) {
  std::vector<InstrSpec> specs;
  for (const auto& [op, dst, srcs, params] : code) specs.push_back({op, dst, srcs, params});
  std::vector<EwOperandIn> ins;
  for (const In& o : operands) ins.push_back({o.data(), shape_of(o)});
  return ew_program(specs, ins, out_shape);
}

// Window2d of a 2-D window (a 1-D one is given with H = kh = 1).
Window2d window(const Ints& x_shape, const Ints& kernel, const Ints& strides, const Ints& pads,
                const Ints& dilations, const Ints& out_hw) {
  require(x_shape.size() == 4 && kernel.size() == 2 && strides.size() == 2 && pads.size() == 4 &&
              dilations.size() == 2 && out_hw.size() == 2,
          "window: x is [N, C, H, W], the rest 2-D (pads: top, left, bottom, right)");
  return Window2d{x_shape[0], x_shape[1], x_shape[2], x_shape[3], out_hw[0],  out_hw[1],
                  kernel[0],  kernel[1],  strides[0], strides[1], dilations[0], dilations[1],
                  pads[0],    pads[1],    pads[2],    pads[3]};
}

// A product on the tiled or the direct kernel ("" chooses as the executor does).
void run_product(const GemmArgs& g, const std::string& kernel, bool reverse) {
  std::visit([&](const auto& a) {
    emulate<typename KernelOf<std::decay_t<decltype(a)>>::type>(a, reverse);
  }, gemm_launch(g, kernel));
}

void matmul(const In& a, const In& b, Out& y, bool trans_a, bool trans_b,
            const std::vector<InstrT>& code, const std::vector<In>& operands,
            const std::string& kernel, bool reverse) {
  require(a.ndim() == 3 && b.ndim() == 3 && y.ndim() == 3, "matmul: 3-D arrays");
  const Ints as = shape_of(a), bs = shape_of(b), ys = shape_of(y);
  const int64_t M = trans_a ? as[2] : as[1], K = trans_a ? as[1] : as[2];
  const int64_t N = trans_b ? bs[1] : bs[2];
  require((trans_b ? bs[2] : bs[1]) == K && ys == Ints{ys[0], M, N}, "matmul: shapes");
  run_product(matmul_args(a.data(), b.data(), y.data(), M, N, K, ys[0], as[0] > 1, bs[0] > 1,
                          trans_a, trans_b, program(code, operands, ys)),
              kernel, reverse);
}

void conv(const In& x, const In& w, Out& y, const Ints& strides, const Ints& pads,
          const Ints& dilations, int64_t group, const std::vector<InstrT>& code,
          const std::vector<In>& operands, const std::string& kernel, bool reverse) {
  const Ints ws = shape_of(w), ys = shape_of(y);
  require(ws.size() == 4 && ys.size() == 4, "conv: 2-D convolutions");
  const Window2d g = window(shape_of(x), {ws[2], ws[3]}, strides, pads, dilations,
                            {ys[2], ys[3]});
  require(ws[1] * group == g.C, "conv: weight channels");
  run_product(
      conv_args(x.data(), w.data(), y.data(), g, ws[0], group, program(code, operands, ys)),
      kernel, reverse);
}

void pool(const In& x, Out& y, bool max, const Ints& kernel, const Ints& strides,
          const Ints& pads, const Ints& dilations, bool include_pad, bool reverse) {
  const Ints ys = shape_of(y);
  require(ys.size() == 4, "pool: 2-D pooling");
  const Window2d g = window(shape_of(x), kernel, strides, pads, dilations, {ys[2], ys[3]});
  emulate<PoolKernel>(pool_args(x.data(), y.data(), g, max, include_pad), reverse);
}

void rows(int op, const In& x, Out& y, int64_t axis, bool flatten,
          const std::optional<In>& scale, const std::optional<In>& bias, float epsilon,
          bool reverse) {
  require(op >= 0 && op <= static_cast<int>(RowOp::Max), "rows: unknown op ", op);
  const RowArgs a = row_args(static_cast<RowOp>(op), x.data(), y.data(), shape_of(x), axis,
                             flatten, scale ? scale->data() : nullptr,
                             bias ? bias->data() : nullptr, epsilon);
  emulate<RowKernel>(a, reverse);
}

void elementwise(Out& y, const std::vector<InstrT>& code, const std::vector<In>& operands,
                 bool reverse) {
  const Ints ys = shape_of(y);
  emulate<EwKernel>(EwKernel::Args{y.data(), checked_product(ys), program(code, operands, ys)},
                    reverse);
}

}  // namespace

NB_MODULE(_native_cuda_emu, m) {
  m.doc() = "The CUDA kernels of backends/native/cuda run by the CPU emulator (for tests)";
  // Executor: whole plans, as _native.Executor runs them; isa "reverse" reverses thread order.
  PyGpuExecutor<EmuDevice>::bind(m, [](int, const std::string& isa) {
    require(isa.empty() || isa == "reverse", "the emulator's isa is \"\" or \"reverse\"");
    EmuDevice d;
    d.set_reverse(isa == "reverse");
    return d;
  });
  m.def("kernel_ops", &cuda_kernel_ops, "The kernel names of a plan the CUDA executor runs");
  m.def("matmul", &matmul, nb::arg("a"), nb::arg("b"), nb::arg("y"), nb::arg("trans_a"),
        nb::arg("trans_b"), nb::arg("program"), nb::arg("operands"), nb::arg("kernel") = "",
        nb::arg("reverse") = false);
  m.def("conv", &conv, nb::arg("x"), nb::arg("w"), nb::arg("y"), nb::arg("strides"),
        nb::arg("pads"), nb::arg("dilations"), nb::arg("group"), nb::arg("program"),
        nb::arg("operands"), nb::arg("kernel") = "", nb::arg("reverse") = false);
  m.def("pool", &pool, nb::arg("x"), nb::arg("y"), nb::arg("max"), nb::arg("kernel"),
        nb::arg("strides"), nb::arg("pads"), nb::arg("dilations"), nb::arg("include_pad"),
        nb::arg("reverse") = false);
  m.def("rows", &rows, nb::arg("op"), nb::arg("x"), nb::arg("y"), nb::arg("axis"),
        nb::arg("flatten"), nb::arg("scale").none(), nb::arg("bias").none(),
        nb::arg("epsilon"), nb::arg("reverse") = false);
  m.def("elementwise", &elementwise, nb::arg("y"), nb::arg("program"), nb::arg("operands"),
        nb::arg("reverse") = false);
  m.attr("ROW_OPS") = nb::make_tuple("Softmax", "LogSoftmax", "LayerNorm", "Mean", "Max");
}
