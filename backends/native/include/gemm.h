// Single-precision GEMM, C = A * B (+ C), with packing, cache blocking and the SIMD table's
// register-blocked micro-kernel (GotoBLAS / BLIS loop order: jc, pc, ic, jr, ir).
//
// A (M x K) is packed once when constant (weights of a Conv) or per block when not; B (K x N)
// likewise (weights of a MatMul), or, an implicit im2col, packed straight from the input image
// or, where its panels read consecutive floats, read from the image in place (ImTaps).
// C's columns may be scattered (col_off): a convolution over a batch puts the images side by
// side as columns. The fused epilogue (an EwProgram) runs on each block of C once its last K
// block is done, while the block is still in cache.
#pragma once

#include <cstdint>
#include <vector>

#include "ewprog.h"
#include "huge_pages.h"
#include "simd.h"

namespace onnxlens {

struct GemmBlocking {
  int64_t mc, kc, nc;
};
GemmBlocking gemm_blocking(const SimdKernels& s);

// A constant operand packed for `s`: A as mr-row panels, or B as nr-column panels, per
// K block of `kc` rows.
struct PackedOperand {
  HugeVector<float> data;
  int64_t rows = 0, cols = 0;  // M x K (A) or K x N (B)
  bool is_a = true;
  int64_t padded = 0;          // M or N rounded up to the panel width
};
// A(i, k) = a[i * rs + k * cs]
PackedOperand pack_a_const(const SimdKernels& s, const float* a, int64_t rs, int64_t cs,
                           int64_t M, int64_t K);
// B(k, j) = b[k * rs + j * cs]
PackedOperand pack_b_const(const SimdKernels& s, const float* b, int64_t rs, int64_t cs,
                           int64_t K, int64_t N);

struct GemmA {
  const PackedOperand* packed = nullptr;  // or strided:
  const float* p = nullptr;
  int64_t rs = 0, cs = 0;
  // Strided A packed whole once per call, into the workspace's first gemm_a_once_floats
  // (where per column block it is packed again for each block of nc columns); ignored when
  // A is read in place (gemm_reads_a_in_place).
  bool pack_once = false;
};

struct GemmB {
  const PackedOperand* packed = nullptr;  // or implicit im2col, or strided:
  const Im2col* im2col = nullptr;
  const float* p = nullptr;
  int64_t rs = 0, cs = 0;
  // A strided B with contiguous rows read in place by the micro-kernel, panel by panel (a
  // partial last panel of a block packed), where it is packed block by block; only when
  // gemm_reads_b_in_place and C's columns are not scattered.
  bool in_place = false;
};

// C(i, j) lives at p[i * ldc + (col_off ? col_off[j] : j)].
struct GemmC {
  float* p = nullptr;
  int64_t ldc = 0;
  const int64_t* col_off = nullptr;
  const EwProgram* epilogue = nullptr;
  const float* out_base = nullptr;  // the output tensor, for the epilogue's flat index
  // The epilogue in the form the micro-kernel applies while storing (then `epilogue` is not
  // run); its per-row values start at row `row0`.
  const FastEpilogue* fast = nullptr;
  int64_t row0 = 0;
};

// Per-thread workspace floats for gemm() with this epilogue, and a_once_floats for GemmA's
// pack_once.
int64_t gemm_workspace_floats(const SimdKernels& s, const EwProgram* epilogue,
                              int64_t a_once_floats = 0);

// Whether gemm()'s tiles over M rows of a packed A may read B in place, unpacked (an implicit
// im2col's flat panels, a strided B's rows): no tile of one row, which the matrix-vector
// kernel runs on packed panels.
bool gemm_rows_read_b_in_place(const SimdKernels& s, int64_t M);

// Whether gemm() reads the whole panels of columns [j0, j0 + n) of an implicit im2col in place
// (their taps straight from the image, C's columns at col_off, or contiguous when null).
bool gemm_reads_panels_in_place(const SimdKernels& s, const Im2col& g, const int64_t* col_off,
                                int64_t M, int64_t j0, int64_t n);

// Whether gemm() reads a strided A (A(i, k) = p[i * rs + k * cs]) in place, unpacked.
bool gemm_reads_a_in_place(int64_t rs, int64_t cs);

// Whether gemm() reads a strided B (B(k, j) = p[k * rs + j * cs]) with in_place set in place.
bool gemm_reads_b_in_place(int64_t rs, int64_t cs);

// The floats a strided M x K A packed once takes, when worth it: when it is not read in
// place, B is wider than one column block (else A is packed once anyway) and A is at most
// kMaxAOnceFloats; else 0.
constexpr int64_t kMaxAOnceFloats = int64_t{1} << 20;  // 4 MiB per thread
int64_t gemm_a_once_floats(const SimdKernels& s, int64_t M, int64_t K, int64_t N, int64_t rs,
                           int64_t cs);

// C[m0:m1, n0:n1] of an M x N x K product. m0 must be a multiple of the micro-tile's rows
// when A is packed, n0 of its columns when B is packed or an im2col.
void gemm(const SimdKernels& s, int64_t M, int64_t N, int64_t K, const GemmA& a,
          const GemmB& b, const GemmC& c, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
          float* workspace);

}  // namespace onnxlens
