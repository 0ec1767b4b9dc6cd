// The hot loops, compiled once per instruction set (src/simd_kernels.inc) and chosen at run
// time: a table of function pointers. Everything else in the core is plain C++ that calls
// through `simd()`.
#pragma once

#include <cstdint>

namespace onnxlens {

// Elementwise operations of the fused epilogues and elementwise kernels (ewprog.h): the
// catalogue's (ops.def), unary, then binary, then ternary.
enum class EwOp : uint8_t {
#define EW_UNARY(name, params, expr) name,
#define EW_BINARY(name, expr) name,
#define EW_TERNARY(name) name,
#include "ops.def"
};

// An operand of an elementwise loop: element i is p[i * stride], stride 0 (broadcast) or 1.
struct Src {
  const float* p;
  int64_t stride;
};

// How one vector of an im2col panel row reads the input: col_base rises by `step` (1 or 2)
// from lane to lane, over all its lanes (`brk` 0) or over lanes [0, brk) and again over
// [brk, n) from another start (a vector that crosses from one output row into the next);
// step 0: neither, lane by lane. Packed in a byte: step | brk << 2.
constexpr uint8_t vector_runs(int step, int brk) {
  return static_cast<uint8_t>(step | brk << 2);
}
constexpr int run_step(uint8_t code) { return code & 3; }
constexpr int run_break(uint8_t code) { return code >> 2; }

// Implicit im2col: column j of the packed B matrix is output pixel j, row k is (channel,
// ky, kx); the value is input[col_base[j] + k_delta[k]] where bit t of
// masks[panel * kpos_count + k_pos[k]] says that lane t of that panel is inside the image.
struct Im2col {
  const float* input;
  int64_t ncols;
  const int64_t* col_base;
  const int32_t* col_base32;   // the same as int32 for gathers, or null if they do not fit
  // per NR / 2-lane vector (two per panel): how its lanes read the input (vector_runs)
  const uint8_t* vector_step;
  const uint64_t* masks;
  const int64_t* k_delta;
  const int32_t* k_pos;
  int64_t kpos_count;
};

// Whether the n columns from j (j a multiple of 2 half, the panel width) read consecutive
// floats of the input: each vector of `half` lanes one run of step 1, and the second where
// the first ends.
inline bool im2col_flat(const Im2col& g, int64_t j, int64_t n, int64_t half) {
  const int64_t v = j / half;
  return g.vector_step[v] == vector_runs(1, 0) &&
         (n <= half || (g.vector_step[v + 1] == vector_runs(1, 0) &&
                        g.col_base[j + half] == g.col_base[j] + half));
}

// A panel of an implicit im2col whose columns read consecutive floats (a stride-1
// convolution's output pixels on rows as wide as the input's), read in place by the
// micro-kernel: row k of the panel is the nr floats from input + col_base + k_delta[k], lane t
// counted as 0 where bit t of masks[k_pos[k]] is clear (the pixel's tap lies in the padding).
struct ImTaps {
  const float* input;
  int64_t col_base;        // Im2col::col_base of the panel's first column
  const int64_t* k_delta;  // from the first row of the K block
  const int32_t* k_pos;
  const uint64_t* masks;   // the panel's: Im2col::masks + panel * kpos_count
};

// One channel of a depthwise convolution (2-D; a 1-D one has H = kh = 1).
struct DepthwiseArgs {
  const float* in;
  float* out;
  const float* w;  // kh * kw
  int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
  float* scratch;  // W floats: the rows above and below the plane, zeroed by the kernel
  // The channel's fused store, when `fused`: v = min(max(v * scale + bias, lo), hi).
  bool fused;
  float scale, bias, lo, hi;
  // Stride-1 planes narrower than two vectors, output rows as wide as the input's: the
  // plane read as one flat row (simd_kernels.inc depthwise_flat). flat_masks[v * kh * kw +
  // tap]: the lanes of output vector v whose input at that tap lies in the plane. Else null.
  const uint32_t* flat_masks;
};

// One output row of a depthwise convolution or of a max pool over channel-blocked tensors
// (Tensor::block is conv_lanes): one block of channels, [rows][columns][lanes]; the window's
// geometry as in DepthwiseArgs.
struct BlockedWindow {
  const float* in;  // the block's input plane, H x W
  float* out;       // output row oy, OW pixels
  const float* w;   // [kh][kw][lanes]; null: the maximum over the window's taps in the plane
  int64_t H, W, OW, oy, kh, kw, sh, sw, ph, pw, dh, dw;
  // v = min(max(v * scale + bias + residual, lo), hi), per lane (scale, bias, residual null:
  // 1, 0, 0); residual at the output row's place in a tensor laid out like the output.
  const float* scale;
  const float* bias;
  const float* residual;
  float lo, hi;
};

// One output row of a 2-D pooling window (see k_pool.cpp).
struct PoolRowArgs {
  const float* in;  // the channel plane
  float* out;       // the output row
  int64_t W, OW, kw, sw, pl, dh, dw;
  int64_t y0, y1;                    // input rows of this output row, clipped
  const int64_t* x0;                 // per output column: first input column, clipped
  const int64_t* x1;                 // per output column: end input column, clipped
  int64_t interior_lo, interior_hi;  // output columns whose window lies inside the row
  bool max;                          // max (else the sum, divided by the caller)
  // W floats: the window's rows reduced into one (max or sum), when it has more than one.
  float* rows;
  // W + 1 floats when sw == 2 and dw == 1: that row as its even then its odd columns, so
  // that the interior reads contiguous floats; null otherwise.
  float* split;
};

// Where a group of filter blocks' sums go (BlockedConv, WinogradGroup), at the group's first
// filter: filter m at pixel p, y[at] = min(max(v * scale[m] + bias[m] + residual[at], lo), hi)
// of its sum v (scale, bias, residual null: 1, 0, 0), at = m * ldy + p in planes, or in blocks
// of conv_lanes filters (blocked_y, Tensor::block): (m / lanes) * ldy + p * lanes + m % lanes.
struct BlockedOutput {
  float* y;
  int64_t ldy;
  bool blocked_y;
  const float* scale;
  const float* bias;
  const float* residual;
  float lo, hi;
};

// Winograd F(2x2, 3x3) of a 3x3 convolution of stride and dilation 1 over a channel-blocked
// input (k_conv.cpp BlockedDirect): output tile t is pixels (2 ty + r, 2 tx + c), r, c < 2,
// ty = t / tiles_x, tx = t % tiles_x, and reads the 4 x 4 input patch d at padded (2 ty, 2 tx).
// Per lane a channel, V = B^T d B of tiles [t0, t0 + count) of every block into v, laid out
// [16][blocks][count][lanes] (element xi = 4 i + j of V first).
struct WinogradInput {
  const float* in;  // the padded blocked image, block b at b * block_floats, rows of Wp pixels
  int64_t blocks, block_floats, Wp, tiles_x, t0, count;
  float* v;
};

// One group of filter blocks over those tiles: per element xi, the sums over channels of
// U[xi] * V[xi] (16 products of [filters x channels] by [channels x tiles], BlockedConv's tiles)
// into m, [16][filter_blocks][count][lanes]; then per tile Y = A^T M A, 2 x 2 outputs, into
// `out` with its epilogue.
struct WinogradGroup {
  const float* v;       // WinogradInput::v
  int64_t blocks, count, tiles_x, t0, OH, OW;
  const int64_t* pixel;  // p * lanes for p < count
  const float* w;  // U, [16][blocks][lanes][filter_blocks][lanes]
  int filter_blocks;
  int64_t filters;  // of the group that exist
  float* m;
  BlockedOutput out;
};

// A direct convolution of one image's output pixels with one group of filter blocks, its input
// laid out in channel blocks and padded (k_conv.cpp BlockedDirect): block b of the input is
// rows of pixels of `width` channels, at input + b * block_floats, zero where the window
// leaves the image. Output pixel p's tap (ky, x) of channel c reads input + pixel[p] + ky *
// row_step + x * col_step + c, for x < runs and c < run: with dilation 1 along the row a tap
// row is one run of kw * width floats (col_step 0), else kw runs of `width`.
struct BlockedConv {
  const float* input;
  int64_t blocks, block_floats;
  const int64_t* pixel;
  int64_t count;  // output pixels, pixel[0, count)
  int64_t kh, row_step, runs, col_step, run;
  // The group's filters, [blocks][kh][runs][run][filter_blocks][conv_lanes]: the multiplier
  // of input float (b, ky, x, c) for each filter of the group, zero past the filters and
  // channels there are.
  const float* w;
  int filter_blocks;
  int64_t filters;  // of the group that exist, at most filter_blocks * conv_lanes
  BlockedOutput out;
  float* scratch;  // filter_blocks * count * conv_lanes floats (planes only)
};

// The epilogue a micro-kernel applies as it stores its tile (the last K block only), when a
// fused epilogue has this form: v = v * row_scale[r] + row_bias[r] + col_bias[t]; v +=
// residual[r, t]; v = min(max(v, lo), hi). Null pointers are skipped; the pointers are at the
// tile's first row / column (residual: row stride ldc, like C).
struct TileEpilogue {
  const float* row_scale;
  const float* row_bias;
  const float* col_bias;
  const float* residual;
  float lo, hi;
};

// The most columns gemm_ucols takes: ops.def's GEMM_NARROW_COLS, which the native kernel model
// reads too.
#define GEMM_NARROW_COLS(n) constexpr int64_t kNarrowCols = n;
#include "ops.def"

struct SimdKernels {
  const char* name;
  int mr, nr;  // the GEMM micro-tile
  // C[mr x nr] (row stride ldc) = (acc ? C : 0) + A[mr x kc] B_panel[kc x nr], then the
  // epilogue `e` if not null; only C's rows [0, m) (2 <= m <= mr: the SIMD kernels compute
  // only those) and columns [0, n) (1 <= n <= nr) are read and written, and the epilogue's
  // column bias and residual read only there. A(i, k) is a packed panel's a[k * mr + i] when
  // lda is 0, else a[i * lda + k], read in place (rows [0, m) only). B(k, j) = b[k * ldb + j]:
  // a packed panel (ldb = nr) or, when A is packed, nr contiguous columns of a row-major B
  // read in place (all nr columns are read).
  void (*gemm_ukernel)(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* c, int64_t ldc, bool acc, const TileEpilogue* e, int64_t n,
                       int64_t m);
  // The same with B an implicit im2col panel read in place (A packed, lda 0), any n.
  void (*gemm_ukernel_taps)(int64_t kc, const float* a, const ImTaps& b, float* c, int64_t ldc,
                            bool acc, const TileEpilogue* e, int64_t n, int64_t m);
  // The same for n <= kNarrowCols columns (B a packed panel, still nr wide), column by
  // column: the columns past a tile's whole vectors of nr / 2 (gemm.cpp `columns`).
  void (*gemm_ucols)(int64_t kc, const float* a, int64_t lda, const float* b, float* c,
                     int64_t ldc, bool acc, const TileEpilogue* e, int64_t n, int64_t m);
  // out[0, nr) = A_row[kc]^T B_panel[kc x nr], A_row[k] = a[k * as], B_panel(k, j) =
  // b[k * ldb + j] (a packed panel, ldb = nr, or nr columns of a row-major B read in place):
  // one row of a tile (a matrix-vector product), without the mr - 1 rows of zeros the
  // micro-kernel would multiply.
  void (*gemv_panel)(int64_t kc, const float* a, int64_t as, const float* b, int64_t ldb,
                     float* out);
  // Pack rows [0, m) x cols [0, k) of A(i, j) = a[i * rs + j * cs] into mr-row panels
  // [k][mr] (rows past m are zero).
  void (*pack_a)(const float* a, int64_t rs, int64_t cs, int64_t m, int64_t k, float* dst);
  // Pack rows [0, k) x cols [0, n) of B(i, j) = b[i * rs + j * cs] into nr-column panels
  // [k][nr] (columns past n are zero).
  void (*pack_b)(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, float* dst);
  // Pack rows [k0, k0 + kc) x cols [j0, j0 + nc) of an implicit im2col matrix (j0 % nr == 0).
  void (*pack_im2col)(const Im2col& g, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                      float* dst);
  void (*unary)(EwOp op, float* dst, Src a, int64_t n, float p0, float p1);
  void (*binary)(EwOp op, float* dst, Src a, Src b, int64_t n);
  void (*ternary)(EwOp op, float* dst, Src a, Src b, Src c, int64_t n);
  void (*depthwise)(const DepthwiseArgs& args);
  void (*pool_row)(const PoolRowArgs& args);
  // dst[i] = exp(src[i] - shift); returns the sum of dst.
  float (*exp_shift_sum)(float* dst, const float* src, float shift, int64_t n);
  float (*max)(const float* x, int64_t n);
  float (*sum)(const float* x, int64_t n);
  // dst[i] = (x[i] - mean) * rstd * scale[i] + bias[i] (scale, bias may be null: 1, 0).
  void (*normalize)(float* dst, const float* x, float mean, float rstd, const float* scale,
                    const float* bias, int64_t n);
  // dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: a blocked transpose, the core
  // of a Transpose that moves the input's contiguous dim (NCHW <-> NHWC reorders).
  void (*transpose)(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd);
  // The blocked direct convolution (BlockedConv): filters in blocks of conv_lanes, at most
  // conv_filter_blocks to a group; null (and 0, 0) where there is none (generic).
  int conv_lanes, conv_filter_blocks;
  void (*blocked_conv)(const BlockedConv& args);
  void (*blocked_window)(const BlockedWindow& args);  // null where blocked_conv is
  void (*winograd_input)(const WinogradInput& args);  // null where blocked_conv is
  void (*winograd_group)(const WinogradGroup& args);  // null where blocked_conv is
};

// The table for this CPU (or for ONNXLENS_NATIVE_ISA=generic|avx2|avx512 when the CPU has it).
const SimdKernels& simd();
// The table of a named instruction set; null if this build or CPU lacks it.
const SimdKernels* simd_named(const char* name);

namespace generic { const SimdKernels* table(); }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ONNXLENS_X86 1
namespace avx2 { const SimdKernels* table(); }
namespace avx512 { const SimdKernels* table(); }
#endif

}  // namespace onnxlens
