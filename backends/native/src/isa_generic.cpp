// The hot loops for any CPU: the baseline of the target (SSE2 on x86-64, NEON on aarch64).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "arith.h"
#include "simd.h"

#define ONNXLENS_ISA 0
#define ONNXLENS_ISA_NAME "generic"

namespace onnxlens::generic {
#include "simd_kernels.inc"
}  // namespace onnxlens::generic
