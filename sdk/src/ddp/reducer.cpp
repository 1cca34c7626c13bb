#include "ddp/reducer.h"

#include <train/context.h>
#include <train/distributed.h>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "core/catch_up.h"
#include "core/collectives.h"
#include "core/host.h"
#include "core/profiler.h"
#include "ddp/bucket_assignment.h"
#include "ddp/replica_check.h"

namespace train::detail {
namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

// Broadcasts tensors from rank 0 in place, one flat buffer per dtype.
void broadcast_from_rank0(c10d::ProcessGroup& group, const std::vector<torch::Tensor>& tensors) {
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;
  for (const auto& t : tensors) by_type[t.scalar_type()].push_back(t);
  torch::NoGradGuard no_grad;
  for (auto& [type, group_tensors] : by_type) {
    auto flat = torch::utils::flatten_dense_tensors(group_tensors);
    std::vector<torch::Tensor> buffer{flat};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    group.broadcast(buffer, options)->wait();
    auto unflat = torch::utils::unflatten_dense_tensors(flat, group_tensors);
    for (size_t i = 0; i < group_tensors.size(); ++i) group_tensors[i].copy_(unflat[i]);
  }
}

// The stream the calling thread queues work on for `device`; none on the CPU.
// In an autograd hook, CUDA's is the stream the gradient was produced on.
c10::optional<c10::Stream> current_stream(c10::Device device) {
  if (device.is_cpu()) return c10::nullopt;
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

std::string layout(const torch::Tensor& t) {
  return c10::str(t.sizes(), " ", t.scalar_type(), " on ", t.device());
}

// The models prepared in the running train function, in prepare_model order.
std::vector<PreparedModel>& registry() {
  static std::vector<PreparedModel> models;
  return models;
}

// "gloo", "nccl", or "" for a group that does not say.
std::string backend_name(const c10d::ProcessGroup& group) {
  try {
    return group.getBackendName();
  } catch (const c10::Error&) {
    return "";
  }
}

}  // namespace

Reducer::Reducer(torch::nn::Module& module, c10::intrusive_ptr<c10d::ProcessGroup> group,
                 const ModelOptions& options)
    : group_(std::move(group)),
      generation_(current_membership().generation),
      buffers_(module.buffers()),
      find_unused_(options.find_unused_parameters()),
      broadcast_buffers_(options.broadcast_buffers()),
      compression_(options.compression()) {
  // LibTorch 1.13's Gloo has no bfloat16 allreduce ("Invalid scalar type"),
  // but moves any 2-byte type: bf16 buckets go as a reduce-scatter and an
  // allgather of their bits (seen as fp16), which is what a ring allreduce
  // sends, summed here in fp32.
  scatter_bf16_ = compression_ == Compression::kBF16 && backend_name(*group_) == "gloo";
  // In place over Gloo only: NCCL's collectives cannot be waited for in
  // slices from the host, nor abandoned (docs/design.md, "Recovery in place").
  in_place_ = recovers_in_place() && backend_name(*group_) == "gloo";
  // Reverse registration order approximates the order gradients become ready.
  auto named = module.named_parameters();
  for (auto it = named.end(); it != named.begin();) {
    --it;
    if (!it->value().requires_grad()) continue;
    Slot slot;
    slot.param = it->value();
    slot.name = it->key();
    slots_.push_back(std::move(slot));
  }
  build_buckets(options);
}

namespace {

// The type a bucket of `type` travels in: a half-width float with
// compression, for float32 buckets; none for the rest (a model trained in
// double wants its bits, and one in half precision has nothing to gain).
std::optional<torch::ScalarType> wire_type(torch::ScalarType type, Compression compression) {
  if (type != torch::kFloat) return std::nullopt;
  switch (compression) {
    case Compression::kBF16: return torch::kBFloat16;
    case Compression::kFP16: return torch::kHalf;
    case Compression::kNone: break;
  }
  return std::nullopt;
}

}  // namespace

void Reducer::build_buckets(const ModelOptions& options) {
  if (options.find_unused_parameters() && !slots_.empty()) {
    used_host_ = torch::zeros({static_cast<int64_t>(slots_.size())}, torch::kInt);
    // Its own copy even on the CPU: an abandoned collective keeps the old one.
    used_ = used_host_.to(slots_.front().param.device(), /*non_blocking=*/false, /*copy=*/true);
  }
  // DDP's layout, so that Gloo's ring adds every element up in DDP's order
  // (on 3 ranks or more the order shows in the last bits). With
  // find_unused_parameters DDP assigns buckets over the parameters in
  // registration order and launches them last first; without, it lays them
  // out again after the first iteration in the order the gradients came,
  // which reverse registration order (slots_'s) approximates from the start.
  std::vector<size_t> order(slots_.size());
  std::iota(order.begin(), order.end(), 0);
  if (find_unused_) std::reverse(order.begin(), order.end());
  std::vector<BucketInput> inputs;
  for (size_t s : order) {
    const auto& p = slots_[s].param;
    inputs.push_back({static_cast<size_t>(p.numel()) * p.element_size(),
                      std::string(c10::toString(p.scalar_type())) + "/" + p.device().str()});
  }
  auto assignment = assign_buckets(inputs, options.first_bucket_cap_mb() * kBytesPerMiB,
                                   options.bucket_cap_mb() * kBytesPerMiB);
  if (find_unused_) std::reverse(assignment.begin(), assignment.end());
  buckets_.resize(assignment.size());
  for (size_t b = 0; b < assignment.size(); ++b) {
    for (auto& s : assignment[b]) {
      s = order[s];
      slots_[s].bucket = b;
    }
    buckets_[b].slots = std::move(assignment[b]);
  }
  for (auto& bucket : buckets_) {
    renew_storage(bucket);
    bucket.pending = bucket.slots.size();
    if (in_place_) bucket.local = torch::empty_like(bucket.contents);
  }
}

void Reducer::renew_storage(Bucket& bucket, bool keep) {
  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (size_t s : bucket.slots) total += slots_[s].param.numel();
  const auto& first = slots_[bucket.slots.front()].param;
  auto previous = bucket.contents;
  bucket.contents = torch::zeros({total}, first.options().requires_grad(false));
  if (keep && previous.defined()) bucket.contents.copy_(previous);
  int64_t offset = 0;
  for (size_t s : bucket.slots) {
    auto& slot = slots_[s];
    // Shares the bucket's storage without being an autograd view, so that
    // LibTorch's Optimizer::zero_grad (which detaches .grad in place) works.
    // Laid out as its parameter is (a channels_last weight's gradient too), as
    // autograd lays out a gradient it makes, and as fused optimizers need;
    // a dense layout spans numel() elements from its offset, as a contiguous one.
    const auto& param = slot.param;
    auto view = torch::empty({0}, bucket.contents.options());
    if (param.is_non_overlapping_and_dense()) {
      view.set_(bucket.contents.storage(), offset, param.sizes(), param.strides());
    } else {
      view.set_(bucket.contents.storage(), offset, param.sizes());
    }
    offset += slot.param.numel();
    // Autograd accumulates into the bucket from here on. An undefined .grad
    // stays undefined until a gradient comes, as in one process: an
    // optimizer skips such a parameter (no weight decay, no momentum).
    auto& grad = slot.param.mutable_grad();
    if (slot.view.defined()) {  // renewed: a .grad in the old storage moves along
      if (grad.defined() && grad.is_same(slot.view)) grad = view;
    } else if (grad.defined()) {
      view.copy_(grad);
      grad = view;
    }
    slot.view = view;
  }
  bucket.wire = bucket.scattered = bucket.own = bucket.sum = torch::Tensor();
  bucket.chunk = 0;
  if (auto wire = wire_type(bucket.contents.scalar_type(), compression_)) {
    const auto options = bucket.contents.options().dtype(*wire);
    if (scatter_bf16_) {
      const int64_t world = group_->getSize();
      bucket.chunk = std::max<int64_t>(1, (total + world - 1) / world);  // 0 would mean allreduce
      bucket.wire = torch::zeros({world * bucket.chunk}, options);       // the padding stays 0
      bucket.scattered = torch::empty({world * bucket.chunk}, options);
      bucket.own = torch::empty({bucket.chunk}, options);
      bucket.sum = torch::empty({bucket.chunk}, bucket.contents.options());
    } else {
      bucket.wire = torch::empty({total}, options);
    }
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = shared_from_this();
  accumulators_.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    hook_accumulator(i);
    // Tensor::set_, which torch::load uses, gives a parameter a new gradient
    // accumulator, without our post-hook, but keeps the tensor's own hooks: this
    // one runs before the new accumulator does and moves the post-hook onto it.
    slots_[i].param.register_hook([weak, i](const torch::Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_gradient_incoming(i);
    });
  }
}

void Reducer::renew_accumulators() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    // One held elsewhere too (by a live graph) would come back from
    // grad_accumulator as it is, its hook on already.
    // A parameter frozen since has no accumulator to make (and gets no gradient).
    if (accumulators_[i].use_count() > 1 || !slots_[i].param.requires_grad()) continue;
    accumulators_[i].reset();
    hook_accumulator(i);
  }
}

