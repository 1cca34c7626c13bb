#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace train {

/// The run's c10d process group (Gloo on CPU, NCCL on CUDA) spanning all
/// workers, for collectives of your own (`allreduce`, `broadcast`, `barrier`).
/// It lives until the train function returns. Throws std::logic_error outside a
/// train function started by trainrun.
c10::intrusive_ptr<c10d::ProcessGroup> process_group();

}  // namespace train
