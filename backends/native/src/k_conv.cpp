// Conv: depthwise convolutions run a direct kernel per channel; every other convolution is a
// GEMM per group, W_g (M/g x C/g*kh*kw, packed once) times an implicit im2col of the input
// whose columns are the output pixels of all images of the batch; a 1x1 convolution of one
// image at stride 1 without pads reads its input planes as that matrix, in place, and the
// GEMM reads the im2col's flat panels from the input in place too (a strided convolution's
// from its input split into phases, where that pays: phase_layout).
#include <algorithm>
#include <cmath>
#include <map>

#include "conv_geometry.h"
#include "gemm.h"
#include "kernel.h"

namespace onnxlens {

Window2d window_2d(const KernelContext& ctx, const Tensor& x, const std::vector<int64_t>& kernel,
                   const std::vector<int64_t>& y_shape, bool ceil) {
  const int spatial = x.rank() - 2;
  require(spatial == 1 || spatial == 2, ctx.spec.op, ": only 1-D and 2-D windows, input is ",
          show(x.shape));
  require(static_cast<int>(kernel.size()) == spatial, ctx.spec.op, ": kernel ", show(kernel),
          " for input ", show(x.shape));
  auto get = [&](const char* name, size_t n, int64_t fallback) {
    std::vector<int64_t> v = ctx.ints(name);
    if (v.empty()) v.assign(n, fallback);
    require(v.size() == n, ctx.spec.op, ": ", name, " has ", v.size(), " values, expected ", n);
    return v;
  };
  const auto s = static_cast<size_t>(spatial);
  const std::vector<int64_t> strides = get("strides", s, 1), dil = get("dilations", s, 1);
  const std::vector<int64_t> pads = get("pads", 2 * s, 0);
  Window2d g{};
  g.N = x.dim(0);
  g.C = x.dim(1);
  g.H = spatial == 2 ? x.dim(2) : 1;
  g.W = x.dim(x.rank() - 1);
  g.kh = spatial == 2 ? kernel[0] : 1;
  g.kw = kernel.back();
  g.sh = spatial == 2 ? strides[0] : 1;
  g.sw = strides.back();
  g.dh = spatial == 2 ? dil[0] : 1;
  g.dw = dil.back();
  g.pt = spatial == 2 ? pads[0] : 0;
  g.pl = pads[s - 1];
  g.pb = spatial == 2 ? pads[2] : 0;
  g.pr = pads[2 * s - 1];
  for (int64_t v : {g.kh, g.kw, g.sh, g.sw, g.dh, g.dw}) {
    require(v >= 1 && v <= (int64_t{1} << 20), ctx.spec.op, ": window values must be positive");
  }
  for (int64_t v : {g.pt, g.pl, g.pb, g.pr}) {
    require(v >= 0 && v <= (int64_t{1} << 20), ctx.spec.op, ": pads must be 0..2^20");
  }
  auto out = [&](int64_t in, int64_t k, int64_t st, int64_t d, int64_t p0, int64_t p1) {
    const int64_t span = checked_add(checked_mul(d, k - 1), 1);
    const int64_t room = checked_add(in, p0 + p1) - span;
    require(room >= 0, ctx.spec.op, ": window of ", span, " does not fit in ", in,
            " (+ pads)");
    return (ceil ? (room + st - 1) / st : room / st) + 1;
  };
  g.OH = out(g.H, g.kh, g.sh, g.dh, g.pt, g.pb);
  g.OW = out(g.W, g.kw, g.sw, g.dw, g.pl, g.pr);
  if (ceil) {
    // ONNX shape inference keeps a last window that starts past the input and its left
    // padding; PyTorch and newer ONNX Runtime drop it. Either count is accepted.
    const int64_t oh = y_shape.size() == 4 ? y_shape[2] : 1, ow = y_shape.back();
    if (oh == g.OH - 1 && (g.OH - 1) * g.sh >= g.H + g.pt) --g.OH;
    if (ow == g.OW - 1 && (g.OW - 1) * g.sw >= g.W + g.pl) --g.OW;
  }
  std::vector<int64_t> expect = {g.N, -1};
  if (spatial == 2) expect.push_back(g.OH);
  expect.push_back(g.OW);
  require(static_cast<int>(y_shape.size()) == x.rank() && y_shape[0] == g.N &&
              y_shape.back() == g.OW && (spatial == 1 || y_shape[2] == g.OH),
          ctx.spec.op, ": output ", show(y_shape), " does not match the window over ",
          show(x.shape));
  return g;
}

namespace {

// Where a convolution's taps read its input: channel c's plane at c * channel floats of an
// image (images `image` floats apart), rows of `cols` floats; output pixel (oy, ox) at kernel
// position p reads row oy * sy + dy[p], column ox * sx + dx[p] of the plane at offset
// plane[p] within the channel, and 0 outside rows x cols.
struct TapLayout {
  int64_t image, channel, rows, cols, sy, sx;
  std::vector<int64_t> plane, dy, dx;
};

// The input as it is: the window's strides, its pads as negative offsets.
TapLayout direct_layout(const Window2d& g) {
  TapLayout t{g.C * g.H * g.W, g.H * g.W, g.H, g.W, g.sh, g.sw, {}, {}, {}};
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      t.plane.push_back(0);
      t.dy.push_back(ky * g.dh - g.pt);
      t.dx.push_back(kx * g.dw - g.pl);
    }
  }
  return t;
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// A convolution of stride s over its input split into phases: phase (py, px) holds the input
// pixels (s i + py, s j + px) as a plane of ceil(H / s) x ceil(W / s) (zero past the input),
// so that every tap reads one phase at stride 1. Tap offset a = k d - pad = s q + phase: row
// s (o + q) + phase of the input is row o + q of the phase. Only the phases some tap reads
// are kept (a 1x1 convolution of stride 2 reads one of four), in `phases` (py * s + px).
TapLayout phase_layout(const Window2d& g, std::vector<int64_t>& phases) {
  const int64_t s = g.sh, rows = (g.H + s - 1) / s, cols = (g.W + s - 1) / s;
  std::map<int64_t, int64_t> slot;  // phase -> its place in `phases` (s may be up to 2^20)
  TapLayout t{0, 0, rows, cols, 1, 1, {}, {}, {}};
  phases.clear();
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      const int64_t ay = ky * g.dh - g.pt, ax = kx * g.dw - g.pl;
      const int64_t qy = floor_div(ay, s), qx = floor_div(ax, s);
      const int64_t phase = (ay - s * qy) * s + (ax - s * qx);
      const auto [at, added] = slot.emplace(phase, static_cast<int64_t>(phases.size()));
      if (added) phases.push_back(phase);
      t.plane.push_back(at->second * rows * cols);
      t.dy.push_back(qy);
      t.dx.push_back(qx);
    }
  }
  t.channel = checked_mul(static_cast<int64_t>(phases.size()), checked_mul(rows, cols));
  t.image = checked_mul(g.C, t.channel);
  return t;
}

