#include <train/distributed.h>

#include "core/host.h"

namespace train {

c10::intrusive_ptr<c10d::ProcessGroup> process_group() {
  const auto& host = detail::current_host("train::process_group");
  detail::note_group_taken();
  if (auto membership = detail::current_membership(); membership.group) return membership.group;
  auto* group = static_cast<c10d::ProcessGroup*>(host.process_group);
  return c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(group);
}

}  // namespace train
