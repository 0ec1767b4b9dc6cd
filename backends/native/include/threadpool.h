// A fixed set of worker threads; the calling thread takes part as thread 0.
//
// `for_range(total, chunk, f, work)` runs f(tid, begin, end) over [0, total) in chunks that
// the threads claim one at a time, so a thread the OS has not scheduled yet (a shared, loaded
// machine) holds nobody up: the others take its share. It returns when every chunk is done.
// Workers spin briefly between jobs (kernels come back to back), then sleep; worker t runs on
// the t-th CPU the process may use, when there is one for every thread. Handing out a job
// takes no lock unless a worker sleeps: one kernel of a small model lasts a few microseconds.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace onnxlens {

using RangeFn = std::function<void(int tid, int64_t begin, int64_t end)>;

struct Range {
  int64_t begin, end;
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // `work` (about one unit per multiply-add or element touched): below kMinParallelWork the
  // calling thread does it all, as waking the others would cost more.
  void for_range(int64_t total, int64_t chunk, const RangeFn& f, int64_t work);
  // A chunk size giving each thread about `per_thread` chunks, a multiple of `align`. A GEMM
  // whose every chunk packs the whole operand it does not split asks for one chunk a thread,
  // so that the operand is packed once a thread, not once a chunk.
  int64_t chunk_for(int64_t total, int64_t align = 1, int64_t per_thread = 4) const;
  // Wakes sleeping workers without a job, to spin for the next one: a run calls it before it
  // copies its inputs in, so that the OS's wake-up (about a millisecond on a loaded host)
  // overlaps that copy instead of delaying the first parallel kernel.
  void wake();

  static constexpr int64_t kMinParallelWork = 1 << 15;

 private:
  void worker(int tid);
  void drain(int tid);

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;  // only for sleeping workers and their wake-up
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // the latest job's number
  std::atomic<uint64_t> open_{0};        // the number of the job workers may join, 0: none
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::atomic<uint64_t> wakes_{0};  // calls to wake() that found a sleeper
  // The open job: written by the calling thread while no worker is active, read by workers
  // that joined it (open_ names it).
  const RangeFn* fn_ = nullptr;
  int64_t total_ = 0, chunk_ = 1;
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  alignas(64) std::atomic<int> active_{0};
};

}  // namespace onnxlens
