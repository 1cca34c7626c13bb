#include <train/context.h>
#include <train/metric.h>

#include <torch/torch.h>

#include <stdexcept>

#include "core/capturing.h"
#include "core/collectives.h"
#include "core/host.h"

namespace train {
namespace {

c10d::ReduceOp reduce_op(Reduction reduction) {
  switch (reduction) {
    case Reduction::kMax: return c10d::ReduceOp::MAX;
    case Reduction::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

// Where collectives of `group` take their tensors: the run's device (NCCL
// needs CUDA tensors), the CPU outside a run.
torch::Device collective_device() {
  return detail::current_host_or_null() != nullptr ? get_context().device() : torch::kCPU;
}

}  // namespace

void Metric::add_state(const std::string& name, torch::Tensor initial, Reduction reduction) {
  if (reduction == Reduction::kCat) initial = initial.reshape({-1});
  states_[name] = State{initial.clone(), initial.clone(), reduction};
}

torch::Tensor& Metric::state(const std::string& name) {
  auto it = states_.find(name);
  if (it == states_.end()) throw std::invalid_argument("Metric: no state named '" + name + "'");
  if (detail::capturing_step()) {
    // Its states are replaced (or kept on the host) at each update: a replay
    // would update none of them.
    throw std::runtime_error("Metric: state '" + name +
                             "' is updated inside a captured step, which a replay would not "
                             "update; update metrics in validation_step, or log the batch's value");
  }
  return it->second.value;
}

void Metric::append(const std::string& name, const torch::Tensor& values) {
  auto& s = state(name);
  s = torch::cat({s, values.detach().reshape({-1}).to(s.options())});
}

void Metric::reset() {
  for (auto& [name, s] : states_) s.value = s.initial.clone();
}

void Metric::set_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  group_ = std::move(group);
  group_set_ = true;
}

torch::Tensor Metric::compute() {
  auto group = group_set_ ? group_ : detail::run_group_or_null();
  if (!group || group->getSize() <= 1) return compute_value();
  const auto device = collective_device();
  // The layout must agree before any reduction: names, kinds, shapes, dtypes.
  std::string layout;
  for (const auto& [name, s] : states_) {
    layout += name + ":" + std::to_string(static_cast<int>(s.reduction)) + ":" +
              c10::toString(s.value.scalar_type()) + ":" +
              (s.reduction == Reduction::kCat ? "cat" : c10::str(s.value.sizes())) + "\n";
  }
  if (auto texts = detail::texts_if_different(*group, device, layout)) {
    for (size_t rank = 1; rank < texts->size(); ++rank) {
      if ((*texts)[rank] != (*texts)[0]) {
        throw std::runtime_error("Metric::compute: rank " + std::to_string(rank) +
                                 "'s states differ from rank 0's (rank 0: " + (*texts)[0] +
                                 "rank " + std::to_string(rank) + ": " + (*texts)[rank] +
                                 "); every rank must hold the same metric");
      }
    }
  }
  // compute_value sees the combined states; the local ones come back
  // afterwards, whatever happens on the way.
  std::map<std::string, torch::Tensor> local;
  for (auto& [name, s] : states_) local[name] = s.value;
  struct Restore {
    std::map<std::string, State>& states;
    std::map<std::string, torch::Tensor>& local;
    ~Restore() {
      for (auto& [name, s] : states) s.value = local[name];
    }
  } restore{states_, local};
  for (auto reduction : {Reduction::kSum, Reduction::kMax, Reduction::kMin}) {
    // One flat buffer per reduction and dtype: one allreduce for all its states.
    std::map<c10::ScalarType, std::vector<std::string>> by_type;
    for (const auto& [name, s] : states_) {
      if (s.reduction == reduction) by_type[s.value.scalar_type()].push_back(name);
    }
    for (const auto& [type, names] : by_type) {
      std::vector<torch::Tensor> flats;
      for (const auto& n : names) flats.push_back(states_[n].value.reshape({-1}).to(device));
      std::vector<torch::Tensor> buffer{torch::cat(flats)};
      c10d::AllreduceOptions options;
      options.reduceOp = reduce_op(reduction);
      group->allreduce(buffer, options)->wait();
      int64_t offset = 0;
      for (const auto& n : names) {
        auto& value = states_[n].value;
        value =
            buffer[0].narrow(0, offset, value.numel()).view_as(value).to(value.device()).clone();
        offset += value.numel();
      }
    }
  }
  for (auto& [name, s] : states_) {
    if (s.reduction != Reduction::kCat) continue;
    auto sizes =
        detail::allgather(*group, torch::tensor({s.value.numel()}, torch::kLong).to(device));
    int64_t longest = 0;
    for (const auto& n : sizes) longest = std::max(longest, n.item<int64_t>());
    auto padded = torch::zeros({longest}, s.value.options());
    padded.narrow(0, 0, s.value.numel()).copy_(s.value);
    auto pieces = detail::allgather(*group, padded.to(device));
    std::vector<torch::Tensor> parts;
    for (size_t rank = 0; rank < pieces.size(); ++rank) {
      parts.push_back(pieces[rank].narrow(0, 0, sizes[rank].item<int64_t>()));
    }
    s.value = torch::cat(parts).to(s.value.device());
  }
  return compute_value();
}

Accuracy::Accuracy() {
  add_state("correct", torch::zeros({}, torch::kFloat64), Reduction::kSum);
  add_state("total", torch::zeros({}, torch::kFloat64), Reduction::kSum);
}

void Accuracy::update(const torch::Tensor& scores, const torch::Tensor& target) {
  if (scores.dim() != 2 || target.dim() != 1 || scores.size(0) != target.size(0)) {
    throw std::invalid_argument(
        "Accuracy::update: scores must be [batch, classes] and target "
        "[batch], got " +
        c10::str(scores.sizes()) + " and " + c10::str(target.sizes()));
  }
  auto correct = scores.detach().argmax(1).eq(target).sum().to(torch::kFloat64);
  state("correct") = state("correct").to(correct.device()) + correct;
  state("total") = state("total") + static_cast<double>(target.size(0));
}

torch::Tensor Accuracy::compute_value() { return state("correct") / state("total"); }

MeanMetric::MeanMetric() {
  add_state("sum", torch::zeros({}, torch::kFloat64), Reduction::kSum);
  add_state("weight", torch::zeros({}, torch::kFloat64), Reduction::kSum);
}

void MeanMetric::update(const torch::Tensor& value, double weight) {
  auto v = value.detach().to(torch::kFloat64);
  state("sum") = state("sum").to(v.device()) + v.sum() * weight;
  state("weight") = state("weight") + weight * static_cast<double>(v.numel());
}

torch::Tensor MeanMetric::compute_value() { return state("sum") / state("weight"); }

}  // namespace train
