#pragma once

// Threads that read ahead: jobs run in the order given, on a few threads of
// their own, so that the next chunks of remote shards are in the chunk cache
// before the loader wants them. A job that throws is dropped (the loader's own
// read of that chunk tries again and reports). The destructor drops what has
// not begun and joins the threads. Thread-safe.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace train::shards {

class Prefetcher {
 public:
  explicit Prefetcher(size_t threads);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  void add(std::function<void()> job);
  /// Drops the jobs not yet begun (a new block's come instead).
  void clear();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace train::shards
