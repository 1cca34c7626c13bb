#pragma once

// Gradient synchronisation for one prepared model, after PyTorch's
// c10d::Reducer: flat per-bucket gradient buffers that .grad shares, filled by
// autograd and allreduced bucket by bucket, in order, as backward makes them
// ready; a final callback deals with unused parameters, waits, and broadcasts
// buffers. docs/design.md (Data parallelism) says how and why. Hooks run on
// autograd's threads; a mutex guards the state.

#include <train/model.h>
#include <train/torch_compat.h>

#include <c10/core/Stream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace train::detail {

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  Reducer(torch::nn::Module& module, c10::intrusive_ptr<c10d::ProcessGroup> group,
          const ModelOptions& options);
  /// Registers the autograd hooks; call once, after construction.
  void install_hooks();
  /// Enables or disables synchronisation; returns the previous setting.
  bool set_sync(bool enabled);
  /// Whether a backward under NoSync left gradients for the next synchronisation.
  bool accumulated();
  /// Gives each parameter a new gradient accumulator, carrying the hooks,
  /// made on the calling thread's current stream. Autograd records a node's
  /// stream when it makes it, and a CUDA graph's capture fails on a node of
  /// another stream (LibTorch 2.15 refuses one of the default stream in so
  /// many words): the accumulators install_hooks made, on the loop's stream,
  /// would be. An accumulator a live autograd graph still holds is kept.
  /// Not while a backward runs.
  void renew_accumulators();
  /// Drops the iteration under way (a backward that threw part-way leaves
  /// one): the next backward starts clean. It waits for the collectives
  /// launched, which write into the buckets, unless `wait_for_collectives` is
  /// false: those of a CUDA graph's failed capture were recorded, never run.
  void abandon(bool wait_for_collectives = true);
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Slot {  // one parameter
    torch::Tensor param;
    std::string name;
    size_t bucket = 0;
    torch::Tensor view;  // its place in the bucket, shaped like the parameter
    bool ready = false;
    bool late = false;  // its post-hook moved during this backward: ready at finalisation
    // A gradient came in a backward under NoSync since the last synchronisation.
    bool accumulated = false;
    // Unused in this synchronising backward on this rank (find_unused_parameters):
    // what its .grad was before, restored as it was if no rank used it either.
    bool unused = false;
    torch::Tensor prior;  // a copy, only when .grad was the bucket's own view
    // Where its gradient was produced (CUDA: the stream autograd ran its
    // accumulator on); a bucket's collective waits for it if it launches on another.
    c10::optional<c10::Stream> stream;
  };
  struct Bucket {
    torch::Tensor contents;
    torch::Tensor wire;  // with compression: contents as sent (bf16 or fp16); else undefined
    // bf16 over Gloo (no bfloat16 allreduce there): a reduce-scatter done as an
    // alltoall, then an allgather. The wire is padded to world x `chunk`;
    // `scattered` gets every rank's piece `rank`, summed in fp32 into `sum`,
    // sent as `own`.
    int64_t chunk = 0;  // 0: the bucket is allreduced
    torch::Tensor scattered, sum, own;
    std::vector<size_t> slots;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    // In-place recovery: this rank's gradients as they were before the
    // collective, for the step to be done again in the survivors' group.
    torch::Tensor local;
  };

  void build_buckets(const ModelOptions& options);
  void hook_accumulator(size_t slot);
  void on_gradient_incoming(size_t slot);
  void on_gradient_ready(size_t slot);
  void begin_backward();
  void take_gradient(size_t slot);
  /// find_unused_parameters: a parameter without a gradient in this backward
  /// contributes what its .grad holds (accumulated under NoSync, or zero).
  void take_unused(size_t slot);
  /// After the collectives: .grad of the parameters this rank did not use is
  /// the average where some rank used them, and as it was where none did.
  void settle_unused();
  void mark_ready(size_t slot);
  void launch_ready_buckets();
  /// bf16 over Gloo: once a bucket's alltoall is done, sums this rank's piece
  /// and starts the allgather of the sums.
  bool gather_sums(Bucket& bucket);
  void finalize();
  /// The step's collectives, launched (buckets first, by backward's hooks)
  /// and waited for: false when the group ended under them (in-place
  /// recovery), or a launch failed.
  bool complete_collectives();
  /// broadcast_buffers: the model's buffers from rank 0, after the buckets;
  /// false when the group ended under it.
  bool broadcast_buffers();
  /// After the group ended mid-step: joins the survivors' group and launches
  /// the step's collectives again from this rank's own gradients, in fresh
  /// buffers (the old group's collectives may still write into theirs).
  void redo_in_new_group();
  /// Gives `bucket` new storage (contents, and the wire of compression) and
  /// points its parameters' gradients there; `keep`: with the contents it
  /// had (nothing may be writing into them).
  void renew_storage(Bucket& bucket, bool keep = false);
  /// An error path: waits for every collective still in flight (they write
  /// into the buckets), then resets.
  void abandon_iteration();
  void reset_iteration();
  /// Makes the calling thread's stream wait for every gradient of `bucket`
  /// produced on another stream (CUDA); no host synchronisation.
  void wait_for_gradients(const Bucket& bucket);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int64_t generation_ = 0;      // group_'s
  bool in_place_ = false;       // the run recovers in place: gradients are kept, steps voted on
  bool launch_failed_ = false;  // a bucket's collective could not be started this step
  std::vector<torch::Tensor> buffers_;
  bool find_unused_;
  bool broadcast_buffers_;
  Compression compression_;
  bool scatter_bf16_ = false;  // bf16 buckets go as alltoall + allgather (Gloo)
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  // find_unused_parameters: by slot, 1 where this rank used the parameter since
  // the last synchronisation; summed across ranks after the buckets.
  torch::Tensor used_, used_host_;  // on the model's device, and its CPU copy
  c10::intrusive_ptr<c10d::Work> used_work_;
  // By slot: the accumulator carrying its post-hook (autograd holds only weak
  // references to accumulators, so this keeps the hooks alive).
  std::vector<compat::NodePtr> accumulators_;
  std::mutex mutex_;
  bool sync_ = true;
  bool in_backward_ = false;
  size_t next_bucket_ = 0;
};

