#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace trainrun {

/// How every message names a worker: "rank 1 (host, pid 42)"; "local" when the
/// host is not known yet.
std::string describe_worker(int rank, std::string_view host, int64_t pid);

}  // namespace trainrun
