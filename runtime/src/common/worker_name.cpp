#include "common/worker_name.h"

namespace trainrun {

std::string describe_worker(int rank, std::string_view host, int64_t pid) {
  return "rank " + std::to_string(rank) + " (" + std::string(host.empty() ? "local" : host) +
         ", pid " + std::to_string(pid) + ")";
}

}  // namespace trainrun