/// A prepared model, as the registry of the running train function holds it.
struct PreparedModel {
  std::weak_ptr<torch::nn::Module> module;
  std::shared_ptr<Reducer> reducer;
  bool check_divergence = true;
  size_t num_parameters = 0;  // at prepare_model
  torch::Device device = torch::kCPU;
  ModelOptions options;  // prepare_model's, which a replacement's must match
};

/// prepare_model's collective part, once the module is on `device`: checks that
/// every rank built the same model with the same options, broadcasts parameters
/// and buffers from rank 0 and attaches a Reducer. Throws std::runtime_error on
/// every rank if the models differ.
PreparedModel replicate(const std::shared_ptr<torch::nn::Module>& module,
                        c10::intrusive_ptr<c10d::ProcessGroup> group, torch::Device device,
                        const ModelOptions& options);

/// The divergence check of train::report over those of `models` with
/// check_divergence on (see check_replicas_equal); nothing when there are none.
/// Collective: every rank passes the same models in the same order.
void check_divergence(const std::vector<PreparedModel>& models, c10d::ProcessGroup& group,
                      const std::string& caller);

/// Whether the running train function prepared a model that train::report
/// checks (the same answer on every rank).
bool has_checked_models();

/// On a rank of the group at a replacement's step boundary: what a
/// replacement's prepare_model does (replicate) for each model prepared here,
/// in the order they were: the same-model check and the broadcast of
/// parameters and buffers from the group's first rank, over `group`.
void replicate_to_replacement(c10d::ProcessGroup& group);

/// The prepared models' parameters, model after model.
std::vector<torch::Tensor> prepared_parameters();

/// Whether a prepared model holds gradients accumulated under NoSync.
bool gradients_accumulated();

/// How many models the running train function has prepared (alive).
size_t prepared_model_count();

/// Reducer::renew_accumulators for each model prepared in the running train function.
void renew_prepared_accumulators();

/// Reducer::abandon for each model prepared in the running train function.
void abandon_prepared_iterations(bool wait_for_collectives = true);

/// check_divergence over the models prepared in the running train function.
void check_prepared_models(const std::string& caller);

}  // namespace train::detail
