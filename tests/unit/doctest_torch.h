#pragma once

// doctest for tests that include LibTorch: c10's glog-style logging header
// defines CHECK, CHECK_EQ, ... which would replace doctest's assertions. Include
// this instead of <doctest/doctest.h>, after LibTorch's headers have been seen.

#include <c10/util/Logging.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT

#include <doctest/doctest.h>
