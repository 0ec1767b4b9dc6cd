// Add, Sub and Mul of one element type as numpy computes them: integers wrap around modulo
// 2^bits (int32 2^30 + 2^30 is -2^31), floats round once. The integer operation runs on the
// values' two's-complement bits as uint64_t, whose arithmetic is modular, and keeps the low
// bits: signed overflow, undefined behavior in C++, never happens, and a small type's product
// (uint16 x uint16, promoted to int) never overflows int either.
#pragma once

#include <cstdint>
#include <type_traits>

namespace onnxlens {

enum class Arith { Add, Sub, Mul };

template <typename T>
inline T wrapping(Arith op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    const auto x = static_cast<uint64_t>(a), y = static_cast<uint64_t>(b);
    return static_cast<T>(op == Arith::Add ? x + y : op == Arith::Sub ? x - y : x * y);
  } else {
    return op == Arith::Add ? a + b : op == Arith::Sub ? a - b : a * b;
  }
}

}  // namespace onnxlens
