// The executor's buffers (arena, scratch, per-thread workspace, packed weights): aligned to a
// cache line, and the large ones on transparent huge pages.
//
// Every buffer starts on a 64-byte line, and plan.py's offsets are multiples of 64, so every
// tensor starts on a line. Before, new[] gave 16-byte alignment: a large block from malloc
// starts 16 bytes into a page, and each 64-byte vector load and store of every activation
// split across two lines (in some processes: where malloc's threshold put the arena on the
// heap its alignment was chance, one source of run-to-run spread).
//
// A buffer of 2 MiB or more is aligned to 2 MiB and advised MADV_HUGEPAGE: Linux backs it with
// 2 MiB pages where transparent huge pages are on "madvise" (the common default) or "always",
// and elsewhere ignores the advice. A GEMM reading a convolution's input in place walks one
// 4 KiB page per K row (a 56 x 56 plane is 12 KiB), and each layer streams its packed weights.
//
// Old build against new, 4 rounds of 25 runs, 1 thread, Zen 5, AVX-512, median step sums:
// ResNet-18 1.003x (noise), ResNet-50 0.984x, MobileNetV2 0.987x. Huge pages alone (both
// arms aligned, same process): 0.992-0.996x.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace onnxlens {

inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr std::align_val_t kLine{64};  // plan.py's CACHE_LINE

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding, as allocators do

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return static_cast<T*>(::operator new(bytes, kLine));
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: its failure leaves 4 KiB pages
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePage) {
      ::operator delete(p, kLine);
    } else {
      std::free(p);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace onnxlens
