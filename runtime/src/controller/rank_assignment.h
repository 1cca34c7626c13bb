#pragma once

// Where each worker sits in the run. Ranks are grouped by host, hosts in the
// order of their first worker, workers within a host in the order given, so
// that local and node ranks are right on every node (as torchrun's are).

#include <string>
#include <vector>

namespace trainrun {

struct Placement {
  int world_rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  int local_world_size = 0;
};

/// One placement per entry of `hosts` (the host of each worker, in launch order).
std::vector<Placement> assign_ranks(const std::vector<std::string>& hosts);

}  // namespace trainrun