void Reducer::abandon(bool wait_for_collectives) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (wait_for_collectives) {
    abandon_iteration();
    return;
  }
  for (auto& bucket : buckets_) bucket.work.reset();
  used_work_.reset();
  launch_failed_ = false;
  reset_iteration();
}

void Reducer::hook_accumulator(size_t index) {
  std::weak_ptr<Reducer> weak = shared_from_this();
  auto accumulator = torch::autograd::impl::grad_accumulator(slots_[index].param);
  if (!accumulator) return;  // it requires no gradient (frozen)
  accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [weak, index](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
        if (auto reducer = weak.lock()) reducer->on_gradient_ready(index);
        return outputs;
      }));
  accumulators_[index] = std::move(accumulator);
}

bool Reducer::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(sync_, enabled);
}

void Reducer::on_gradient_incoming(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = slots_[index];
  if (torch::autograd::impl::grad_accumulator(slot.param) == accumulators_[index]) return;
  // No broadcast: a load of the same file on every rank needs none, and a load
  // on some ranks only is what check_divergence finds at the next report. A
  // collective here, on the ranks that happened to reload, could not be matched.
  const auto& param = slot.param;
  if (!param.sizes().equals(slot.view.sizes()) || param.scalar_type() != slot.view.scalar_type() ||
      param.device() != slot.view.device()) {
    abandon_iteration();
    const bool moved = param.device() != slot.view.device();
    throw std::runtime_error("parameter '" + slot.name + "' became " + layout(param) +
                             " after prepare_model, which gave its gradient a place for " +
                             layout(slot.view) + ": " +
                             (moved ? "pass the model's device to torch::load(model, path, device)"
                                    : "load parameters of the model's own shapes and dtypes") +
                             ", or load them before prepare_model");
  }
  hook_accumulator(index);
  // Autograd has already collected the new accumulator's post-hooks for this
  // pass, so this gradient is taken once backward has finished.
  if (sync_) {
    begin_backward();
    slot.late = true;
  } else {
    slot.accumulated = true;
  }
}

