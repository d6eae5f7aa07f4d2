// A fixed set of worker threads for data-parallel loops (the CPU kernels, input generation,
// statistics).
//
// Every loop it runs is row- and block-independent (design §1), so how tasks land on threads
// never changes a bit of any result; the pool only decides speed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cpd {

class ThreadPool {
 public:
  /// `threads` ≥ 1 counts the calling thread, which works too.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs task(i) for i in [0, n) across the pool and returns when all are done. The first
  /// exception a task throws is rethrown here (remaining tasks are skipped).
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task);

 private:
  void worker_loop();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t)>* task_ = nullptr;
  std::int64_t next_ = 0, total_ = 0, finished_ = 0;
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace cpd
