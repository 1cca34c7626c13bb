#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

namespace train {

/// The run's c10d process group (Gloo on CPU, NCCL on CUDA) spanning all
/// workers, for collectives of your own (`allreduce`, `broadcast`, `barrier`).
/// It lives until the train function returns. Throws std::logic_error outside a
/// train function started by trainrun.
c10::intrusive_ptr<c10d::ProcessGroup> process_group();

/// Reduces `tensor` in place across the ranks (a sum, or `op`), as
/// `process_group()->allreduce({tensor})->wait()` does, on the group the run's
/// collectives use now. With --recovery in-place it survives a lost rank: it
/// is applied once every rank's copy completed, and otherwise done again among
/// the survivors, whose result it then holds. A train function that takes
/// process_group() itself cannot be recovered in place (its collectives cannot
/// be done again); one that reduces with this can. A collective: every rank
/// calls it at the same point. Nothing to do with one worker. Throws
/// std::logic_error outside a train function started by trainrun.
void all_reduce(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM);

}  // namespace train
