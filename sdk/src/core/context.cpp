#include <train/context.h>

#include "core/host.h"

namespace train {

Context get_context() {
  const auto& host = detail::current_host("train::get_context");
  return Context(host.world_rank, host.local_rank, host.node_rank, host.world_size,
                 host.local_world_size, c10::Device(std::string(host.device)), host.run_name,
                 host.storage_path);
}

}  // namespace train
