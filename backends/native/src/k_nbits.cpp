// MatMulNBits (ONNX Runtime's contrib op) with 4-bit weights: y = A · Wᵀ (+ bias), the weight
// kept at half a byte a value. The planner lays it out by block and byte, columns inner
// ([blocks, block / 2, N] bytes: byte t of a block holds values 2t (low nibble) and 2t + 1 of
// every column), and each block's scale and zero point as [blocks, N]: every loop here runs
// along contiguous columns, so the compiler vectorizes the dequantization (w = (q - zero) ·
// scale) and the products. Compiled for each instruction set as the SIMD table is (the one
// ONNXLENS_NATIVE_ISA picks is used).
//
// At accuracy level 4 the activations are quantized as ONNX Runtime's CompInt8 (MLAS) does
// them: per row and block of A, scale = max |a| / 127 and a_q = round(a · 127 / max |a|) in
// int8. The kernel multiplies a_q · scale (the int8 value it stands for) in float32: the same
// products up to rounding, on the float path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel.h"
#include "nbits.h"

namespace onnxlens {

namespace {

constexpr int64_t kCols = 128;  // columns a task owns at a time
constexpr int64_t kGroup = 16;  // values of K taken together (8 bytes of a block)
// Up to this many rows of A read the bytes themselves (kernel_model.py NBITS_DIRECT_ROWS).
constexpr int64_t kDirectRows = 2;
constexpr float kRound = 12582912.0f;  // 1.5 · 2^23

struct Chunk {
  const float* a;        // A, rows x k
  const uint8_t* q;      // the packed weight at column n0, row stride n
  const float* scales;   // [blocks, n] at column n0
  const float* zeros;
  float* y;              // y at column n0, row stride n
  int64_t rows, k, n, cols, block;
};

// A row's kGroup values of A (zeros past the block's end) and their sum.
inline float group_of(const float* a, int64_t here, float* x) {
  float sum = 0.0f;
  for (int64_t r = 0; r < kGroup; ++r) {
    x[r] = r < here ? a[r] : 0.0f;
    sum += x[r];
  }
  return sum;
}

// y[m, c] += Σ_k a[m, k] · w(k, c), w = (q - zero) · scale, kGroup values of K (one block's)
// at a time: y += scale · (Σ x · q - zero · Σ x). With a few rows (a decode step) each row
// reads the bytes itself; with more, the group's q are converted to floats once, into `w`,
// and each row's pass reads those.
__attribute__((always_inline)) inline void accumulate(const Chunk& c) {
  const int64_t blocks = (c.k + c.block - 1) / c.block, blob = c.block / 2;
  const bool direct = c.rows <= kDirectRows;
  alignas(64) float w[kGroup][kCols];
  alignas(64) float acc[kCols];
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t len = std::min(c.block, c.k - j * c.block);
    const float* sc = c.scales + j * c.n;
    const float* zp = c.zeros + j * c.n;
    for (int64_t g = 0; g < len; g += kGroup) {
      const int64_t here = std::min(kGroup, len - g), bytes = (here + 1) / 2;
      const uint8_t* q = c.q + (j * blob + g / 2) * c.n;  // byte t of the group at q + t * n
      if (!direct) {
        for (int64_t t = 0; t < kGroup / 2; ++t) {
          for (int64_t i = 0; i < c.cols; ++i) {
            const uint8_t b = t < bytes ? q[t * c.n + i] : 0;
            w[2 * t][i] = static_cast<float>(b & 15);
            w[2 * t + 1][i] = static_cast<float>(b >> 4);
          }
        }
      }
      for (int64_t m = 0; m < c.rows; ++m) {
        float x[kGroup];
        const float sum = group_of(c.a + m * c.k + j * c.block + g, here, x);
        float* y = c.y + m * c.n;
        if (direct) {
          std::fill(acc, acc + c.cols, 0.0f);
          for (int64_t t = 0; t < bytes; ++t) {
            const uint8_t* b = q + t * c.n;
            const float lo = x[2 * t], hi = x[2 * t + 1];
            for (int64_t i = 0; i < c.cols; ++i) {
              acc[i] += lo * static_cast<float>(b[i] & 15) + hi * static_cast<float>(b[i] >> 4);
            }
          }
          for (int64_t i = 0; i < c.cols; ++i) y[i] += sc[i] * (acc[i] - zp[i] * sum);
          continue;
        }
        for (int64_t i = 0; i < c.cols; ++i) {
          float acc = 0.0f;
          for (int64_t r = 0; r < kGroup; ++r) acc += x[r] * w[r][i];
          y[i] += sc[i] * (acc - zp[i] * sum);
        }
      }
    }
  }
}

using AccumulateFn = void (*)(const Chunk&);

}  // namespace