// One phase of an input plane H x W at stride s (phase_layout): its rows x cols pixels
// (s i + py, s j + px), 0 past the plane.
__attribute__((always_inline)) inline void split_phase(const float* in, int64_t H, int64_t W,
                                                       int64_t s, int64_t py, int64_t px,
                                                       int64_t rows, int64_t cols, float* out) {
  const int64_t inside = (W - px + s - 1) / s;  // columns j with s j + px < W
  for (int64_t i = 0; i < rows; ++i, out += cols) {
    const int64_t y = s * i + py;
    if (y >= H) {
      std::fill(out, out + cols, 0.0f);
      continue;
    }
    const float* row = in + y * W + px;
    // Stride 2 as a constant, which the compiler vectorizes (two loads and a shuffle per
    // vector, where the variable stride gathered float by float). Same-process A/B, 1 thread,
    // Zen 5, AVX-512: ResNet's 7x7 stem 0.977-0.983x; the split of a 3x3 convolution of
    // stride 2 (64 channels, 56 x 56) fell from 6.1% to 3.5% of its samples.
    if (s == 2) {
      for (int64_t j = 0; j < inside; ++j) out[j] = row[2 * j];
    } else {
      for (int64_t j = 0; j < inside; ++j) out[j] = row[s * j];
    }
    std::fill(out + inside, out + cols, 0.0f);
  }
}
using SplitPhaseFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                              int64_t, int64_t, float*);

// The implicit im2col of one group's input channels over a tap layout; see simd.h's Im2col.
class Im2colTables {
 public:
  Im2colTables(const Window2d& g, const TapLayout& t, int64_t channels, int nr) {
    const int64_t ohw = g.OH * g.OW, ncols = checked_mul(g.N, ohw);
    const int64_t panels = (ncols + nr - 1) / nr, kpos = g.kh * g.kw;
    col_base_.resize(static_cast<size_t>(panels * nr), 0);
    std::vector<int64_t> y(col_base_.size(), 0), x(col_base_.size(), 0);
    for (int64_t j = 0; j < ncols; ++j) {
      const int64_t n = j / ohw, p = j % ohw;
      y[j] = p / g.OW * t.sy;
      x[j] = p % g.OW * t.sx;
      col_base_[j] = n * t.image + y[j] * t.cols + x[j];
    }
    masks_.assign(static_cast<size_t>(panels * kpos), 0);
    step_.assign(static_cast<size_t>(2 * panels), 0);
    for (int64_t panel = 0; panel < panels; ++panel) {
      for (int64_t v = 0; v < 2; ++v) {
        const int64_t j0 = panel * nr + v * (nr / 2);
        step_[2 * panel + v] = vector_step(j0, std::min<int64_t>(nr / 2, ncols - j0));
      }
      for (int t_lane = 0; t_lane < nr; ++t_lane) {
        const int64_t j = panel * nr + t_lane;
        if (j >= ncols) continue;
        for (int64_t p = 0; p < kpos; ++p) {
          const int64_t iy = y[j] + t.dy[p], ix = x[j] + t.dx[p];
          if (iy >= 0 && iy < t.rows && ix >= 0 && ix < t.cols) {
            masks_[panel * kpos + p] |= uint64_t{1} << t_lane;
          }
        }
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < kpos; ++p) {
        k_delta_.push_back(c * t.channel + t.plane[p] + t.dy[p] * t.cols + t.dx[p]);
        k_pos_.push_back(static_cast<int32_t>(p));
      }
    }
    const int64_t total = checked_mul(g.N, t.image);
    if (total < (int64_t{1} << 31)) {
      col_base32_.assign(col_base_.begin(), col_base_.end());
    }
    view_.ncols = ncols;
    view_.col_base = col_base_.data();
    view_.col_base32 = col_base32_.empty() ? nullptr : col_base32_.data();
    view_.vector_step = step_.data();
    view_.masks = masks_.data();
    view_.k_delta = k_delta_.data();
    view_.k_pos = k_pos_.data();
    view_.kpos_count = kpos;
  }

  // The vector_runs of the n columns from j0: one run of step 1 or 2, or two runs of the same
  // step (the second from the lane where the step breaks), else step 0.
  uint8_t vector_step(int64_t j0, int64_t n) const {
    if (n <= 1) return vector_runs(1, 0);
    const int64_t step = col_base_[j0 + 1] - col_base_[j0];
    if (step != 1 && step != 2) return vector_runs(0, 0);
    int64_t brk = 0;
    for (int64_t t = 1; t < n; ++t) {
      const int64_t rise = col_base_[j0 + t] - col_base_[j0 + t - 1];
      if (rise == step) continue;
      if (brk != 0) return vector_runs(0, 0);
      brk = t;
    }
    return vector_runs(static_cast<int>(step), static_cast<int>(brk));
  }

  Im2col view(const float* input) const {
    Im2col v = view_;
    v.input = input;
    return v;
  }

 private:
  std::vector<int64_t> col_base_, k_delta_;
  std::vector<int32_t> col_base32_, k_pos_;
  std::vector<uint8_t> step_;
  std::vector<uint64_t> masks_;
  Im2col view_{};
};

