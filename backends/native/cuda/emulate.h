// The CPU emulator of a kernel written as launch.h describes: the grid's blocks one after
// another; in a block, phase p of every thread before phase p + 1 of any (the barrier).
//
// Shared memory starts as NaN bytes, so a thread that reads what no thread wrote shows up in
// the result. `reverse` runs the threads of each phase in the opposite order: a kernel whose
// result depends on the order has a race between threads of one phase, and a test that runs
// both orders sees two different results.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "launch.h"

namespace onnxlens::cuda {

template <class K>
void emulate(const typename K::Args& args, bool reverse = false) {
  const Dim3 grid = K::grid(args), block = K::block(args);
  const int threads = volume(block), phases = K::phases(args);
  auto shared = std::make_unique<typename K::Shared>();
  std::vector<typename K::Regs> regs(static_cast<size_t>(threads));
  Thread t;
  t.grid = grid;
  t.dim = block;
  for (int bz = 0; bz < grid.z; ++bz) {
    for (int by = 0; by < grid.y; ++by) {
      for (int bx = 0; bx < grid.x; ++bx) {
        t.block = Dim3{bx, by, bz};
        std::memset(static_cast<void*>(shared.get()), 0xff, sizeof(typename K::Shared));
        for (auto& r : regs) r = typename K::Regs{};
        for (int p = 0; p <= phases; ++p) {
          for (int i = 0; i < threads; ++i) {
            const int id = reverse ? threads - 1 - i : i;
            t.thread = Dim3{id % block.x, id / block.x % block.y, id / (block.x * block.y)};
            if (p < phases) {
              K::phase(args, t, p, *shared, regs[static_cast<size_t>(id)]);
            } else {
              K::finish(args, t, *shared, regs[static_cast<size_t>(id)]);
            }
          }
        }
      }
    }
  }
}

}  // namespace onnxlens::cuda