void nbits_product(const SimdKernels& simd, ThreadPool& pool, const float* a, int64_t rows,
                   const NbitsWeight& w, const float* bias, float* y) {
  const AccumulateFn accumulate_fn = isa_build<&accumulate>(simd);
  const int64_t tasks = (w.n + kCols - 1) / kCols;
  pool.for_range(tasks, pool.chunk_for(tasks), [&](int, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kCols, cols = std::min(kCols, w.n - n0);
      for (int64_t m = 0; m < rows; ++m) {
        float* row = y + m * w.n + n0;
        if (bias) {
          std::memcpy(row, bias + n0, static_cast<size_t>(cols) * sizeof(float));
        } else {
          std::fill(row, row + cols, 0.0f);
        }
      }
      accumulate_fn({a, w.packed + n0, w.scales + n0, w.zeros + n0, y + n0, rows, w.k, w.n,
                     cols, w.block});
    }
  }, rows * w.k * w.n * 2);
}

namespace {

// Inputs: A (float32 [..., K]), B (uint8 [blocks, block / 2, N]), scales and zero points
// (float32 [blocks, N]), bias (float32 [N], or -1). Ints: K, N, block_size, accuracy_level.
class MatMulNBitsKernel : public Kernel {
 public:
  explicit MatMulNBitsKernel(const KernelContext& ctx)
      : simd_(ctx.simd),
        a_(ctx.input(0)), y_(ctx.output(0)),
        k_(ctx.attr("K", 0)), n_(ctx.attr("N", 0)), block_(ctx.attr("block_size", 0)) {
    ctx.expect_arity(4, 5, 1);
    require(k_ > 0 && n_ > 0 && block_ >= 2 && block_ % 2 == 0, "MatMulNBits: K ", k_, ", N ",
            n_, ", block_size ", block_);
    blocks_ = (k_ + block_ - 1) / block_;
    require(a_.dtype == DType::f32 && y_.dtype == DType::f32 && a_.rank() >= 1 &&
                a_.dim(a_.rank() - 1) == k_,
            "MatMulNBits: A ", show(a_.shape), " for K ", k_);
    rows_ = a_.numel / k_;
    require(y_.numel == rows_ * n_ && y_.rank() >= 1 && y_.dim(y_.rank() - 1) == n_,
            "MatMulNBits: output ", show(y_.shape), " for ", rows_, " rows of ", n_);
    const Tensor& b = ctx.input(1);
    require(b.dtype == DType::u8 && b.numel == blocks_ * (block_ / 2) * n_,
            "MatMulNBits: weight ", show(b.shape), " ", dtype_name(b.dtype), " for ", blocks_,
            " blocks of ", block_, " 4-bit values by ", n_, " columns");
    packed_ = b.as<uint8_t>();
    scales_ = per_block(ctx, 2, "scales");
    zeros_ = per_block(ctx, 3, "zero points");
    if (ctx.attr("accuracy_level", 0) == 4) int8_a_.resize(static_cast<size_t>(rows_ * k_));
    if (ctx.has_input(4)) {
      require(ctx.input(4).dtype == DType::f32 && ctx.input(4).numel == n_,
              "MatMulNBits: bias ", show(ctx.input(4).shape), " for N ", n_);
      bias_ = ctx.input(4).f32();
    }
  }

