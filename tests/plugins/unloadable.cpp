// A well-formed plugin that no worker can load: it needs a function that no
// library defines, so dlopen(RTLD_NOW) fails.

#include <train/train.h>

extern "C" void trainrun_test_symbol_that_does_not_exist();

void needs_missing_symbol() { trainrun_test_symbol_that_does_not_exist(); }

TRAIN_FUNC(needs_missing_symbol);
