#include "core/capturing.h"

namespace train::detail {
namespace {
thread_local bool capturing_here = false;  // a step of this thread is being captured
}  // namespace

bool capturing_step() { return capturing_here; }

void set_capturing_step(bool capturing) { capturing_here = capturing; }

}  // namespace train::detail