  void run(ThreadPool& pool, const Workspace&) override {
    if (!int8_a_.empty()) quantize_a();
    const float* a = int8_a_.empty() ? a_.f32() : int8_a_.data();
    nbits_product(simd_, pool, a, rows_, {packed_, scales_, zeros_, k_, n_, block_}, bias_,
                  y_.f32());
  }

 private:
  // Each row's blocks of A in int8 as MLAS's QuantizeARow_CompInt8 (scale max|a| / 127, values
  // a · (127 / max|a|) rounded to nearest even), stored as the floats they stand for.
  void quantize_a() {
    for (int64_t m = 0; m < rows_; ++m) {
      for (int64_t j = 0; j < blocks_; ++j) {
        const int64_t begin = m * k_ + j * block_, len = std::min(block_, k_ - j * block_);
        const float* a = a_.f32() + begin;
        float amax = 0.0f;
        for (int64_t r = 0; r < len; ++r) amax = std::max(amax, std::fabs(a[r]));
        const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int64_t r = 0; r < len; ++r) {
          // Round to nearest even by the float adder (|x| <= 127 < 2^22): nearbyint is a libm
          // call at the baseline ISA.
          const float v = (a[r] * inverse + kRound) - kRound;
          int8_a_[static_cast<size_t>(begin + r)] = v * (amax / 127.0f);
        }
      }
    }
  }

  const float* per_block(const KernelContext& ctx, int i, const char* what) const {
    const Tensor& t = ctx.input(i);
    require(t.dtype == DType::f32 && t.numel == blocks_ * n_, "MatMulNBits: ", what, " ",
            show(t.shape), " for ", blocks_, " blocks by ", n_, " columns");
    return t.f32();
  }

  const SimdKernels& simd_;
  const Tensor& a_;
  const Tensor& y_;
  int64_t k_, n_, block_, blocks_ = 0, rows_ = 0;
  const uint8_t* packed_ = nullptr;
  const float* scales_ = nullptr;
  const float* zeros_ = nullptr;
  const float* bias_ = nullptr;
  std::vector<float> int8_a_;  // accuracy level 4: A as its int8 values (quantize_a)
};

// GatherBlockQuantized (ONNX Runtime's contrib op) with uint8 data: rows of a table quantized in
// blocks along its last axis, the picked ones dequantized, y = (q - zero) · scale. Inputs: the
// table as the model has it (uint8 [rows, ..., K · bits / 8], 8 / bits values a byte, lowest
// first: gather axis 0, quantize axis last, as ORT requires of uint8 data), indices (int32 /
// int64), scales (float32 [rows, ..., blocks]) and zero points (float32, that shape; absent:
// 2^(bits - 1), MatMulNBits' convention). Ints: bits, block_size. An index outside [-rows,
// rows) gives a row of zeros, as ORT's kernel does.
class GatherBlockQuantizedKernel : public Kernel {
 public:
  explicit GatherBlockQuantizedKernel(const KernelContext& ctx)
      : data_(ctx.input(0)), idx_(ctx.input(1)), y_(ctx.output(0)),
        bits_(ctx.attr("bits", 4)), block_(ctx.attr("block_size", 0)) {
    ctx.expect_arity(3, 4, 1);
    require(bits_ == 2 || bits_ == 4 || bits_ == 8, "GatherBlockQuantized: bits ", bits_);
    require(block_ > 0, "GatherBlockQuantized: block_size ", block_);
    require(data_.dtype == DType::u8 && data_.rank() >= 2 && data_.dim(0) > 0,
            "GatherBlockQuantized: data ", show(data_.shape), " ", dtype_name(data_.dtype));
    require(idx_.dtype == DType::i64 || idx_.dtype == DType::i32,
            "GatherBlockQuantized: indices must be int32 or int64");
    require(y_.dtype == DType::f32 && y_.rank() >= 1, "GatherBlockQuantized: output must be f32");
    rows_ = data_.dim(0);
    k_ = y_.dim(y_.rank() - 1);
    const int64_t per_byte = 8 / bits_;
    bytes_ = (k_ + per_byte - 1) / per_byte;
    require(data_.dim(data_.rank() - 1) == bytes_, "GatherBlockQuantized: data ",
            show(data_.shape), " for ", k_, " values of ", bits_, " bits a row");
    lines_ = data_.numel / (rows_ * bytes_);  // quantized rows of K in one gathered row
    blocks_ = (k_ + block_ - 1) / block_;
    require(y_.numel == idx_.numel * lines_ * k_, "GatherBlockQuantized: output ",
            show(y_.shape), " for ", idx_.numel, " indices of ", lines_, " x ", k_);
    scales_ = per_block(ctx, 2, "scales");
    if (ctx.has_input(3)) zeros_ = per_block(ctx, 3, "zero points");
  }

