#pragma once

// What a dataset does with a sample that failed under skip_bad_samples:
// counted (by every copy of the dataset), and the first ones and every
// thousandth after them written to the worker's log (the run's logs/), each
// with the count so far. Thread-safe: loader threads skip at once.

#include <atomic>
#include <cstdint>
#include <iostream>
#include <string>

namespace train::shards {

inline void note_skipped(std::atomic<uint64_t>& skipped, const char* dataset,
                         const std::string& error) {
  constexpr uint64_t kSkipsLogged = 20;  // lines on the log; the count goes on
  const uint64_t count = skipped.fetch_add(1) + 1;
  if (count <= kSkipsLogged || count % 1000 == 0) {
    std::cerr << dataset << ": skipped " << error << " (" << count << " skipped so far)"
              << std::endl;
  }
}

}  // namespace train::shards
