#include "threadpool.h"

#include <algorithm>
#include <chrono>

namespace onnxlens {

namespace {
// How long a worker spins for the next job before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(200);
}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  for (int tid = 1; tid < threads_; ++tid) workers_.emplace_back([this, tid] { worker(tid); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& job) {
  if (threads_ == 1) {
    job(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    pending_.store(threads_ - 1);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  job(0, threads_);
  while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadPool::worker(int tid) {
  uint64_t seen = 0;
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (generation_.load(std::memory_order_acquire) == seen &&
           std::chrono::steady_clock::now() < until) {
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    if (stop_.load()) return;
    const std::function<void(int, int)>* job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_.load();
      job = job_;
    }
    (*job)(tid, threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

Range split_range(int64_t total, int tid, int n, int64_t align) {
  const int64_t units = (total + align - 1) / align;
  const int64_t per = units / n, extra = units % n;
  const int64_t begin = tid * per + std::min<int64_t>(tid, extra);
  const int64_t count = per + (tid < extra ? 1 : 0);
  return {std::min(total, begin * align), std::min(total, (begin + count) * align)};
}

}  // namespace onnxlens