// Depthwise planes with stride 1 narrower than two vectors (every block of 16 columns an edge
// block) and output rows as wide as the input's are read as one flat row (simd.h
// DepthwiseArgs::flat_masks): per vector of 16 outputs and tap, the lanes whose input lies in
// the plane; empty for any other plane. 28x28 planes (192 channels) 57.8 -> 50.2 us; 56x56
// ones were even (165 -> 162), their edge blocks two of four.
std::vector<uint32_t> flat_plane_masks(const Window2d& g) {
  if (g.sh != 1 || g.sw != 1 || g.OW != g.W || g.OW >= 32) return {};
  const int64_t n = g.OH * g.OW, taps = g.kh * g.kw;
  std::vector<uint32_t> masks(static_cast<size_t>((n + 15) / 16 * taps), 0);
  for (int64_t o = 0; o < n; ++o) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t iy = o / g.OW - g.pt + ky * g.dh, ix = o % g.OW - g.pl + kx * g.dw;
        if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W) {
          masks[static_cast<size_t>(o / 16 * taps + ky * g.kw + kx)] |= 1u << (o % 16);
        }
      }
    }
  }
  return masks;
}

// A convolution by the blocked direct kernel (simd.h BlockedConv). Each run copies the input
// into blocks of conv_lanes channels (all of them when there are fewer: ResNet's stem reads 3),
// each block a padded image of pixels of `width` channels whose borders stay zero; then each
// chunk of output pixels and group of filter blocks is computed into a thread's scratch as
// [filter blocks][pixels][lanes] and transposed into the output's planes, epilogue applied.
// The copy and the transpose cost a pass over the input and one over the output, saved where
// the tensors are blocked already (Tensor::block, the executor's blocked_layouts): a blocked
// input is only copied into its padded blocks when the window has pads, else read in place,
// and a blocked output takes each tile as it is.
class BlockedDirect {
  // Filter blocks [first, first + blocks), packed (BlockedConv::w), with their scale and bias
  // (empty when the kernel applies none).
  struct FilterGroup {
    int64_t first, blocks;
    HugeVector<float> w;
    std::vector<float> scale, bias;
  };

 public:
  // Whether it serves a convolution with planar input and output (blocked ones it serves
  // always, conv_blocked_io): one group, a window of more than one tap, constant
  // weights, at least kMinTerms terms per output, and filters that fill three quarters of
  // their blocks' lanes at least (8 filters would use one lane in two of AVX-512's).
  static bool fits(const SimdKernels& s, const Window2d& g, int64_t M, int64_t groups,
                   bool constant_weights) {
    if (s.blocked_conv == nullptr || groups != 1 || g.kh * g.kw == 1 || !constant_weights ||
        g.C * g.kh * g.kw < kMinTerms) {
      return false;
    }
    const int64_t lanes = s.conv_lanes, padded = (M + lanes - 1) / lanes * lanes;
    return 4 * M >= 3 * padded;
  }

  // x_blocked, y_blocked: the input, the output blocked (Tensor::block is conv_lanes).
  BlockedDirect(const SimdKernels& s, const Window2d& g, const float* w, int64_t M,
                const FastEpilogue& fast, bool x_blocked, bool y_blocked)
      : s_(s), g_(g), M_(M), lanes_(s.conv_lanes), x_blocked_(x_blocked),
        y_blocked_(y_blocked) {
    width_ = std::min<int64_t>(g.C, lanes_);
    blocks_ = (g.C + width_ - 1) / width_;
    winograd_ = winograd_fits(s, g);
    Hp_ = g.H + g.pt + g.pb;
    Wp_ = g.W + g.pl + g.pr;
    if (winograd_) {  // every tile's 4 x 4 patch inside, past the last odd row and column too
      tiles_x_ = (g.OW + 1) / 2;
      tiles_ = (g.OH + 1) / 2 * tiles_x_;
      Hp_ = std::max(Hp_, 2 * ((g.OH + 1) / 2) + 2);
      Wp_ = std::max(Wp_, 2 * tiles_x_ + 2);
      chunk_tiles_ = std::clamp<int64_t>(kWinogradChunkFloats / (16 * blocks_ * width_), 16,
                                         kChunkPixels);
    }
    block_floats_ = checked_mul(checked_mul(Hp_, Wp_), width_);
    if (copies()) {
      padded_.assign(
          static_cast<size_t>(checked_mul(checked_mul(g.N, blocks_), block_floats_)), 0.0f);
    }
    if (winograd_) {
      for (int64_t t = 0; t < chunk_tiles_; ++t) pixel_.push_back(t * lanes_);
    } else {
      for (int64_t oy = 0; oy < g.OH; ++oy) {
        for (int64_t ox = 0; ox < g.OW; ++ox) {
          pixel_.push_back((oy * g.sh * Wp_ + ox * g.sw) * width_);
        }
      }
    }
    const bool flat_rows = g.dw == 1;  // a tap row is one run of kw * width floats
    runs_ = flat_rows ? 1 : g.kw;
    run_ = flat_rows ? g.kw * width_ : width_;
    const int64_t filter_blocks = (M + lanes_ - 1) / lanes_;
    const int64_t groups = (filter_blocks + s.conv_filter_blocks - 1) / s.conv_filter_blocks;
    for (int64_t gi = 0; gi < groups; ++gi) {  // filter blocks shared out evenly
      const int64_t first = gi * filter_blocks / groups;
      const int64_t blocks = (gi + 1) * filter_blocks / groups - first;
      groups_.push_back(winograd_ ? pack_winograd_group(w, first, blocks, fast)
                                  : pack_group(w, first, blocks, fast));
    }
  }

  int64_t workspace_floats(const EwProgram& epilogue) const {
    return own_floats() + epilogue.scratch_floats();
  }

