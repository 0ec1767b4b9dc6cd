// The geometry of a 1-D or 2-D convolution or pooling window, checked against the tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel.h"

namespace onnxlens {

struct Window2d {
  int64_t N, C, H, W;      // input (a 1-D input has H = 1)
  int64_t OH, OW;          // output
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t pt, pl, pb, pr;  // pads: top, left, bottom, right
};

// Reads strides / pads / dilations (ONNX order: begins then ends) for a window of `kernel`
// over `x` (rank 3 or 4) and checks that the output is `y_spatial`; `ceil` rounds the output
// size up (pooling's ceil_mode).
Window2d window_2d(const KernelContext& ctx, const Tensor& x,
                   const std::vector<int64_t>& kernel, const std::vector<int64_t>& y_shape,
                   bool ceil = false);

}  // namespace onnxlens
