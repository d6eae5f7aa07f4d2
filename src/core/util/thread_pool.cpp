#include "core/util/thread_pool.h"

namespace cpd {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task) {
  if (n <= 0) return;
  {
    std::lock_guard lock(mutex_);
    task_ = &task;
    next_ = 0;
    total_ = n;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return finished_ == total_ && busy_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

// Claims tasks one at a time until none are left; tasks are coarse (a tile of rows against
// a KV block or more), so the lock is not on the hot path.
void ThreadPool::drain() {
  std::unique_lock lock(mutex_);
  ++busy_;
  while (task_ != nullptr && next_ < total_) {
    const std::int64_t i = next_++;
    const bool skip = error_ != nullptr;
    const auto* task = task_;
    lock.unlock();
    if (!skip) {
      try {
        (*task)(i);
      } catch (...) {
        std::lock_guard relock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    lock.lock();
    ++finished_;
  }
  --busy_;
  if (finished_ == total_ && busy_ == 0) done_.notify_all();
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain();
  }
}

}  // namespace cpd
