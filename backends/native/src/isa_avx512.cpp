// The hot loops for x86-64 with AVX-512 F/VL/BW/DQ (Skylake-SP and later, Zen 4), compiled with a function-level
// target pragma; chosen at run time only when the CPU has these features (cpu_select.cpp).
#include "simd.h"

#if defined(ONNXLENS_X86)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "arith.h"

#define ONNXLENS_ISA 3
#define ONNXLENS_ISA_NAME "avx512"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,bmi2")
#endif

namespace onnxlens::avx512 {
#include "simd_kernels.inc"
}  // namespace onnxlens::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // ONNXLENS_X86
