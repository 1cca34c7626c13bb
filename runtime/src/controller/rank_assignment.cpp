#include "controller/rank_assignment.h"

#include <algorithm>

namespace trainrun {

std::vector<Placement> assign_ranks(const std::vector<std::string>& hosts) {
  std::vector<std::string> nodes;
  for (const auto& host : hosts) {
    if (std::find(nodes.begin(), nodes.end(), host) == nodes.end()) nodes.push_back(host);
  }
  std::vector<Placement> placements(hosts.size());
  int rank = 0;
  for (size_t node = 0; node < nodes.size(); ++node) {
    auto local_world_size = static_cast<int>(std::count(hosts.begin(), hosts.end(), nodes[node]));
    int local_rank = 0;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (hosts[i] != nodes[node]) continue;
      placements[i] = {rank++, local_rank++, static_cast<int>(node), local_world_size};
    }
  }
  return placements;
}

}  // namespace trainrun