  void run(ThreadPool& pool, const Workspace& ws, const float* x, float* y,
           const EwProgram& epilogue, const FastEpilogue& fast) {
    const float* input = x;
    if (copies()) {
      copy_in(pool, x);
      input = padded_.data();
    }
    if (winograd_) return run_winograd(pool, ws, input, y, epilogue, fast);
    const int64_t ohw = g_.OH * g_.OW, chunks = (ohw + kChunkPixels - 1) / kChunkPixels;
    const int64_t groups = static_cast<int64_t>(groups_.size());
    const int64_t tasks = g_.N * groups * chunks;
    const int64_t work = checked_mul(checked_mul(M_, g_.N * ohw), g_.C * g_.kh * g_.kw);
    // Task t is filter group t % groups of chunk t / groups: a chunk's input stays in the cache
    // while every group reads it, where group by group the whole input streamed in once per
    // group (with AVX2, eleven times for ResNet-50's 1x1 convolutions of 512 channels at 28 x
    // 28: 1.6 MB each time). Zen 4, 1 thread, same-process A/B: ResNet-50 0.971x with AVX2
    // (its 1x1 convolutions at 28 x 28 0.81-0.89x), the same with AVX-512.
    pool.for_range(tasks, pool.chunk_for(tasks), [&](int tid, int64_t begin, int64_t end) {
      float* scratch = ws.get(tid);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = t / (groups * chunks), gi = t % groups;
        const int64_t p0 = t / groups % chunks * kChunkPixels;
        chunk(input, n, groups_[gi], p0, std::min(kChunkPixels, ohw - p0), y, epilogue, fast,
              scratch);
      }
    }, work);
  }

 private:
  // A tile's sums over fewer channels and taps do not pay for its store and for the copy of
  // the input. Zen 4, AVX-512, 1 thread, native/ORT: MobileNetV2's 3x3 stem of stride 2 (3
  // channels, 27 terms) 1.53-1.57 blocked, 1.22-1.24 by the GEMM; ResNet's 7x7 stem (147
  // terms) 1.10-1.14 blocked, 1.13-1.15 by the GEMM.
  static constexpr int64_t kMinTerms = 64;
  // Output pixels per task: a multiple of every tile's pixels (24 / filter blocks, 12 / blocks
  // on AVX2), and its scratch (four blocks of 16 filters) 24 KB.
  static constexpr int64_t kChunkPixels = 96;

  // Winograd F(2x2, 3x3) (simd.h WinogradGroup) takes a 3x3 convolution of stride and
  // dilation 1 with whole blocks of channels and kWinogradMinChannels of them or more: 16
  // multiply-adds per channel, filter and 2 x 2 pixels where direct takes 36, and the
  // transforms' 32 adds per channel and 24 per filter, which fewer channels would not pay for.
  // Zen 4, 1 thread, same-process A/B against direct: ResNet-18's 3x3 convolutions of stride 1
  // 0.52-0.58x (64-256 channels at 56-14 pixels) and 0.69x (512 at 7 x 7, a quarter of its
  // tiles half outside), the model 0.655x.
  static bool winograd_fits(const SimdKernels& s, const Window2d& g) {
    return s.winograd_group != nullptr && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 &&
           g.dh == 1 && g.dw == 1 && g.C % s.conv_lanes == 0 && g.C >= kWinogradMinChannels;
  }
  static constexpr int64_t kWinogradMinChannels = 32;
  // A chunk's transformed input (16 x channels x tiles floats) about 256 KB, and 16 tiles or
  // more: at 7 x 7 pixels, 16 tiles as one chunk. The tiles are shared out evenly between
  // chunks.
  static constexpr int64_t kWinogradChunkFloats = 65536;

  // The scratch of a thread: a chunk's transformed input and a group's products (Winograd),
  // or a chunk of a group's outputs in [filter blocks][pixels][lanes] (planes only).
  int64_t own_floats() const {
    const int64_t products = s_.conv_filter_blocks * lanes_;
    return winograd_ ? 16 * chunk_tiles_ * (blocks_ * width_ + products)
                     : products * kChunkPixels;
  }

  // Chunks of at most chunk_tiles_ tiles by parts of the filter groups: a task transforms
  // its chunk's input (again, where the groups are cut into parts to keep the threads busy),
  // then computes its groups' outputs. The epilogue the tiles do not apply runs after, plane
  // by plane.
  void run_winograd(ThreadPool& pool, const Workspace& ws, const float* input, float* y,
                    const EwProgram& epilogue, const FastEpilogue& fast) {
    const int64_t chunks = (tiles_ + chunk_tiles_ - 1) / chunk_tiles_, ohw = g_.OH * g_.OW;
    const int64_t groups = static_cast<int64_t>(groups_.size());
    const int64_t busy = (2 * pool.size() + g_.N * chunks - 1) / (g_.N * chunks);
    const int64_t parts = pool.size() == 1 ? 1 : std::clamp<int64_t>(busy, 1, groups);
    const int64_t tasks = g_.N * chunks * parts;
    const int64_t work = checked_mul(checked_mul(M_, g_.N * tiles_), blocks_ * width_ * 16);
    pool.for_range(tasks, pool.chunk_for(tasks), [&](int tid, int64_t begin, int64_t end) {
      float* v = ws.get(tid);
      float* m = v + 16 * chunk_tiles_ * blocks_ * width_;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = t / (chunks * parts), c = t / parts % chunks, part = t % parts;
        const int64_t t0 = c * tiles_ / chunks, count = (c + 1) * tiles_ / chunks - t0;
        if (t == begin || part == 0) {
          s_.winograd_input({input + n * blocks_ * block_floats_, blocks_, block_floats_, Wp_,
                             tiles_x_, t0, count, v});
        }
        for (int64_t gi = part * groups / parts; gi < (part + 1) * groups / parts; ++gi) {
          const FilterGroup& group = groups_[static_cast<size_t>(gi)];
          const int64_t m0 = group.first * lanes_;
          s_.winograd_group({v, blocks_, count, tiles_x_, t0, g_.OH, g_.OW, pixel_.data(),
                             group.w.data(), static_cast<int>(group.blocks),
                             std::min(group.blocks * lanes_, M_ - m0), m,
                             output_of(group, y, y + (n * M_ + m0) * ohw, fast)});
        }
      }
    }, work);
    if (fast.ok || epilogue.empty()) return;
    const int64_t planes = g_.N * M_;
    pool.for_range(planes, pool.chunk_for(planes), [&](int tid, int64_t begin, int64_t end) {
      float* rest = ws.get(tid) + own_floats();
      for (int64_t p = begin; p < end; ++p) {
        epilogue.apply(s_, y + p * ohw, p * ohw, ohw, rest);
      }
    }, checked_mul(planes, ohw));
  }

  // Filter blocks [first, first + blocks) as WinogradGroup::w wants them, U = G g G^T of each
  // filter and channel, and their scale and bias when the epilogue has them.
  FilterGroup pack_winograd_group(const float* w, int64_t first, int64_t blocks,
                                  const FastEpilogue& fast) const {
    static constexpr float G[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f},
                                      {0, 0, 1}};
    const int64_t span = blocks * lanes_, m0 = first * lanes_, C = blocks_ * width_;
    FilterGroup group{first, blocks, {}, {}, {}};
    group.w.assign(static_cast<size_t>(checked_mul(16 * C, span)), 0.0f);
    for (int64_t f = 0; f < span && m0 + f < M_; ++f) {
      for (int64_t c = 0; c < g_.C; ++c) {
        const float* g = w + ((m0 + f) * g_.C + c) * 9;
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 4; ++j) {
            double u = 0.0;
            for (int k = 0; k < 3; ++k) {
              for (int l = 0; l < 3; ++l) u += double(G[i][k]) * G[j][l] * g[k * 3 + l];
            }
            const int64_t at = ((4 * i + j) * C + c) * span + f;
            group.w[static_cast<size_t>(at)] = static_cast<float>(u);
          }
        }
      }
    }
    scale_and_bias(group, fast);
    return group;
  }

  // Filter blocks [first, first + blocks) as BlockedConv::w wants them, and their scale and
  // bias when the epilogue has them.
  FilterGroup pack_group(const float* w, int64_t first, int64_t blocks,
                         const FastEpilogue& fast) const {
    const int64_t taps = g_.kh * g_.kw, span = blocks * lanes_, m0 = first * lanes_;
    FilterGroup group{first, blocks, {}, {}, {}};
    group.w.assign(static_cast<size_t>(checked_mul(blocks_ * taps * width_, span)), 0.0f);
    for (int64_t b = 0; b < blocks_; ++b) {
      for (int64_t tap = 0; tap < taps; ++tap) {
        for (int64_t c = 0; c < width_ && b * width_ + c < g_.C; ++c) {
          float* dst = group.w.data() + ((b * taps + tap) * width_ + c) * span;
          for (int64_t f = 0; f < span && m0 + f < M_; ++f) {
            dst[f] = w[((m0 + f) * g_.C + b * width_ + c) * taps + tap];
          }
        }
      }
    }
    scale_and_bias(group, fast);
    return group;
  }

  void scale_and_bias(FilterGroup& group, const FastEpilogue& fast) const {
    const int64_t span = group.blocks * lanes_, m0 = group.first * lanes_;
    if (fast.ok && !fast.row_scale.empty()) {
      group.scale.assign(static_cast<size_t>(span), 1.0f);
      group.bias.assign(static_cast<size_t>(span), 0.0f);
      for (int64_t f = 0; f < span && m0 + f < M_; ++f) {
        group.scale[f] = fast.row_scale[static_cast<size_t>(m0 + f)];
        group.bias[f] = fast.row_bias[static_cast<size_t>(m0 + f)];
      }
    }
  }

  // Whether the kernel reads a padded copy of its input (copy_in), not the input in place.
  bool copies() const {
    return winograd_ || !x_blocked_ || g_.pt + g_.pl + g_.pb + g_.pr > 0;
  }

  // The input into the padded blocks, row by row: a transpose of each block's channels x
  // columns, or a blocked input's rows as they are.
  void copy_in(ThreadPool& pool, const float* x) {
    const int64_t rows = g_.N * blocks_ * g_.H, hw = g_.H * g_.W;
    pool.for_range(rows, pool.chunk_for(rows), [&](int, int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t row = r % g_.H, nb = r / g_.H, n = nb / blocks_, b = nb % blocks_;
        const int64_t c0 = b * width_, channels = std::min(width_, g_.C - c0);
        float* dst = padded_.data() + nb * block_floats_ + ((row + g_.pt) * Wp_ + g_.pl) * width_;
        if (x_blocked_) {
          const float* src = x + (nb * g_.H + row) * g_.W * width_;
          std::copy(src, src + g_.W * width_, dst);
          continue;
        }
        s_.transpose(x + (n * g_.C + c0) * hw + row * g_.W, hw, channels, g_.W, dst, width_);
      }
    }, checked_mul(g_.N * g_.C, hw));
  }

  // The group's outputs from `out` on in the output y, with the group's scale and bias and
  // the fast epilogue's residual (at the same place) and clamp.
  BlockedOutput output_of(const FilterGroup& group, float* y, float* out,
                          const FastEpilogue& fast) const {
    const bool scaled = !group.scale.empty();
    return {out,
            y_blocked_ ? g_.OH * g_.OW * lanes_ : g_.OH * g_.OW,
            y_blocked_,
            scaled ? group.scale.data() : nullptr,
            scaled ? group.bias.data() : nullptr,
            fast.ok && fast.residual ? fast.residual + (out - y) : nullptr,
            fast.ok ? fast.lo : -INFINITY,
            fast.ok ? fast.hi : INFINITY};
  }

  // Pixels [p0, p0 + count) of image n for a filter group, then the epilogue where it has no
  // form the kernel applies.
  // (A blocked output's filter block f starts at (n * M / lanes + f) * ohw * lanes, which is
  // (n * M + f * lanes) * ohw, as filter f * lanes does in planes.)
  void chunk(const float* input, int64_t n, const FilterGroup& group, int64_t p0,
             int64_t count, float* y, const EwProgram& epilogue, const FastEpilogue& fast,
             float* scratch) const {
    const int64_t ohw = g_.OH * g_.OW, m0 = group.first * lanes_;
    const int64_t filters = std::min(group.blocks * lanes_, M_ - m0);
    float* out = y + (n * M_ + m0) * ohw + p0 * (y_blocked_ ? lanes_ : 1);
    BlockedConv a{input + n * blocks_ * block_floats_, blocks_, block_floats_,
                  pixel_.data() + p0, count, g_.kh, g_.dh * Wp_ * width_, runs_,
                  g_.dw * width_, run_, group.w.data(), static_cast<int>(group.blocks), filters,
                  output_of(group, y, out, fast), scratch};
    s_.blocked_conv(a);
    if (fast.ok) return;
    float* rest = scratch + own_floats();
    for (int64_t m = 0; m < filters; ++m) {
      float* row = out + m * ohw;
      epilogue.apply(s_, row, row - y, count, rest);
    }
  }

  const SimdKernels& s_;
  Window2d g_;
  int64_t M_, lanes_;
  bool x_blocked_, y_blocked_;
  int64_t width_ = 0, blocks_ = 0, Hp_ = 0, Wp_ = 0, block_floats_ = 0;
  int64_t runs_ = 0, run_ = 0;
  bool winograd_ = false;
  int64_t tiles_x_ = 0, tiles_ = 0, chunk_tiles_ = 0;  // Winograd's
  HugeVector<float> padded_;
  std::vector<int64_t> pixel_;  // per output pixel its input offset (Winograd: a tile's, p * lanes)
  std::vector<FilterGroup> groups_;
};