void Reducer::on_gradient_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) {
    slots_[index].accumulated = true;
    return;
  }
  begin_backward();
  slots_[index].late = false;  // the moved post-hook ran after all
  take_gradient(index);
}

void Reducer::begin_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  // Another collective of this rank (the Trainer's, or another model's) may
  // have gone on to the survivors' group since this model's last step.
  if (in_place_) {
    auto membership = current_membership();
    if (membership.generation > generation_) {
      group_ = membership.group;
      generation_ = membership.generation;
      if (scatter_bf16_) {  // its pieces are cut by the group's size
        for (auto& bucket : buckets_) renew_storage(bucket, /*keep=*/true);
      }
    }
  }
  std::weak_ptr<Reducer> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto reducer = weak.lock()) reducer->finalize();
  });
}

void Reducer::take_gradient(size_t index) {
  auto& slot = slots_[index];
  if (slot.ready) {
    abandon_iteration();
    throw std::runtime_error("parameter '" + slot.name +
                             "' got its gradient twice in one backward pass: prepare_model "
                             "supports one backward per iteration");
  }
  auto& grad = slot.param.mutable_grad();
  if (!grad.defined() || !grad.is_same(slot.view)) {
    // Someone replaced .grad (set it to None, or autograd changed its layout):
    // bring the value into the bucket and point .grad back at it.
    torch::NoGradGuard no_grad;
    if (grad.defined()) {
      slot.view.copy_(grad);
    } else {
      slot.view.zero_();
    }
    grad = slot.view;
  }
  slot.stream = current_stream(slot.view.device());
  mark_ready(index);
}

void Reducer::mark_ready(size_t index) {
  slots_[index].ready = true;
  auto& bucket = buckets_[slots_[index].bucket];
  if (--bucket.pending == 0) launch_ready_buckets();
}

