// Tiled SGEMM, C = A B then the fused epilogue, for MatMul, Gemm and Conv (implicit GEMM).
//
// A block computes a 64 x 64 tile of C with 16 x 16 threads, each a 4 x 4 micro-tile whose rows
// and columns are 16 apart (so that a warp reads consecutive shared-memory words). K is walked
// 16 at a time in two phases: load the A and B tiles into shared memory (zeros past the edges),
// barrier, multiply-accumulate from shared memory, barrier. Conv reads B from the input image:
// row k of B is (channel, ky, kx) of the group, column j an output pixel of one image, and a
// pixel in the padding reads 0 (im2col without the buffer). blockIdx.z walks batches (MatMul)
// or groups (Conv).
#pragma once

#include <cstdint>

#include "ew.h"
#include "launch.h"

namespace onnxlens::cuda {

// The convolution seen as B: x is [N, C, H, W]; group z reads channels z * cg ...
struct ConvB {
  const float* x;
  int64_t C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, cg;
};

struct GemmArgs {
  int64_t M, N, K;
  int batch;       // blockIdx.z: batches or groups
  const float* a;  // A(i, k) = a[z * a_zs + i * a_rs + k * a_cs]
  int64_t a_rs, a_cs, a_zs;
  const float* b;  // B(k, j) = b[z * b_zs + k * b_rs + j * b_cs], unless implicit
  int64_t b_rs, b_cs, b_zs;
  bool implicit;   // B from conv, not b
  ConvB conv;
  // C(i, j) = c[z * c_zs + i * c_rs + (j / c_split) * c_split_s + j % c_split]: the flat index
  // into the output tensor, which is also where the epilogue reads its operands.
  float* c;
  int64_t c_rs, c_zs, c_split, c_split_s;
  EwProgramDev epilogue;
};

ONNXLENS_HD float gemm_b(const GemmArgs& g, int z, int64_t k, int64_t j) {
  if (!g.implicit) return g.b[z * g.b_zs + k * g.b_rs + j * g.b_cs];
  const ConvB& v = g.conv;
  const int64_t kpos = v.kh * v.kw, ohw = v.OH * v.OW;
  const int64_t c = k / kpos, ky = k % kpos / v.kw, kx = k % v.kw;
  const int64_t img = j / ohw, p = j % ohw;
  const int64_t iy = p / v.OW * v.sh - v.pt + ky * v.dh;
  const int64_t ix = p % v.OW * v.sw - v.pl + kx * v.dw;
  if (iy < 0 || iy >= v.H || ix < 0 || ix >= v.W) return 0.0f;
  return v.x[((img * v.C + z * v.cg + c) * v.H + iy) * v.W + ix];
}

// Where C(i, j) of batch z lives (see GemmArgs::c).
ONNXLENS_HD int64_t gemm_c_index(const GemmArgs& g, int z, int64_t i, int64_t j) {
  return z * g.c_zs + i * g.c_rs + j / g.c_split * g.c_split_s + j % g.c_split;
}

struct GemmKernel {
  static constexpr int kTile = 64, kDepth = 16, kSide = 16, kMicro = kTile / kSide;
  static constexpr int kThreads = kSide * kSide;
  using Args = GemmArgs;
  struct Shared {
    float a[kDepth][kTile];  // A tile, k-major
    float b[kDepth][kTile];
  };
  struct Regs {
    float acc[kMicro][kMicro];
  };

  static Dim3 grid(const Args& g) {
    return Dim3{static_cast<int>((g.N + kTile - 1) / kTile),
                static_cast<int>((g.M + kTile - 1) / kTile), g.batch};
  }
  static Dim3 block(const Args&) { return Dim3{kSide, kSide, 1}; }
  ONNXLENS_HD static int phases(const Args& g) {
    return 2 * static_cast<int>((g.K + kDepth - 1) / kDepth);
  }

  // Even phases load the tiles of depth step p / 2, odd phases multiply them.
  ONNXLENS_HD static void phase(const Args& g, const Thread& t, int p, Shared& s, Regs& r) {
    const int64_t k0 = static_cast<int64_t>(p / 2) * kDepth;
    if (p % 2 == 0) {
      load(g, t, k0, s);
    } else {
      multiply(t, s, r);
    }
  }

