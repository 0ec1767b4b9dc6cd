// A fixed set of worker threads; the calling thread is worker 0.
//
// `run(f)` calls f(tid, n) on every worker (tid 0..n-1) and returns when all have returned; the
// kernels split their work by tid. Workers spin briefly between jobs (kernels come back to back)
// and then sleep, so an idle executor costs nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace onnxlens {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  void run(const std::function<void(int tid, int n)>& job);

 private:
  void worker(int tid);

  int threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// [begin, end) of part `tid` of `n` equal parts of [0, total), each a multiple of `align`.
struct Range {
  int64_t begin, end;
};
Range split_range(int64_t total, int tid, int n, int64_t align = 1);

}  // namespace onnxlens
