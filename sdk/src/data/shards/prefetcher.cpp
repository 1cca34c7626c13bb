#include "data/shards/prefetcher.h"

namespace train::shards {

Prefetcher::Prefetcher(size_t threads) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  ready_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void Prefetcher::add(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  ready_.notify_one();
}

void Prefetcher::clear() {
  std::lock_guard lock(mutex_);
  jobs_.clear();
}

void Prefetcher::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (...) {  // the loader's own read tries again, and says what failed
    }
  }
}

}  // namespace train::shards
