// Which SIMD table this CPU runs: the widest it supports, or ONNXLENS_NATIVE_ISA if set (and
// supported), so that the tests can drive every path on one machine.
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "simd.h"

namespace onnxlens {

const SimdKernels* simd_named(const char* name) {
#if defined(ONNXLENS_X86)
  __builtin_cpu_init();
  if (std::strcmp(name, "avx512") == 0) {
    const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("bmi2");
    return ok ? avx512::table() : nullptr;
  }
  if (std::strcmp(name, "avx2") == 0) {
    const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return ok ? avx2::table() : nullptr;
  }
#endif
  return std::strcmp(name, "generic") == 0 ? generic::table() : nullptr;
}

static const SimdKernels* select() {
  if (const char* wanted = std::getenv("ONNXLENS_NATIVE_ISA")) {
    if (const SimdKernels* t = simd_named(wanted)) return t;
  }
  for (const char* name : {"avx512", "avx2"}) {
    if (const SimdKernels* t = simd_named(name)) return t;
  }
  return generic::table();
}

const SimdKernels& simd() {
  static const SimdKernels* chosen = select();
  return *chosen;
}

}  // namespace onnxlens