class ConvKernel : public XyKernel {
 public:
  explicit ConvKernel(const KernelContext& ctx) : XyKernel(ctx, 2, 2) {
    const Tensor& w = ctx.input(1);
    require(w.rank() == x_.rank() && x_.rank() >= 3, "Conv: weight ", show(w.shape),
            " for input ", show(x_.shape));
    groups_ = ctx.attr("group", 1);
    const int64_t C = x_.dim(1), M = w.dim(0);
    require(groups_ >= 1 && C % groups_ == 0 && M % groups_ == 0 && w.dim(1) == C / groups_,
            "Conv: ", groups_, " groups do not fit input ", show(x_.shape), " and weight ",
            show(w.shape));
    g_ = window_2d(ctx, x_, std::vector<int64_t>(w.shape.begin() + 2, w.shape.end()), y_.shape);
    require(y_.dim(1) == M, "Conv: output ", show(y_.shape), " for ", M, " filters");
    M_ = M;
    epilogue_ = EwProgram(ctx, y_.shape);
    fast_ = epilogue_.fast(1, M, false);
    depthwise_ = groups_ == C && M == C;
    // Per-channel scale and bias and a clamp are applied by the depthwise kernel as it stores.
    dw_fused_ = fast_.ok && fast_.col_bias == nullptr && fast_.residual == nullptr;
    const int64_t mg = M / groups_, kg = (C / groups_) * g_.kh * g_.kw;
    w_ = w.f32();
    if (depthwise_) {
      require(x_.block == y_.block, "Conv: a depthwise convolution's input ", x_.name,
              " and output ", y_.name, " must both be blocked or neither");
      if (x_.block != 0) {
        pack_blocked_depthwise();
      } else {
        flat_masks_ = flat_plane_masks(g_);
      }
      return;
    }
    // The executor blocks a tensor only where conv_blocked_io says this kernel takes it so.
    require(y_.block == 0 || fast_.ok || epilogue_.empty(), "Conv: output ", y_.name,
            " is blocked but its epilogue is not one the blocked kernel applies");
    if (x_.block != 0 || y_.block != 0 ||
        BlockedDirect::fits(simd_, g_, M, groups_, w.storage == Storage::constant)) {
      blocked_ = std::make_unique<BlockedDirect>(simd_, g_, w_, M, fast_, x_.block != 0,
                                                 y_.block != 0);
      return;
    }
    if (w.storage == Storage::constant) {  // weights packed once; else per block at run time
      for (int64_t gi = 0; gi < groups_; ++gi) {
        packed_.push_back(pack_a_const(simd_, w.f32() + gi * mg * kg, kg, 1, mg, kg));
      }
    }
    // Stride s > 1 on rows that its phases make as wide as the output's: the input is split
    // into the phases its taps read as the kernel runs, and the taps read the phases in place
    // (gemm_reads_panels_in_place) instead of packing an im2col of every other float; only
    // where the split copies at most a quarter of the floats packing wrote (phases / kernel
    // positions), as its copy of a cold input cost more than reading in place saved
    // elsewhere. Same-process A/B, Zen 5, AVX-512, per-step medians, split against packed:
    // ResNet's 7x7 stem 0.87-0.91x (4 phases of 49 taps); its 3x3 convolutions of stride 2
    // (4 of 9) 1.00-1.05x, 1x1 ones (1 of 1) 0.83x at 128 filters, 1.01-1.03x at 512-2048.
    // With the split of stride 2 vectorized (split_phase), 3x3 ones split were 0.93-0.99x
    // alone but 0.97-1.11x in ResNet-18/50 and MobileNetV2, the step sums 0.989-1.003x: the
    // quarter stays.
    const int64_t s = g_.sh;
    if (s > 1 && g_.sw == s && (g_.W + s - 1) / s == g_.OW && !packed_.empty() &&
        gemm_rows_read_b_in_place(simd_, mg)) {
      layout_ = phase_layout(g_, phases_);
      split_ = 4 * static_cast<int64_t>(phases_.size()) <= g_.kh * g_.kw;
    }
    if (split_) {
      split_phase_ = isa_build<&split_phase>(simd_);
      split_input_.resize(static_cast<size_t>(checked_mul(g_.N, layout_.image)));
    } else {
      layout_ = direct_layout(g_);
      phases_.clear();
    }
    tables_ = std::make_unique<Im2colTables>(g_, layout_, C / groups_, simd_.nr);
    // A 1x1 convolution of one image, stride 1, no padding: its im2col is its input.
    pointwise_ = g_.N == 1 && g_.kh == 1 && g_.kw == 1 && g_.sh == 1 && g_.sw == 1 &&
                 g_.pt == 0 && g_.pl == 0 && g_.pb == 0 && g_.pr == 0;
    const int64_t ohw = g_.OH * g_.OW, ncols = g_.N * ohw;
    if (g_.N > 1) {  // images side by side as columns: column j is pixel j % ohw of image j / ohw
      col_off_.resize(static_cast<size_t>(ncols));
      for (int64_t j = 0; j < ncols; ++j) col_off_[j] = (j / ohw) * M_ * ohw + j % ohw;
    }
    // B read in place whole, never packed (gemm.cpp's b_in_place, gemm_reads_panels_in_place).
    b_in_place_ = !packed_.empty() && groups_ == 1 && gemm_rows_read_b_in_place(simd_, mg) &&
                  (pointwise_ ? gemm_reads_b_in_place(ohw, 1)
                              : gemm_reads_panels_in_place(simd_, tables_->view(nullptr),
                                                           col_off_.empty() ? nullptr
                                                                            : col_off_.data(),
                                                           mg, 0, ncols));
  }

