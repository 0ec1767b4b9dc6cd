#include "gemm.h"

#include <algorithm>
#include <cstring>

#include "checked.h"

namespace onnxlens {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Where a K block's panels start in a packed operand, and the panel of row/col `at`.
const float* packed_block(const PackedOperand& p, int64_t pc, int64_t kc, int64_t at,
                          int64_t width) {
  return p.data.data() + p.padded * pc + (at / width) * width * kc;
}

struct Buffers {
  float* a;
  float* b;
  float* tile;
  float* epilogue;
};

Buffers carve(const SimdKernels& s, float* ws) {
  const GemmBlocking bl = gemm_blocking(s);
  Buffers buf;
  buf.a = ws;
  buf.b = buf.a + bl.mc * bl.kc;
  buf.tile = buf.b + bl.kc * bl.nc;
  buf.epilogue = buf.tile + s.mr * s.nr;
  return buf;
}

// Whether C's columns [j, j + n) are contiguous (col_off: C's column offsets, or null).
bool contiguous(const int64_t* col_off, int64_t j, int64_t n) {
  return col_off == nullptr || col_off[j + n - 1] - col_off[j] == n - 1;
}

float* c_at(const GemmC& c, int64_t i, int64_t j) {
  return c.p + i * c.ldc + (c.col_off ? c.col_off[j] : j);
}

inline TileEpilogue tile_epilogue(const GemmC& c, int64_t i, int64_t j) {
  const FastEpilogue& f = *c.fast;
  TileEpilogue e{nullptr, nullptr, nullptr, nullptr, f.lo, f.hi};
  if (!f.row_scale.empty()) {
    e.row_scale = f.row_scale.data() + c.row0 + i;
    e.row_bias = f.row_bias.data() + c.row0 + i;
  }
  if (f.col_bias) e.col_bias = f.col_bias + j;
  if (f.residual) e.residual = f.residual + (c_at(c, i, j) - c.out_base);
  return e;
}

// The micro-kernel over m rows and n columns of a tile: the columns past its whole vectors
// (nr / 2 wide), when they are few, run narrow (gemm_ucols) instead of as a whole vector.
void columns(const SimdKernels& s, int64_t kc, const float* ap, int64_t lda, const float* bp,
             int64_t ldb, float* c, int64_t ldc, bool acc, const TileEpilogue* e, int64_t n,
             int64_t m) {
  const int64_t narrow = n % (s.nr / 2);
  if (narrow == 0 || narrow > kNarrowCols) {
    s.gemm_ukernel(kc, ap, lda, bp, ldb, c, ldc, acc, e, n, m);
    return;
  }
  const int64_t wide = n - narrow;
  if (wide > 0) s.gemm_ukernel(kc, ap, lda, bp, ldb, c, ldc, acc, e, wide, m);
  TileEpilogue shifted{};
  if (e) {
    shifted = *e;
    if (shifted.col_bias) shifted.col_bias += wide;
    if (shifted.residual) shifted.residual += wide;
  }
  s.gemm_ucols(kc, ap, lda, bp + wide, c + wide, ldc, acc, e ? &shifted : nullptr, narrow, m);
}

// One micro-tile at C(i, j) of m x n valid elements, A a packed panel (lda 0) or read in
// place, B a packed panel (ldb nr) or read in place; the last K block also runs a fast
// epilogue.
void tile(const SimdKernels& s, int64_t kc, const float* ap, int64_t lda, const float* bp,
          int64_t ldb, const GemmC& c, int64_t i, int64_t j, int64_t m, int64_t n, bool acc,
          bool last, float* buf) {
  TileEpilogue e{};
  const bool fused = last && c.fast != nullptr;
  if (m > 1) {
    // Straight from the micro-kernel, masked to each run of contiguous columns. A run from
    // column t0 > 0 (the tile crosses from one image to the next) reads B from lane t0 on:
    // its lanes past the run read the next K row, or past the panel into the workspace's
    // tile buffer (B panels with scattered columns are always packed into the workspace),
    // and are not stored.
    for (int64_t t0 = 0; t0 < n;) {
      // the whole rest, usually
      int64_t t1 = contiguous(c.col_off, j + t0, n - t0) ? n : t0 + 1;
      while (t1 < n && contiguous(c.col_off, j + t0, t1 - t0 + 1)) ++t1;
      if (fused) e = tile_epilogue(c, i, j + t0);
      columns(s, kc, ap, lda, bp + t0, ldb, c_at(c, i, j + t0), c.ldc, acc,
              fused ? &e : nullptr, t1 - t0, m);
      t0 = t1;
    }
    return;
  }
  // One row: a matrix-vector product (batch-1 classifier), or the last row of M.
  if (fused) e = tile_epilogue(c, i, j);
  s.gemv_panel(kc, ap, lda > 0 ? 1 : s.mr, bp, ldb, buf);
  for (int64_t t = 0; t < n; ++t) {
    float* dst = c_at(c, i, j + t);
    float v = acc ? *dst + buf[t] : buf[t];
    if (fused) {
      v = v * (e.row_scale ? e.row_scale[0] : 1.0f) + (e.row_bias ? e.row_bias[0] : 0.0f) +
          (e.col_bias ? e.col_bias[t] : 0.0f);
      if (c.fast->residual) v += c.fast->residual[dst - c.out_base];
      v = v > e.lo ? v : (v < e.lo ? e.lo : v);  // max, keeping NaN
      v = v < e.hi ? v : (v > e.hi ? e.hi : v);
    }
    *dst = v;
  }
}

// A micro-tile whose B is a flat im2col panel read in place (gemm_reads_panels_in_place).
void tile_taps(const SimdKernels& s, int64_t kc, const float* ap, const ImTaps& b,
               const GemmC& c, int64_t i, int64_t j, int64_t m, int64_t n, bool acc, bool last) {
  TileEpilogue e{};
  const bool fused = last && c.fast != nullptr;
  if (fused) e = tile_epilogue(c, i, j);
  s.gemm_ukernel_taps(kc, ap, b, c_at(c, i, j), c.ldc, acc, fused ? &e : nullptr, n, m);
}

void epilogue(const SimdKernels& s, const GemmC& c, int64_t i0, int64_t i1, int64_t j0,
              int64_t j1, float* scratch) {
  if (c.epilogue == nullptr || c.epilogue->empty()) return;
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = j0; j < j1;) {
      int64_t end = j + 1;
      if (c.col_off == nullptr) {
        end = j1;
      } else {
        while (end < j1 && c.col_off[end] == c.col_off[end - 1] + 1) ++end;
      }
      float* at = c_at(c, i, j);
      c.epilogue->apply(s, at, at - c.out_base, end - j, scratch);
      j = end;
    }
  }
}

