// Built with AddressSanitizer: a write one past the end of a vector, which
// `trainrun --local` under LD_PRELOAD=libasan.so reports at its line.

#include <train/train.h>

#include <vector>

void overflow(const train::Config& config) {
  std::vector<int> values(4);
  volatile int index = config.get<int>("index", 4);
  values.data()[index] = 1;  // one past the end
  train::report({{"index", static_cast<int64_t>(index)}});
}

TRAIN_FUNC(overflow);
