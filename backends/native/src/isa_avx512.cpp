// The hot loops for x86-64 with AVX-512 F/VL/BW/DQ (Skylake-SP and later, Zen 4).
#define ONNXLENS_ISA 3
#define ONNXLENS_ISA_NAME "avx512"
#define ONNXLENS_ISA_NS avx512
#define ONNXLENS_ISA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,bmi2"
#include "isa_x86.inc"
