#include "threadpool.h"

#include <algorithm>
#include <chrono>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

namespace onnxlens {

namespace {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waits for `done` to hold: spinning first (yielding the core at once would hand it to another
// process of a loaded machine, for a whole time slice), then yielding.
template <typename F>
void wait_until(F done) {
  for (int i = 0; !done(); ++i) {
    if (i < 20000) {
      relax();
    } else {
      std::this_thread::yield();
    }
  }
}

// How long a worker spins for the next job before it sleeps: longer than the gap between two
// kernels of a model, so that a run does not wait for threads to be woken.
constexpr auto kSpin = std::chrono::milliseconds(2);

// Names a worker (top -H, gdb) and pins it to the tid-th CPU the process may use, when there
// are enough for every thread. Left free, the worker of a run that follows 50 ms of idle often
// joined milliseconds late (where the scheduler put it was not traced): MobileNetV2 at 2
// threads, runs 50 ms apart, median 8.4 ms free against 2.7 pinned (1 thread: 4.5).
void name_and_pin(std::thread& worker, int tid, int threads) {
#ifdef __linux__
  pthread_setname_np(worker.native_handle(), "onnxlens-pool");
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < threads) {
    return;
  }
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && seen++ == tid) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(worker.native_handle(), sizeof(one), &one);
      return;
    }
  }
#else
  (void)worker;
  (void)tid;
  (void)threads;
#endif
}
}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  for (int tid = 1; tid < threads_; ++tid) {
    workers_.emplace_back([this, tid] { worker(tid); });
    name_and_pin(workers_.back(), tid, threads_);
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a worker between its check and its wait
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::chunk_for(int64_t total, int64_t align, int64_t per_thread) const {
  const int64_t parts = std::max<int64_t>(per_thread, 1) * threads_;
  const int64_t chunk = (total + parts - 1) / parts;
  return std::max<int64_t>(align, (chunk + align - 1) / align * align);
}

void ThreadPool::for_range(int64_t total, int64_t chunk, const RangeFn& f, int64_t work) {
  if (total <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  if (threads_ == 1 || work < kMinParallelWork || total <= chunk) {
    f(0, 0, total);
    return;
  }
  // No worker is active (the last job waited for that): the job's fields are ours to write.
  fn_ = &f;
  total_ = total;
  chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t job = generation_.load(std::memory_order_relaxed) + 1;
  open_.store(job);  // publishes the fields to a worker that reads open_ == job
  generation_.store(job);
  // A worker counts itself a sleeper before it last checks generation_, and this reads
  // sleepers_ after the store: one of the two sees the other (both sequentially consistent).
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }  // a sleeper between its check and its wait
    wake_.notify_all();
  }
  drain(0);
  wait_until([&] { return done_.load(std::memory_order_acquire) >= total; });
  // Closed before counting the active: a worker counts itself active before it reads open_,
  // so it either is counted here or finds the job closed (the same pairing as above).
  open_.store(0);
  wait_until([&] { return active_.load() == 0; });
}

void ThreadPool::wake() {
  if (sleepers_.load() == 0) return;  // a worker about to sleep misses this: harmless
  wakes_.fetch_add(1);
  { std::lock_guard<std::mutex> lock(mutex_); }  // a sleeper between its check and its wait
  wake_.notify_all();
}

void ThreadPool::drain(int tid) {
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_);
    if (begin >= total_) return;
    const int64_t end = std::min(begin + chunk_, total_);
    (*fn_)(tid, begin, end);
    done_.fetch_add(end - begin, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker(int tid) {
  uint64_t seen = 0;
  for (;;) {
    auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
      relax();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() >= until) {
        const uint64_t woken = wakes_.load();
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load() != seen || wakes_.load() != woken; });
        sleepers_.fetch_sub(1);
        until = std::chrono::steady_clock::now() + kSpin;  // a job, or wake(): spin for one
      }
    }
    if (stop_.load()) return;
    seen = generation_.load();
    active_.fetch_add(1);
    if (open_.load() == seen) drain(tid);  // else that job closed, or a newer one opened
    active_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace onnxlens