// The order of a block's micro-tiles: row panel by row panel (each A panel kept in L1 across
// the block's B panels, C written row after row, as MLAS does) when the block has four B
// panels or more; else B panel by B panel (each kept in L1 across the A panels). The tiles of
// one row panel store into 12 rows of C as 12 forward streams, where B panel by B panel they
// store into every row of the block in turn: a product of short K whose C and residual are
// not in cache paid for that in misses. Same-process A/B, 1 thread, Zen 5, AVX-512, per-step
// medians: ResNet-50's 1x1 convolutions at 56 x 56 with K = 64 and a residual 0.92-0.96x,
// at 14 x 14 0.94-0.96x, the model 0.989x; ResNet-18's 7 x 7 planes (two B panels) were
// 1.01-1.03x slower row panel first, hence the threshold.
bool rows_outer(const SimdKernels& s, int64_t nc) { return nc >= 4 * s.nr; }

void zero_fill(const GemmC& c, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t i = m0; i < m1; ++i) {
    for (int64_t j = n0; j < n1; ++j) *c_at(c, i, j) = 0.0f;
  }
}

}  // namespace

bool gemm_rows_read_b_in_place(const SimdKernels& s, int64_t M) { return M % s.mr != 1; }

// Whether a block of an implicit im2col (columns [j0, j0 + n)) is read in place, its taps
// straight from the input image, instead of packed: when each whole panel of the block is
// flat (a stride-1 convolution on rows as wide as its input's, within one image) and stored
// to contiguous columns of C; a partial last panel is still packed (for gemm_ucols' narrow
// columns).
// Packing wrote the im2col once per block of nc columns, 9 floats per input float of a 3 x 3
// convolution, where in place a tile reads three rows of each channel. A block of the packed
// matrix is reused by all of M's row panels, so packing cost most where M is short. (A
// packed: the kernel reads no A in place; no tile of one row: gemv_panel reads packed B.)
bool gemm_reads_panels_in_place(const SimdKernels& s, const Im2col& g, const int64_t* col_off,
                                int64_t M, int64_t j0, int64_t n) {
  if (!gemm_rows_read_b_in_place(s, M) || n < s.nr) return false;
  for (int64_t j = j0; j + s.nr <= j0 + n; j += s.nr) {
    if (!im2col_flat(g, j, s.nr, s.nr / 2) || !contiguous(col_off, j, s.nr)) return false;
  }
  return true;
}

