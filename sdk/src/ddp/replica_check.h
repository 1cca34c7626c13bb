#pragma once

// Checks that every rank holds the same model, the two checks DDP relies on:
// at prepare_model, that every rank built the same model with the same options
// (as c10d's _verify_param_shape_across_processes does), and at each
// train::report, that training kept the parameters' values equal. Both are
// collectives over the process group: every rank calls them in the same order,
// and a mismatch throws the same error on every rank instead of hanging one.
// Stateless; the caller serialises calls on a process group.

#include <train/model.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace train::detail {

/// One thing that must agree across ranks: an option, a parameter or a buffer,
/// and its facts in a fixed order ("shape", "dtype", "requires_grad").
struct ModelEntry {
  std::string what;  // "parameter 'fc.weight'", "ModelOptions' bucket_cap_mb"
  std::vector<std::pair<std::string, std::string>> facts;
  bool operator==(const ModelEntry& other) const {
    return what == other.what && facts == other.facts;
  }
};

/// The options, then every parameter and buffer in registration order. Devices
/// are left out: each rank has its own.
std::vector<ModelEntry> describe_model(const torch::nn::Module& module,
                                       const ModelOptions& options);

/// The text a rank sends, and its inverse.
std::string encode_entries(const std::vector<ModelEntry>& entries);
std::vector<ModelEntry> decode_entries(const std::string& text);

/// The first difference between rank 0's entries and rank `rank`'s, as a
/// clause ("parameter 'fc.weight' has shape [2, 3] on rank 0 and [2, 4] on
/// rank 1"); empty when they are equal.
std::string first_difference(const std::vector<ModelEntry>& rank0,
                             const std::vector<ModelEntry>& other, int rank);

/// Throws std::runtime_error on every rank unless every rank's `module` has
/// the same parameters and buffers (names, order, shapes, dtypes,
/// requires_grad) and every rank passed the same `options`. One allgather of 16
/// bytes per rank when they agree. Collective tensors live on `device`.
void verify_same_model(const torch::nn::Module& module, const ModelOptions& options,
                       c10d::ProcessGroup& group, torch::Device device);

/// One model whose parameters must hold equal values on every rank.
struct ReplicaModel {
  const torch::nn::Module* module = nullptr;  // null: freed, so without parameters
  size_t num_parameters = 0;                  // when it was prepared: the same on every rank
};

/// A 64-bit hash (XXH3) of a tensor's bytes in the order of its elements
/// (row-major, whatever its strides): equal tensors hash alike on any device;
/// a changed bit, or the same values in another order, hashes otherwise but
/// for a chance of 2^-64. A tensor on a device is copied to the host first.
int64_t bit_hash(const torch::Tensor& tensor);

/// Throws std::runtime_error on every rank, naming the first parameter that
/// differs and the ranks that hold another value than rank 0, unless every
/// rank's parameters of `models` hash alike: bit-identical but for a chance
/// of 2^-64 per parameter. Buffers are not checked: they are broadcast from
/// rank 0 after every synchronised backward (broadcast_buffers), or each
/// rank's own by design. `caller` opens the message. One allreduce of 16
/// bytes per parameter when they agree. Collective tensors live on `device`.
void check_replicas_equal(const std::vector<ReplicaModel>& models, c10d::ProcessGroup& group,
                          torch::Device device, const std::string& caller);

}  // namespace train::detail