  // Depthwise: the epilogue's scratch, then a row of zeros (the padding above and below).
  int64_t workspace_floats() const override {
    if (blocked_) return blocked_->workspace_floats(epilogue_);
    if (!depthwise_) return gemm_workspace_floats(simd_, &epilogue_);
    return epilogue_.scratch_floats() + g_.W;
  }

  void run(ThreadPool& pool, const Workspace& ws) override {
    if (blocked_) {
      blocked_->run(pool, ws, x_.f32(), y_.f32(), epilogue_, fast_);
    } else if (!blocked_w_.empty()) {
      run_blocked_depthwise(pool);
    } else if (depthwise_) {
      run_depthwise(pool, ws);
    } else {
      run_gemm(pool, ws);
    }
  }

 private:
  // The filters of a blocked depthwise convolution as [C / lanes][kh][kw][lanes].
  void pack_blocked_depthwise() {
    const int64_t lanes = simd_.conv_lanes, taps = g_.kh * g_.kw;
    blocked_w_.resize(static_cast<size_t>(checked_mul(g_.C, taps)));
    for (int64_t c = 0; c < g_.C; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        blocked_w_[static_cast<size_t>((c / lanes * taps + t) * lanes + c % lanes)] =
            w_[c * taps + t];
      }
    }
  }

  // Block by block of channels (simd.h BlockedWindow), the epilogue applied as it stores.
  void run_blocked_depthwise(ThreadPool& pool) {
    const int64_t lanes = simd_.conv_lanes, taps = g_.kh * g_.kw;
    const bool scaled = !fast_.row_scale.empty();
    BlockedWindow a = blocked_window_of(g_);
    a.residual = fast_.residual;
    a.lo = fast_.lo;
    a.hi = fast_.hi;
    run_blocked_window(pool, simd_, g_, lanes, x_.f32(), y_.f32(), a,
                       [&](BlockedWindow& row, int64_t b) {
      row.w = blocked_w_.data() + b * taps * lanes;
      if (scaled) {
        row.scale = fast_.row_scale.data() + b * lanes;
        row.bias = fast_.row_bias.data() + b * lanes;
      }
    });
  }

  void run_depthwise(ThreadPool& pool, const Workspace& ws) {
    const int64_t planes = g_.N * g_.C, ohw = g_.OH * g_.OW;
    const int64_t work = planes * ohw * g_.kh * g_.kw;
    pool.for_range(planes, pool.chunk_for(planes),
                   [&](int tid, int64_t begin, int64_t end) {
      float* scratch = ws.get(tid);
      // Set up once, then per plane its pointers and constants: on 7x7 planes of 960
      // channels the whole set-up per plane was 9% of the samples.
      DepthwiseArgs a{nullptr, nullptr, nullptr, g_.H, g_.W, g_.OH, g_.OW, g_.kh, g_.kw,
                      g_.sh, g_.sw, g_.pt, g_.pl, g_.dh, g_.dw,
                      scratch + epilogue_.scratch_floats(), dw_fused_, 1.0f, 0.0f, fast_.lo,
                      fast_.hi, flat_masks_.empty() ? nullptr : flat_masks_.data()};
      const bool scaled = dw_fused_ && !fast_.row_scale.empty();
      for (int64_t p = begin; p < end; ++p) {
        const int64_t c = p % g_.C;
        a.in = x_.f32() + p * g_.H * g_.W;
        a.out = y_.f32() + p * ohw;
        a.w = w_ + c * g_.kh * g_.kw;
        if (scaled) {
          a.scale = fast_.row_scale[static_cast<size_t>(c)];
          a.bias = fast_.row_bias[static_cast<size_t>(c)];
        }
        simd_.depthwise(a);
        if (!dw_fused_) epilogue_.apply(simd_, a.out, p * ohw, ohw, scratch);
      }
    }, work);
  }

  // The input's phases (phase_layout), plane by plane.
  void split(ThreadPool& pool) {
    const int64_t count = static_cast<int64_t>(phases_.size()), planes = g_.N * g_.C * count;
    const int64_t floats = layout_.rows * layout_.cols, s = g_.sh;
    pool.for_range(planes, pool.chunk_for(planes), [&](int, int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t phase = phases_[static_cast<size_t>(p % count)];
        split_phase_(x_.f32() + p / count * g_.H * g_.W, g_.H, g_.W, s, phase / s, phase % s,
                     layout_.rows, layout_.cols, split_input_.data() + p * floats);
      }
    }, planes * floats);
  }

  void run_gemm(ThreadPool& pool, const Workspace& ws) {
    if (split_) split(pool);
    const float* input = split_ ? split_input_.data() : x_.f32();
    const int64_t ohw = g_.OH * g_.OW, ncols = g_.N * ohw;
    const int64_t mg = M_ / groups_, cg = g_.C / groups_;
    // Each chunk packs its own panels of B (the im2col); split by rows, each chunk packs all of
    // B again, so rows are cut one chunk a thread, and only when the panels are too few to
    // share out evenly (a 7x7 plane: 2 panels; 14x14: 7, of which the last holds 4 columns),
    // or when B is read in place (nothing packed twice) and each thread's columns would be
    // under four panels: then each chunk of columns streamed all of A again, from L3 where A
    // outgrew L2. Same-process A/B, 2 threads, Zen 5, AVX-512, per-step medians, rows against
    // columns: ResNet-18's and ResNet-50's 14 x 14 3x3 convolutions (256 x 2304 x 196)
    // 0.92-0.94x, ResNet-50's 14 x 14 1x1 ones 0.89-0.94x, MobileNetV2's 0.91-0.94x; the
    // step sums 0.975x, 0.972x and 0.96-0.98x. (ResNet-50's 28 x 28 ones, by rows, were
    // 1.07-1.12x: there A fits L2.)
    const int64_t threads = pool.size();
    const bool few_cols = ncols < int64_t{4} * simd_.nr * threads;
    const bool rows_share_b = b_in_place_ && mg >= int64_t{2} * simd_.mr * threads;
    const bool by_cols = ncols >= int64_t{2} * simd_.nr * threads && !(few_cols && rows_share_b);
    const int64_t work = M_ * ncols * cg * g_.kh * g_.kw;
    const int64_t total = by_cols ? ncols : mg;
    const int64_t chunk = by_cols ? pool.chunk_for(ncols, simd_.nr)
                                  : pool.chunk_for(mg, simd_.mr, 1);
    pool.for_range(total, chunk, [&](int tid, int64_t begin, int64_t end) {
      const Range cols = by_cols ? Range{begin, end} : Range{0, ncols};
      const Range rows = by_cols ? Range{0, mg} : Range{begin, end};
      for (int64_t gi = 0; gi < groups_; ++gi) {
        const Im2col im = tables_->view(input + gi * cg * layout_.channel);
        const int64_t kg = cg * g_.kh * g_.kw;
        GemmA a;
        if (packed_.empty()) {
          a.p = w_ + gi * mg * kg;
          a.rs = kg;
          a.cs = 1;
        } else {
          a.packed = &packed_[static_cast<size_t>(gi)];
        }
        GemmB b;
        if (pointwise_) {  // the group's input planes are B itself, K rows of ohw columns
          b.p = x_.f32() + gi * cg * ohw;
          b.rs = ohw;
          b.cs = 1;
          b.in_place = true;
        } else {
          b.im2col = &im;
        }
        GemmC c;
        c.p = y_.f32() + gi * mg * ohw;
        c.ldc = ohw;
        c.col_off = col_off_.empty() ? nullptr : col_off_.data();
        c.epilogue = &epilogue_;
        c.out_base = y_.f32();
        c.fast = fast_.ok && kg > 0 ? &fast_ : nullptr;
        c.row0 = gi * mg;
        gemm(simd_, mg, ncols, kg, a, b, c, rows.begin, rows.end, cols.begin,
             cols.end, ws.get(tid));
      }
    }, work);
  }

  Window2d g_{};
  int64_t groups_ = 1, M_ = 0;
  bool depthwise_ = false, dw_fused_ = false, pointwise_ = false, b_in_place_ = false;
  EwProgram epilogue_;
  FastEpilogue fast_;
  const float* w_ = nullptr;
  std::vector<PackedOperand> packed_;
  bool split_ = false;
  TapLayout layout_;
  std::vector<int64_t> phases_;
  HugeVector<float> split_input_;
  SplitPhaseFn split_phase_ = nullptr;
  std::unique_ptr<Im2colTables> tables_;
  std::vector<int64_t> col_off_;
  std::vector<uint32_t> flat_masks_;
  std::unique_ptr<BlockedDirect> blocked_;
  HugeVector<float> blocked_w_;  // a blocked depthwise convolution's (pack_blocked_depthwise)
};

