#pragma once

// The profile of the steps trainrun --profile-steps names, with LibTorch's own
// profiler: Kineto on LibTorch 2.x (CPU operators, and CUDA kernels and copies
// on a GPU), the legacy profiler's CPU operators on 1.13, written as a Chrome
// trace (Perfetto and TensorBoard open it). Steps are counted where a prepared
// model's backward pass ends (any thread); the profiler starts and stops only
// on the train function's thread, at the points train::detail::profile_point
// marks, and at the entry's end.

namespace train::detail {

/// A backward pass through a prepared model ended: one step more.
void backward_done();

}  // namespace train::detail