// Buckets launch strictly in order: Gloo and NCCL match collectives by order,
// so every rank must issue them identically whatever order its gradients come in.
void Reducer::launch_ready_buckets() {
  const double world = group_->getSize();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    auto& bucket = buckets_[next_bucket_++];
    wait_for_gradients(bucket);
    if (bucket.local.defined()) bucket.local.copy_(bucket.contents);
    if (launch_failed_) continue;  // the group is broken: finalize regroups
    // Times 1/world, as DDP scales each gradient: the same bits. Before the
    // cast (DDP's compression hooks cast first): one rounding, and a local
    // gradient up to world x 65504 still fits fp16.
    bucket.contents.mul_(1.0 / world);
    if (bucket.wire.defined())
      bucket.wire.narrow(0, 0, bucket.contents.numel()).copy_(bucket.contents);
    try {
      if (bucket.chunk > 0) {
        auto out = bucket.scattered.view(torch::kHalf);  // the bits, moved as they are
        auto in = bucket.wire.view(torch::kHalf);
        bucket.work = compat::alltoall_equal(*group_, out, in);
      } else {
        std::vector<torch::Tensor> tensors{bucket.wire.defined() ? bucket.wire : bucket.contents};
        bucket.work = group_->allreduce(tensors);
      }
    } catch (...) {
      // A group whose peer is gone: the step is done again in the survivors'.
      if (in_place_) {
        launch_failed_ = true;
        continue;
      }
      abandon_iteration();  // a backend that refuses the type: the next backward starts clean
      throw;
    }
  }
}

void Reducer::wait_for_gradients(const Bucket& bucket) {
  const auto here = current_stream(bucket.contents.device());
  if (!here) return;
  for (size_t s : bucket.slots) {
    const auto& produced = slots_[s].stream;
    if (!produced || *produced == *here) continue;
    c10::Event event(here->device_type());
    event.record(*produced);
    event.block(*here);
  }
}

bool Reducer::gather_sums(Bucket& bucket) {
  if (!wait_unless_group_ended(*bucket.work, generation_)) return false;
  // Every rank's piece `rank`, summed in rank order in fp32 and rounded to
  // bf16 once: the same bits wherever it is computed.
  const int64_t world = group_->getSize();
  auto pieces = bucket.scattered.view({world, bucket.chunk});
  bucket.sum.copy_(pieces[0]);
  for (int64_t r = 1; r < world; ++r) bucket.sum.add_(pieces[r]);
  bucket.own.copy_(bucket.sum);
  std::vector<std::vector<torch::Tensor>> outputs(1);
  auto wire = bucket.wire.view(torch::kHalf);
  for (int64_t r = 0; r < world; ++r) {
    outputs[0].push_back(wire.narrow(0, r * bucket.chunk, bucket.chunk));
  }
  std::vector<torch::Tensor> inputs{bucket.own.view(torch::kHalf)};
  try {
    bucket.work = group_->allgather(outputs, inputs);
  } catch (...) {
    if (!in_place_) throw;
    return false;
  }
  return true;
}

void Reducer::finalize() {
  backward_done();  // a step, for the profile of --profile-steps
  std::lock_guard<std::mutex> lock(mutex_);
  // On the stream backward() was called on (the engine's choice for final
  // callbacks; it already waited for the accumulators' streams). Each work's
  // wait() makes this stream wait for the collective, and the optimizer reads
  // .grad on it after.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].late) take_gradient(i);
  }
  if (next_bucket_ < buckets_.size()) {
    std::string unused;
    for (auto& slot : slots_) {
      if (!slot.ready) unused += (unused.empty() ? "" : ", ") + slot.name;
    }
    if (!find_unused_) {
      abandon_iteration();
      throw std::runtime_error(
          "parameters got no gradient in this iteration: " + unused +
          ". Pass train::ModelOptions().find_unused_parameters(true) to prepare_model if that "
          "is intended, or make every parameter take part in the loss");
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].ready) take_unused(i);
    }
  }
  torch::NoGradGuard no_grad;
  // With in-place recovery a step is applied only where every rank's
  // collectives of it completed: each rank votes, and the controller answers
  // the same to all. A step whose group lost a rank is done again, from
  // every survivor's own gradients, in the survivors' group.
  const int64_t step = in_place_ ? next_synchronised_step() : 0;
  try {
    while (!complete_collectives() || (in_place_ && !vote_step(step, generation_))) {
      redo_in_new_group();
    }
  } catch (...) {
    abandon_iteration();
    throw;
  }
  for (auto& slot : slots_) slot.accumulated = false;  // synchronised
  reset_iteration();
}

bool Reducer::accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.accumulated; });
}