// Blocked tensors for a Conv a blocked kernel can run (2-D, constant weights, one group or
// depthwise: BlockedDirect, BlockedWindow): an input of whole blocks of channels; an output
// of whole blocks whose epilogue the kernel applies as it stores (FastEpilogue without a
// column bias), its residual a tensor of the output's shape. One group also from a planar
// input, as the copy into blocks starts a run of blocked convolutions, where its channels
// fill the blocks: a multiple of the lanes, or one block of fewer. (Zen 4, AVX-512, 1 thread:
// MobileNetV2's 1x1 convolutions from 24 channels, a block and a half, ran 1.35x slower
// blocked than by the GEMM. Its stem of 3 channels, 27 terms, alone and planar out, took 1.36x
// ONNX Runtime's time blocked and 1.22-1.24x by the GEMM; in the model, writing blocked, 323 us
// against the GEMM's 343, and its two successors no longer copied: 7.0 ms against 7.5-7.7.)
BlockedIo conv_blocked_io(const KernelContext& ctx) {
  const int64_t lanes = ctx.simd.conv_lanes;
  if (lanes == 0 || ctx.inputs() < 2 || ctx.spec.outputs.size() != 1) return {};
  const Tensor &x = ctx.input(0), &w = ctx.input(1), &y = ctx.output(0);
  if (x.rank() != 4 || w.rank() != 4 || y.rank() != 4 || x.dtype != DType::f32 ||
      y.dtype != DType::f32 || w.storage != Storage::constant) {
    return {};
  }
  const int64_t groups = ctx.attr("group", 1);
  const bool depthwise = groups > 1 && groups == x.dim(1) && y.dim(1) == groups;
  if (groups != 1 && !depthwise) return {};
  BlockedIo io;
  io.reads = whole_channel_blocks(x, lanes);
  io.to_planar = !depthwise;  // a depthwise one reads and writes blocked or neither
  io.from_planar = !depthwise && (io.reads || x.dim(1) < lanes);
  if (!whole_channel_blocks(y, lanes)) return io;
  const EwProgram epilogue(ctx, y.shape);
  if (epilogue.empty()) {
    io.writes = true;
    return io;
  }
  const FastEpilogue fast = epilogue.fast(1, y.dim(1), false);
  if (!fast.ok || fast.col_bias != nullptr) return io;
  if (fast.residual_operand >= 0) {
    const int id = ctx.spec.operands[static_cast<size_t>(fast.residual_operand)].tensor;
    if (ctx.tensors[static_cast<size_t>(id)].shape != y.shape) return io;
    io.tied.push_back(id);
  }
  io.writes = true;
  return io;
}

}  // namespace

void register_conv(KernelRegistry& r) {
  add_kernel(r, "Conv", make_kernel<ConvKernel>(), conv_blocked_io);
}

}  // namespace onnxlens
