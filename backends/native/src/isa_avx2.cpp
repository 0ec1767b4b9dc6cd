// The hot loops for x86-64 with AVX2 and FMA (Haswell and later, Zen).
#define ONNXLENS_ISA 2
#define ONNXLENS_ISA_NAME "avx2"
#define ONNXLENS_ISA_NS avx2
#define ONNXLENS_ISA_TARGET "avx2,fma,f16c"
#include "isa_x86.inc"
