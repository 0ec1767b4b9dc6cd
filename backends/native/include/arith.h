// Scalar arithmetic shared by the CPU kernels and (later) the CUDA kernels.
//
// Each function is `ONNXLENS_HD`: `__host__ __device__` under nvcc, plain inline elsewhere, so a
// CUDA kernel and the CPU harness that emulates it run the very same arithmetic. The functions
// are branch-free where the CPU loops need them vectorized (a ternary becomes a blend).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ONNXLENS_HD __host__ __device__ inline
#else
#define ONNXLENS_HD inline
#endif

namespace onnxlens::arith {

// max / min as a compare and select: fmaxf/fminf must treat NaN specially, so compilers call
// libm for them instead of emitting one vector instruction.
ONNXLENS_HD float max(float a, float b) { return a > b ? a : b; }
ONNXLENS_HD float min(float a, float b) { return a < b ? a : b; }

ONNXLENS_HD float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// exp(x) to about 1 ulp: x = n ln2 + r (Cody-Waite), a degree-6 polynomial for e^r, 2^n by
// building the exponent. Inputs are clamped to the float range first, so no branch is needed.
ONNXLENS_HD float exp(float x) {
  x = min(max(x, -87.33654f), 88.72283f);
  const float n = rintf(x * 1.44269504088896341f);
  float r = fmaf(n, -0.693359375f, x);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p * r, r, r) + 1.0f;
  // 2^n split in two halves so that n = 128 (x near the top of the range) still works.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t h = ni / 2;
  return p * bits_to_float((h + 127) << 23) * bits_to_float((ni - h + 127) << 23);
}

ONNXLENS_HD float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

// tanh from exp away from 0; the odd series near 0, where 1 - 2/(e^2x + 1) loses digits.
ONNXLENS_HD float tanh(float x) {
  const float ax = fabsf(x);
  const float e = exp(-2.0f * ax);
  const float big = (1.0f - e) / (1.0f + e);
  const float x2 = x * x;
  const float small = ax * fmaf(x2, fmaf(x2, fmaf(x2, -17.0f / 315.0f, 2.0f / 15.0f), -1.0f / 3.0f), 1.0f);
  return copysignf(ax < 0.0625f ? small : big, x);
}

// erf as a rational function on [-4, 4] (beyond, erf is +-1 in float): Eigen's / XLA's
// approximation, a few ulp.
ONNXLENS_HD float erf(float x) {
  x = min(max(x, -4.0f), 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = fmaf(p, x2, 2.77068142495902e-08f);
  p = fmaf(p, x2, -2.10102402082508e-06f);
  p = fmaf(p, x2, -5.69250639462346e-05f);
  p = fmaf(p, x2, -7.34990630326855e-04f);
  p = fmaf(p, x2, -2.95459980854025e-03f);
  p = fmaf(p, x2, -1.60960333262415e-02f);
  float q = -1.45660718464996e-05f;
  q = fmaf(q, x2, -2.13374055278905e-04f);
  q = fmaf(q, x2, -1.68282697438203e-03f);
  q = fmaf(q, x2, -7.37332916720468e-03f);
  q = fmaf(q, x2, -1.42647390514189e-02f);
  return x * p / q;
}

ONNXLENS_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }
ONNXLENS_HD float clip(float x, float lo, float hi) { return min(max(x, lo), hi); }
ONNXLENS_HD float hard_sigmoid(float x, float alpha, float beta) {
  return min(max(fmaf(alpha, x, beta), 0.0f), 1.0f);
}
ONNXLENS_HD float hard_swish(float x) { return x * hard_sigmoid(x, 1.0f / 6.0f, 0.5f); }
ONNXLENS_HD float silu(float x) { return x * sigmoid(x); }
ONNXLENS_HD float gelu(float x) { return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)); }
ONNXLENS_HD float gelu_tanh(float x) {
  const float inner = 0.79788456080286536f * fmaf(0.044715f * x * x, x, x);
  return 0.5f * x * (1.0f + tanh(inner));
}
ONNXLENS_HD float leaky_relu(float x, float alpha) { return x < 0.0f ? alpha * x : x; }
ONNXLENS_HD float elu(float x, float alpha) { return x < 0.0f ? alpha * (exp(x) - 1.0f) : x; }
ONNXLENS_HD float selu(float x, float alpha, float gamma) {
  return gamma * (x <= 0.0f ? alpha * (exp(x) - 1.0f) : x);
}
ONNXLENS_HD float celu(float x, float alpha) {
  return max(x, 0.0f) + min(0.0f, alpha * (exp(x / alpha) - 1.0f));
}
ONNXLENS_HD float softplus(float x) {
  // log(1 + e^x) = max(x, 0) + log1p(e^-|x|)
  return max(x, 0.0f) + log1pf(exp(-fabsf(x)));
}
ONNXLENS_HD float softsign(float x) { return x / (1.0f + fabsf(x)); }
ONNXLENS_HD float mish(float x) { return x * tanh(softplus(x)); }
ONNXLENS_HD float sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }
ONNXLENS_HD float thresholded_relu(float x, float alpha) { return x > alpha ? x : 0.0f; }
ONNXLENS_HD float shrink(float x, float bias, float lambd) {
  return x < -lambd ? x + bias : (x > lambd ? x - bias : 0.0f);
}
// ONNX Pow: exact squares, cubes and roots where exporters use them.
ONNXLENS_HD float pow(float x, float y) {
  if (y == 2.0f) return x * x;
  if (y == 3.0f) return x * x * x;
  if (y == 0.5f) return sqrtf(x);
  if (y == 1.0f) return x;
  return powf(x, y);
}
// ONNX Mod of floats (fmod=1 is required for them): the sign of the dividend, like C fmod.
ONNXLENS_HD float mod(float a, float b) { return fmodf(a, b); }

}  // namespace onnxlens::arith