  void run(ThreadPool&, const Workspace&) override {
    const int64_t per_byte = 8 / bits_;
    // per_byte is 1, 2 or 4: value k is byte k >> log2(per_byte), bits (k & (per_byte - 1))
    // x bits_ up (shifts, where a division by a run-time count took 4 ns a value).
    const int byte_shift = per_byte == 4 ? 2 : per_byte == 2 ? 1 : 0;
    const int mask = (1 << bits_) - 1;
    const float midpoint = static_cast<float>(1 << (bits_ - 1));
    for (int64_t i = 0; i < idx_.numel; ++i) {
      int64_t v = idx_.dtype == DType::i64 ? idx_.as<int64_t>()[i] : idx_.as<int32_t>()[i];
      if (v < 0) v += rows_;
      float* y = y_.f32() + i * lines_ * k_;
      if (v < 0 || v >= rows_) {
        std::fill(y, y + lines_ * k_, 0.0f);
        continue;
      }
      for (int64_t l = 0; l < lines_; ++l, y += k_) {
        const int64_t line = v * lines_ + l;
        const uint8_t* q = data_.as<uint8_t>() + line * bytes_;
        const float* sc = scales_ + line * blocks_;
        const float* zp = zeros_ ? zeros_ + line * blocks_ : nullptr;
        for (int64_t j = 0; j < blocks_; ++j) {
          const float zero = zp ? zp[j] : midpoint, scale = sc[j];
          for (int64_t k = j * block_; k < std::min(k_, (j + 1) * block_); ++k) {
            const int shift = static_cast<int>((k & (per_byte - 1)) * bits_);
            y[k] = (static_cast<float>((q[k >> byte_shift] >> shift) & mask) - zero) * scale;
          }
        }
      }
    }
  }

 private:
  const float* per_block(const KernelContext& ctx, int i, const char* what) const {
    const Tensor& t = ctx.input(i);
    require(t.dtype == DType::f32 && t.numel == rows_ * lines_ * blocks_,
            "GatherBlockQuantized: ", what, " ", show(t.shape), " for ", rows_ * lines_,
            " rows of ", blocks_, " blocks");
    return t.f32();
  }

  const Tensor& data_;
  const Tensor& idx_;
  const Tensor& y_;
  int64_t bits_, block_, rows_ = 0, k_ = 0, lines_ = 0, blocks_ = 0;
  int64_t bytes_ = 0;  // a line's packed K values
  const float* scales_ = nullptr;
  const float* zeros_ = nullptr;
};

}  // namespace

void register_nbits(KernelRegistry& r) {
  add_kernel(r, "MatMulNBits", make_kernel<MatMulNBitsKernel>());
  add_kernel(r, "GatherBlockQuantized", make_kernel<GatherBlockQuantizedKernel>());
}

}  // namespace onnxlens
