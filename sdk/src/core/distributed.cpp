#include <train/distributed.h>

#include <stdexcept>

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
  if (detail::joining()) {
    throw std::logic_error(
        "train::all_reduce: this rank replaces a lost one and has not joined the group yet (its "
        "first train::prepare_model joins it)");
  }
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  detail::allreduce_surviving(tensor, options);
}

}  // namespace train