// Measured on Sapphire Rapids (48 KiB L1d, 2 MiB L2): a B block of kc x nc = 256 KiB keeps
// the packed im2col of a convolution in L2 together with its input; A blocks are small.
GemmBlocking gemm_blocking(const SimdKernels& s) {
  return {round_up(128, s.mr), 256, round_up(256, s.nr)};
}

int64_t gemm_workspace_floats(const SimdKernels& s, const EwProgram* epilogue,
                              int64_t a_once_floats) {
  const GemmBlocking bl = gemm_blocking(s);
  return a_once_floats + bl.mc * bl.kc + bl.kc * bl.nc + s.mr * s.nr +
         (epilogue ? epilogue->scratch_floats() : 0);
}

// A strided A whose rows are contiguous is read in place by the micro-kernel, 12 rows of a
// tile as 12 streams (MLAS reads A so), where packing it cost a transposing copy of all of A
// per call. Not when its rows are a multiple of 4 KiB apart: then a tile's rows fall into one
// L1 set (ViT's 197 x 3072 x 768 was even either way). One MatMul node, 1 thread, Zen 5,
// AVX-512, thread CPU time: 3136 x 256 x 64 (a 1x1 convolution channels-last) 762 -> 587 us,
// 12544 x 16 x 96 433 -> 366, 196 x 576 x 96 141 -> 114, 197 x 768 x 768 1162 -> 1153.
// (rs > 0: the micro-kernels take lda 0 for a packed panel.)
bool gemm_reads_a_in_place(int64_t rs, int64_t cs) {
  return cs == 1 && rs > 0 && rs % 1024 != 0;
}

// B's rows read in place, nr columns of a panel at a time (a 1x1 convolution's input planes),
// under the same guard against one L1 set as A's.
bool gemm_reads_b_in_place(int64_t rs, int64_t cs) {
  return gemm_reads_a_in_place(rs, cs);
}

int64_t gemm_a_once_floats(const SimdKernels& s, int64_t M, int64_t K, int64_t N, int64_t rs,
                           int64_t cs) {
  if (gemm_reads_a_in_place(rs, cs)) return 0;
  const GemmBlocking bl = gemm_blocking(s);
  const int64_t floats = round_up(M, s.mr) * K;
  return N > bl.nc && floats <= kMaxAOnceFloats ? floats : 0;
}

