#include <train/distributed.h>

#include <stdexcept>

#include "core/catch_up.h"
#include "core/collectives.h"
#include "core/host.h"

namespace train {

c10::intrusive_ptr<c10d::ProcessGroup> process_group() {
  const auto& host = detail::current_host("train::process_group");
  detail::note_group_taken();
  if (auto membership = detail::current_membership(); membership.group) return membership.group;
  auto* group = static_cast<c10d::ProcessGroup*>(host.process_group);
  return c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(group);
}

void all_reduce(torch::Tensor& tensor, c10d::ReduceOp op) {
  detail::current_host("train::all_reduce");
  if (detail::catching_up()) {
    throw std::logic_error(
        "train::all_reduce: this rank replaces a lost one and has not caught up yet: its peers are "
        "in their loop, so its setup and the top of its first epoch make no collective");
  }
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  detail::allreduce_surviving(tensor, options);
}

}  // namespace train