  // Each thread loads 4 elements of each tile: of A along k (rows of a row-major A are
  // contiguous), of B along j (consecutive pixels / columns).
  ONNXLENS_HD static void load(const Args& g, const Thread& t, int64_t k0, Shared& s) {
    const int64_t i0 = static_cast<int64_t>(t.block.y) * kTile;
    const int64_t j0 = static_cast<int64_t>(t.block.x) * kTile;
    const int z = t.block.z;
    for (int q = 0; q < kTile * kDepth / kThreads; ++q) {
      const int e = t.tid() + q * kThreads;
      const int ak = e % kDepth, ai = e / kDepth;
      const int64_t i = i0 + ai, ka = k0 + ak;
      s.a[ak][ai] = i < g.M && ka < g.K ? g.a[z * g.a_zs + i * g.a_rs + ka * g.a_cs] : 0.0f;
      const int bj = e % kTile, bk = e / kTile;
      const int64_t j = j0 + bj, kb = k0 + bk;
      s.b[bk][bj] = j < g.N && kb < g.K ? gemm_b(g, z, kb, j) : 0.0f;
    }
  }

  ONNXLENS_HD static void multiply(const Thread& t, const Shared& s, Regs& r) {
    for (int k = 0; k < kDepth; ++k) {
      float a[kMicro], b[kMicro];
      for (int u = 0; u < kMicro; ++u) {
        a[u] = s.a[k][t.thread.y + u * kSide];
        b[u] = s.b[k][t.thread.x + u * kSide];
      }
      for (int u = 0; u < kMicro; ++u) {
        for (int v = 0; v < kMicro; ++v) r.acc[u][v] = fmaf(a[u], b[v], r.acc[u][v]);
      }
    }
  }

  ONNXLENS_HD static void finish(const Args& g, const Thread& t, Shared&, Regs& r) {
    const int z = t.block.z;
    for (int u = 0; u < kMicro; ++u) {
      const int64_t i = static_cast<int64_t>(t.block.y) * kTile + t.thread.y + u * kSide;
      for (int v = 0; v < kMicro; ++v) {
        const int64_t j = static_cast<int64_t>(t.block.x) * kTile + t.thread.x + v * kSide;
        if (i >= g.M || j >= g.N) continue;
        const int64_t at = gemm_c_index(g, z, i, j);
        g.c[at] = ew_eval(g.epilogue, at, r.acc[u][v]);
      }
    }
  }
};

// The same product without tiles, one thread per element of C: for few rows (a depthwise
// convolution has one per group, a GEMV one), where a 64-row tile would idle most threads.
struct DirectGemmArgs {
  GemmArgs g;
};

struct DirectGemmKernel {
  static constexpr int kThreads = 256;
  using Args = DirectGemmArgs;
  struct Shared {};
  struct Regs {};

  static int64_t items(const Args& a) { return a.g.batch * a.g.M * a.g.N; }
  static Dim3 grid(const Args& a) { return cover(items(a), kThreads); }
  static Dim3 block(const Args&) { return Dim3{kThreads, 1, 1}; }
  ONNXLENS_HD static int phases(const Args&) { return 0; }
  ONNXLENS_HD static void phase(const Args&, const Thread&, int, Shared&, Regs&) {}
  ONNXLENS_HD static void finish(const Args& a, const Thread& t, Shared&, Regs&) {
    const GemmArgs& g = a.g;
    const int64_t e = t.global_x();
    if (e >= g.batch * g.M * g.N) return;
    const int64_t j = e % g.N, i = e / g.N % g.M;
    const int z = static_cast<int>(e / (g.N * g.M));
    const float* arow = g.a + z * g.a_zs + i * g.a_rs;
    float acc = 0.0f;
    for (int64_t k = 0; k < g.K; ++k) acc = fmaf(arow[k * g.a_cs], gemm_b(g, z, k, j), acc);
    const int64_t at = gemm_c_index(g, z, i, j);
    g.c[at] = ew_eval(g.epilogue, at, acc);
  }
};

}  // namespace onnxlens::cuda