namespace {

// A constant operand packed K block by K block: K runs along A's columns and B's rows.
PackedOperand pack_const(const SimdKernels& s, bool is_a, const float* src, int64_t rs,
                         int64_t cs, int64_t rows, int64_t cols) {
  const GemmBlocking bl = gemm_blocking(s);
  const int64_t K = is_a ? cols : rows, width = is_a ? rows : cols;
  PackedOperand p;
  p.rows = rows;
  p.cols = cols;
  p.is_a = is_a;
  p.padded = round_up(width, is_a ? s.mr : s.nr);
  p.data.resize(static_cast<size_t>(checked_mul(p.padded, std::max<int64_t>(K, 1))));
  for (int64_t pc = 0; pc < K; pc += bl.kc) {
    const int64_t kc = std::min(bl.kc, K - pc);
    const float* block = src + pc * (is_a ? cs : rs);
    float* dst = p.data.data() + p.padded * pc;
    if (is_a) {
      s.pack_a(block, rs, cs, width, kc, dst);
    } else {
      s.pack_b(block, rs, cs, kc, width, dst);
    }
  }
  return p;
}

// Columns of a block of C: as many as make a B block of bl.kc x bl.nc floats at the product's
// K when K is short, so that the tiles of one row panel store into C's rows in long forward
// runs, not bl.nc columns at a time. A 1x1 convolution of 16 input channels at 112 x 112 wrote
// each of its 96 output rows 1 KB at a time, in turn: 96 streams the hardware prefetcher did
// not follow, each new line a miss. Not when a separate epilogue pass reads the block back
// after it (`separate`: the block would no longer be in L2). Same-process A/B, 1 thread,
// Zen 5, AVX-512, per-step medians: MobileNetV2's 16 -> 96 at 112 x 112 (K = 16)
// 0.79-0.89x, its stem (K = 27) 0.86-0.89x; ResNet-50's stem (K = 147) 0.92-0.94x, its 1x1
// convolutions of K = 64 at 56 x 56 0.92-0.94x; the models' step sums 0.97-1.0x (noise).
int64_t block_cols(const SimdKernels& s, int64_t K, bool separate) {
  const GemmBlocking bl = gemm_blocking(s);
  if (separate || K >= bl.kc || K == 0) return bl.nc;
  return std::max(bl.nc, bl.kc * bl.nc / K / s.nr * s.nr);
}

}  // namespace

PackedOperand pack_a_const(const SimdKernels& s, const float* a, int64_t rs, int64_t cs,
                           int64_t M, int64_t K) {
  return pack_const(s, true, a, rs, cs, M, K);
}

PackedOperand pack_b_const(const SimdKernels& s, const float* b, int64_t rs, int64_t cs,
                           int64_t K, int64_t N) {
  return pack_const(s, false, b, rs, cs, K, N);
}