bool Reducer::complete_collectives() {
  if (launch_failed_) return false;
  auto launched = [&](auto&& launch) {
    try {
      launch();
      return true;
    } catch (...) {
      if (!in_place_) throw;
      return false;
    }
  };
  if (used_.defined()) {
    // After every bucket, on every rank: the same collectives in the same order.
    auto* flags = used_host_.data_ptr<int32_t>();
    for (size_t i = 0; i < slots_.size(); ++i) {
      flags[i] = slots_[i].unused && !slots_[i].accumulated ? 0 : 1;
    }
    used_.copy_(used_host_);
    std::vector<torch::Tensor> tensors{used_};
    if (!launched([&] { used_work_ = group_->allreduce(tensors); })) return false;
  }
  // In bucket order on every rank, as the collectives must be.
  for (auto& bucket : buckets_) {
    if (bucket.chunk > 0 && !gather_sums(bucket)) return false;
  }
  for (auto& bucket : buckets_) {
    if (!wait_unless_group_ended(*bucket.work, generation_)) return false;
    bucket.work.reset();
    if (bucket.wire.defined()) {
      bucket.contents.copy_(bucket.wire.narrow(0, 0, bucket.contents.numel()));
    }
  }
  if (used_work_) {
    if (!wait_unless_group_ended(*used_work_, generation_)) return false;
    used_work_.reset();
    settle_unused();
  }
  return !broadcast_buffers_ || buffers_.empty() || broadcast_buffers();
}

bool Reducer::broadcast_buffers() {
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;
  for (const auto& t : buffers_) by_type[t.scalar_type()].push_back(t);
  for (auto& [type, tensors] : by_type) {
    auto flat = torch::utils::flatten_dense_tensors(tensors);
    std::vector<torch::Tensor> buffer{flat};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = group_->broadcast(buffer, options);
    } catch (...) {
      if (!in_place_) throw;
      return false;
    }
    if (!wait_unless_group_ended(*work, generation_)) return false;
    auto unflat = torch::utils::unflatten_dense_tensors(flat, tensors);
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(unflat[i]);
  }
  return true;
}

void Reducer::redo_in_new_group() {
  // Whatever the old group still has in flight keeps its buffers; this rank
  // goes on in new ones.
  for (auto& bucket : buckets_) bucket.work.reset();
  used_work_.reset();
  if (used_.defined()) used_ = torch::empty_like(used_);
  auto membership = regroup_after(generation_);
  group_ = membership.group;
  generation_ = membership.generation;
  launch_failed_ = false;
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    renew_storage(bucket);
    bucket.contents.copy_(bucket.local);
  }
  next_bucket_ = 0;  // every bucket is ready: all of them launch, in order
  launch_ready_buckets();
}

void Reducer::take_unused(size_t index) {
  auto& slot = slots_[index];
  auto& grad = slot.param.mutable_grad();
  slot.unused = true;
  if (!grad.defined()) {
    slot.view.zero_();
  } else if (!grad.is_same(slot.view)) {
    slot.view.copy_(grad);  // .grad itself stays as it is until settle_unused
  } else if (!slot.accumulated) {
    slot.prior = grad.detach().clone();  // the bucket overwrites it
  }
  mark_ready(index);
}

void Reducer::settle_unused() {
  auto used = used_.cpu();
  const auto* counts = used.data_ptr<int32_t>();
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& slot = slots_[i];
    if (!slot.unused) continue;
    if (counts[i] > 0) {
      slot.param.mutable_grad() = slot.view;  // the average of what the ranks had
    } else if (slot.prior.defined()) {
      slot.view.copy_(slot.prior);  // no rank used it: .grad as it was
    }
  }
}

void Reducer::abandon_iteration() {
  // Nothing still in flight may write into a buffer the next iteration fills.
  // With in-place recovery a collective may wait for a dead peer until its
  // timeout: its buffers are left to it instead.
  auto drain = [](c10::intrusive_ptr<c10d::Work>& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {  // the error being thrown is the one that counts
    }
    work.reset();
  };
  for (auto& bucket : buckets_) {
    if (in_place_ && bucket.work && !bucket.work->isCompleted()) {
      bucket.work.reset();
      renew_storage(bucket);
    }
    drain(bucket.work);
  }
  if (in_place_ && used_work_ && !used_work_->isCompleted()) {
    used_work_.reset();
    used_ = torch::empty_like(used_);
  }
  drain(used_work_);
  launch_failed_ = false;
  reset_iteration();
}

