// Checked arithmetic and the two errors the core raises.
//
// Every size, offset and index that comes from a plan is computed with these helpers before any
// memory is allocated or touched: an overflow or a negative dimension is a PlanError, never a
// wrapped value.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxlens {

// A plan that is malformed (bad shape, size, offset, attribute): raised before anything runs.
class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure while running (an index out of range in a Gather, a wrong input shape).
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <typename... Parts>
void require(bool ok, const Parts&... parts) {
  if (!ok) throw PlanError(cat(parts...));
}

inline int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) {
    throw PlanError(cat("size overflow or negative size: ", a, " * ", b));
  }
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw PlanError(cat("size overflow: ", a, " + ", b));
  return r;
}

inline int64_t checked_product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    require(d >= 0, "negative dimension ", d);
    n = checked_mul(n, d);
  }
  return n;
}

inline std::string show(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  out << ']';
  return out.str();
}

}  // namespace onnxlens