void gemm(const SimdKernels& s, int64_t M, int64_t N, int64_t K, const GemmA& a,
          const GemmB& b, const GemmC& c, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
          float* workspace) {
  (void)N;
  if (m0 >= m1 || n0 >= n1) return;
  const GemmBlocking bl = gemm_blocking(s);
  // A read in place, or packed once, whole, at the start of the workspace: rows [m0, m1) K
  // block by K block.
  const bool in_place = !a.packed && gemm_reads_a_in_place(a.rs, a.cs);
  const bool once = a.pack_once && !a.packed && !in_place && K > 0;
  // Whole panels in place: no narrow columns (gemm_ucols), which read packed panels only;
  // A packed for the micro-kernel, or one row of A (gemv_panel: a decode step's attention
  // as a batched MatMul of [heads, 1, d], where packing B per head cost more than the
  // product). A last tile of one row under M's (M % mr == 1) stays packed, as measured.
  const bool b_in_place = b.in_place && !b.packed && gemm_reads_b_in_place(b.rs, b.cs) &&
                          c.col_off == nullptr &&
                          (M == 1 || (!in_place && gemm_rows_read_b_in_place(s, M)));
  const int64_t once_rows = round_up(m1 - m0, s.mr);
  const Buffers buf = carve(s, workspace + (a.pack_once ? round_up(M, s.mr) * K : 0));
  if (once) {
    for (int64_t pc = 0; pc < K; pc += bl.kc) {
      s.pack_a(a.p + m0 * a.rs + pc * a.cs, a.rs, a.cs, m1 - m0, std::min(bl.kc, K - pc),
               workspace + once_rows * pc);
    }
  }
  if (K == 0) {
    zero_fill(c, m0, m1, n0, n1);
    epilogue(s, c, m0, m1, n0, n1, buf.epilogue);
    return;
  }
  const bool separate = c.fast == nullptr && c.epilogue != nullptr && !c.epilogue->empty();
  const int64_t cols = block_cols(s, K, separate);
  for (int64_t jc = n0; jc < n1; jc += cols) {
    const int64_t nc = std::min(cols, n1 - jc);
    const bool taps = b.im2col && !in_place &&
                      gemm_reads_panels_in_place(s, *b.im2col, c.col_off, M, jc, nc);
    for (int64_t pc = 0; pc < K; pc += bl.kc) {
      const int64_t kc = std::min(bl.kc, K - pc);
      const float* bp = buf.b;
      if (taps) {
        const int64_t whole = nc / s.nr * s.nr;
        if (whole < nc) s.pack_im2col(*b.im2col, pc, kc, jc + whole, nc - whole, buf.b);
      } else if (b.packed) {
        bp = packed_block(*b.packed, pc, kc, jc, s.nr);
      } else if (b_in_place) {
        bp = b.p + pc * b.rs + jc;
        // Only the block's last panel when it is partial, so that no load passes B's end.
        if (nc % s.nr) s.pack_b(bp + nc / s.nr * s.nr, b.rs, 1, kc, nc % s.nr, buf.b);
      } else if (b.im2col) {
        s.pack_im2col(*b.im2col, pc, kc, jc, nc, buf.b);
      } else {
        s.pack_b(b.p + pc * b.rs + jc * b.cs, b.rs, b.cs, kc, nc, buf.b);
      }
      const bool last = pc + kc == K;
      for (int64_t ic = m0; ic < m1; ic += bl.mc) {
        const int64_t mc = std::min(bl.mc, m1 - ic);
        const float* ap = buf.a;
        if (in_place) {
          ap = a.p + ic * a.rs + pc;
        } else if (a.packed) {
          ap = packed_block(*a.packed, pc, kc, ic, s.mr);
        } else if (once) {
          ap = workspace + once_rows * pc + (ic - m0) * kc;
        } else {
          s.pack_a(a.p + ic * a.rs + pc * a.cs, a.rs, a.cs, mc, kc, buf.a);
        }
        const auto block_tile = [&](int64_t ir, int64_t jr) {
          const int64_t n = std::min<int64_t>(s.nr, nc - jr);
          const int64_t m = std::min<int64_t>(s.mr, mc - ir);
          const float* at = in_place ? ap + ir * a.rs : ap + (ir / s.mr) * s.mr * kc;
          if (taps && n == s.nr) {
            const Im2col& g = *b.im2col;
            const int64_t j = jc + jr;
            const ImTaps panel{g.input, g.col_base[j], g.k_delta + pc, g.k_pos + pc,
                               g.masks + j / s.nr * g.kpos_count};
            return tile_taps(s, kc, at, panel, c, ic + ir, j, m, n, pc > 0, last);
          }
          const bool whole_in_place = b_in_place && n == s.nr;
          const float* bpanel = whole_in_place     ? bp + jr
                                : b_in_place || taps ? buf.b
                                                : bp + (jr / s.nr) * s.nr * kc;
          const int64_t ldb = whole_in_place ? b.rs : s.nr;
          tile(s, kc, at, in_place ? a.rs : 0, bpanel, ldb, c, ic + ir, jc + jr, m, n,
               pc > 0, last, buf.tile);
        };
        if (rows_outer(s, nc)) {
          for (int64_t ir = 0; ir < mc; ir += s.mr) {
            for (int64_t jr = 0; jr < nc; jr += s.nr) block_tile(ir, jr);
          }
        } else {
          for (int64_t jr = 0; jr < nc; jr += s.nr) {
            for (int64_t ir = 0; ir < mc; ir += s.mr) block_tile(ir, jr);
          }
        }
        if (last && separate) epilogue(s, c, ic, ic + mc, jc, jc + nc, buf.epilogue);
      }
    }
  }
}

}  // namespace onnxlens