void Reducer::reset_iteration() {
  for (auto& slot : slots_) {
    slot.ready = slot.late = slot.unused = false;
    slot.prior = torch::Tensor();
    slot.stream.reset();
  }
  for (auto& bucket : buckets_) bucket.pending = bucket.slots.size();
  next_bucket_ = 0;
  in_backward_ = false;
}

PreparedModel replicate(const std::shared_ptr<torch::nn::Module>& module,
                        c10::intrusive_ptr<c10d::ProcessGroup> group, torch::Device device,
                        const ModelOptions& options) {
  // Before the broadcast: with different models it would pair unrelated tensors.
  verify_same_model(*module, options, *group, device);
  std::vector<torch::Tensor> state = module->parameters();
  for (auto& buffer : module->buffers()) state.push_back(buffer);
  broadcast_from_rank0(*group, state);
  auto reducer = std::make_shared<Reducer>(*module, group, options);
  reducer->install_hooks();
  return {
      module, std::move(reducer), options.check_divergence(), module->parameters().size(), device,
      options};
}

size_t prepared_model_count() {
  const auto& models = registry();
  return static_cast<size_t>(std::count_if(
      models.begin(), models.end(), [](const PreparedModel& m) { return !m.module.expired(); }));
}

std::vector<torch::Tensor> prepared_parameters() {
  std::vector<torch::Tensor> parameters;
  for (const auto& model : registry()) {
    auto module = model.module.lock();
    if (!module) continue;
    for (auto& param : module->parameters()) parameters.push_back(param);
  }
  return parameters;
}

bool gradients_accumulated() {
  const auto& models = registry();
  return std::any_of(models.begin(), models.end(),
                     [](const PreparedModel& m) { return m.reducer->accumulated(); });
}

void replicate_to_replacement(c10d::ProcessGroup& group) {
  for (const auto& model : registry()) {
    auto module = model.module.lock();
    if (!module) continue;
    verify_same_model(*module, model.options, group, model.device);
    std::vector<torch::Tensor> state = module->parameters();
    for (auto& buffer : module->buffers()) state.push_back(buffer);
    broadcast_from_rank0(group, state);
  }
}

void prepare_module(const std::shared_ptr<torch::nn::Module>& module, const ModelOptions& options) {
  auto ctx = get_context();
  module->to(ctx.device());
  if (ctx.world_size() == 1) return;  // nothing to synchronise: no hooks, no overhead
  // A replacement gets its parameters here, from the group it joins.
  auto group = joining() ? join_as_replacement().group : current_membership().group;
  auto prepared = replicate(module, group, ctx.device(), options);

  auto& models = registry();
  if (models.empty()) at_entry_end([] { registry().clear(); });
  models.erase(std::remove_if(models.begin(), models.end(),
                              [&](const PreparedModel& m) {
                                return m.module.expired() || m.module.lock() == module;
                              }),
               models.end());
  models.push_back(std::move(prepared));
}

void check_divergence(const std::vector<PreparedModel>& models, c10d::ProcessGroup& group,
                      const std::string& caller) {
  std::vector<std::shared_ptr<torch::nn::Module>> alive;  // for the length of the check
  std::vector<ReplicaModel> checked;
  torch::Device device = torch::kCPU;
  for (const auto& model : models) {
    if (!model.check_divergence) continue;
    if (checked.empty()) device = model.device;
    alive.push_back(model.module.lock());  // a freed model counts as one without parameters
    checked.push_back({alive.back().get(), model.num_parameters});
  }
  check_replicas_equal(checked, group, device, caller);
}

bool has_checked_models() {
  const auto& models = registry();
  return std::any_of(models.begin(), models.end(),
                     [](const PreparedModel& m) { return m.check_divergence; });
}

void renew_prepared_accumulators() {
  for (auto& model : registry()) {
    if (!model.module.expired()) model.reducer->renew_accumulators();
  }
}

void abandon_prepared_iterations(bool wait_for_collectives) {
  for (auto& model : registry()) model.reducer->abandon(wait_for_collectives);
}

void check_prepared_models(const std::string& caller) {
  const auto& models = registry();
  if (models.empty()) return;  // one worker, or no model prepared
  // A rank lost during the check: the survivors check again, in their group.
  run_surviving([&](c10d::ProcessGroup& group) { check_divergence(models, group, caller); });
}

bool set_gradient_sync(const torch::nn::Module& module, bool enabled) {
  for (auto& r : registry()) {
    if (auto m = r.module.lock(); m.get() == &module) return r.reducer->set_sync(enabled);
  }
  return true;  // not prepared, or one worker: nothing to pause
}

}  // namespace train::detail
