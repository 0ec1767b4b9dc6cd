// The hot loops for x86-64 with AVX2 and FMA (Haswell and later, Zen), compiled with a function-level
// target pragma; chosen at run time only when the CPU has these features (cpu_select.cpp).
#include "simd.h"

#if defined(ONNXLENS_X86)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "arith.h"

#define ONNXLENS_ISA 2
#define ONNXLENS_ISA_NAME "avx2"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace onnxlens::avx2 {
#include "simd_kernels.inc"
}  // namespace onnxlens::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // ONNXLENS_X86
