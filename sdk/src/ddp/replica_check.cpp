#include "ddp/replica_check.h"

#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "core/collectives.h"

// Inlined: the SDK is linked into plugins, which then need no library of xxHash's.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace train::detail {
namespace {

constexpr char kEntrySeparator = '\n';
constexpr char kFieldSeparator = '\t';

std::string number(double value) {
  char text[32];
  auto end = std::to_chars(text, text + sizeof(text), value).ptr;  // shortest exact form
  return std::string(text, end);
}

std::string flag(bool value) { return value ? "true" : "false"; }

std::string compression_name(Compression compression) {
  switch (compression) {
    case Compression::kNone: return "none";
    case Compression::kBF16: return "bf16";
    case Compression::kFP16: return "fp16";
  }
  return "unknown";
}

ModelEntry option(const char* name, std::string value) {
  return {std::string("ModelOptions' ") + name, {{"", std::move(value)}}};
}

ModelEntry tensor_entry(const char* kind, const std::string& name, const torch::Tensor& tensor,
                        bool with_requires_grad) {
  ModelEntry entry{std::string(kind) + " '" + name + "'",
                   {{"shape", c10::str(tensor.sizes())},
                    {"dtype", std::string(c10::toString(tensor.scalar_type()))}}};
  if (with_requires_grad) entry.facts.emplace_back("requires_grad", flag(tensor.requires_grad()));
  return entry;
}

bool has(const std::vector<ModelEntry>& entries, const std::string& what) {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const ModelEntry& e) { return e.what == what; });
}

std::string numbers(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + numbers(ranks);
}

}  // namespace

std::vector<ModelEntry> describe_model(const torch::nn::Module& module,
                                       const ModelOptions& options) {
  std::vector<ModelEntry> entries{
      option("bucket_cap_mb", number(options.bucket_cap_mb())),
      option("first_bucket_cap_mb", number(options.first_bucket_cap_mb())),
      option("find_unused_parameters", flag(options.find_unused_parameters())),
      option("broadcast_buffers", flag(options.broadcast_buffers())),
      option("check_divergence", flag(options.check_divergence())),
      // Ranks that compress differently would allreduce buckets of different types.
      option("compression", compression_name(options.compression())),
  };
  for (const auto& p : module.named_parameters()) {
    entries.push_back(tensor_entry("parameter", p.key(), p.value(), true));
  }
  for (const auto& b : module.named_buffers()) {
    entries.push_back(tensor_entry("buffer", b.key(), b.value(), false));
  }
  return entries;
}

std::string encode_entries(const std::vector<ModelEntry>& entries) {
  std::string text;
  for (const auto& entry : entries) {
    text += entry.what;
    for (const auto& [label, value] : entry.facts) text += kFieldSeparator + label + '=' + value;
    text += kEntrySeparator;
  }
  return text;
}

std::vector<ModelEntry> decode_entries(const std::string& text) {
  std::vector<ModelEntry> entries;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line, kEntrySeparator)) {
    std::istringstream fields(line);
    ModelEntry entry;
    std::getline(fields, entry.what, kFieldSeparator);
    std::string field;
    while (std::getline(fields, field, kFieldSeparator)) {
      auto equals = field.find('=');
      if (equals == std::string::npos) equals = field.size();
      entry.facts.emplace_back(field.substr(0, equals),
                               field.substr(std::min(equals + 1, field.size())));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string first_difference(const std::vector<ModelEntry>& rank0,
                             const std::vector<ModelEntry>& other, int rank) {
  const std::string on_other = " on rank " + std::to_string(rank);
  const std::string other_has = "rank " + std::to_string(rank) + " has ";
  const size_t common = std::min(rank0.size(), other.size());
  for (size_t i = 0; i < common; ++i) {
    const auto& a = rank0[i];
    const auto& b = other[i];
    if (a == b) continue;
    if (a.what == b.what) {
      for (size_t f = 0; f < std::min(a.facts.size(), b.facts.size()); ++f) {
        if (a.facts[f] == b.facts[f]) continue;
        const auto& label = a.facts[f].first;
        return a.what + (label.empty() ? " is " : " has " + label + " ") + a.facts[f].second +
               " on rank 0 and " + b.facts[f].second + on_other;
      }
      return a.what + " differs between rank 0 and rank " + std::to_string(rank);
    }
    if (!has(other, a.what)) return other_has + "no " + a.what;
    if (!has(rank0, b.what)) return other_has + b.what + ", which rank 0 has not";
    return "the order differs: rank 0 has " + a.what + " where " + other_has + b.what;
  }
  if (rank0.size() > common) return other_has + "no " + rank0[common].what;
  if (other.size() > common) return other_has + other[common].what + ", which rank 0 has not";
  return "";
}

void verify_same_model(const torch::nn::Module& module, const ModelOptions& options,
                       c10d::ProcessGroup& group, torch::Device device) {
  const auto text = encode_entries(describe_model(module, options));
  auto texts = texts_if_different(group, device, text);
  if (!texts) return;
  std::vector<int> differing;
  for (size_t rank = 1; rank < texts->size(); ++rank) {
    if ((*texts)[rank] != (*texts)[0]) differing.push_back(static_cast<int>(rank));
  }
  auto decode = [&](int rank) { return decode_entries((*texts)[rank]); };
  const int first = differing.front();
  auto difference = first_difference(decode(0), decode(first), first);
  if (difference.empty()) difference = "their descriptions differ";
  throw std::runtime_error("prepare_model: rank " + std::to_string(first) +
                           "'s model differs from rank 0's: " + difference +
                           " (ranks that differ from rank 0: " + numbers(differing) +
                           "). Every rank must build the same model and pass the same "
                           "ModelOptions to prepare_model");
}

int64_t bit_hash(const torch::Tensor& tensor) {
  const auto bytes = tensor.detach().to(torch::kCPU).contiguous();
  const uint64_t hash = XXH3_64bits(bytes.data_ptr(), bytes.nbytes());
  int64_t word = 0;
  std::memcpy(&word, &hash, sizeof(word));
  return word;
}

void check_replicas_equal(const std::vector<ReplicaModel>& models, c10d::ProcessGroup& group,
                          torch::Device device, const std::string& caller) {
  if (models.empty()) return;
  // Laid out the same on every rank, whatever happened since prepare_model:
  // per model, its parameter count now, then one hash per parameter (zeros
  // where the count changed).
  std::vector<int64_t> words;
  std::vector<torch::Tensor> on_host, elsewhere;  // hashed into words[at]
  std::vector<size_t> host_at, elsewhere_at;
  for (const auto& model : models) {
    auto params = model.module ? model.module->parameters() : std::vector<torch::Tensor>{};
    words.push_back(static_cast<int64_t>(params.size()));
    const bool same = params.size() == model.num_parameters;
    for (size_t i = 0; i < model.num_parameters; ++i) {
      if (same) {
        (params[i].is_cpu() ? host_at : elsewhere_at).push_back(words.size());
        (params[i].is_cpu() ? on_host : elsewhere).push_back(params[i]);
      }
      words.push_back(0);
    }
  }
  // On the intra-op threads, a parameter each; one on a device is copied to
  // the host and hashed before the next is copied, so no more than one such
  // copy is held at a time.
  at::parallel_for(0, static_cast<int64_t>(on_host.size()), 1, [&](int64_t begin, int64_t end) {
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
      words[host_at[i]] = bit_hash(on_host[i]);
    }
  });
  for (size_t i = 0; i < elsewhere.size(); ++i) words[elsewhere_at[i]] = bit_hash(elsewhere[i]);
  auto sums = torch::tensor(words, torch::kLong).to(device);
  const int64_t length = sums.numel();

  // MAX of the hashes and of their complements: the largest and smallest value
  // of each in one collective. They match exactly when every rank agrees.
  std::vector<torch::Tensor> extremes{torch::cat({sums, sums.bitwise_not()})};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  run_collective([&] { return group.allreduce(extremes, max); });
  auto reduced = extremes[0].cpu();
  if (torch::equal(reduced.narrow(0, 0, length), reduced.narrow(0, length, length).bitwise_not())) {
    return;
  }

  // Every rank takes the slow path together: whose value differs, and where.
  auto all = torch::stack(allgather(group, sums));
  auto differs = (all != all[0]).any(0);
  const int64_t at = differs.nonzero()[0][0].item<int64_t>();
  std::vector<int> ranks;
  for (int rank = 1; rank < group.getSize(); ++rank) {
    if (all[rank][at].item<int64_t>() != all[0][at].item<int64_t>()) ranks.push_back(rank);
  }
  int64_t offset = 0;
  for (size_t m = 0; m < models.size(); ++m) {
    const auto& model = models[m];
    const int64_t end = offset + 1 + static_cast<int64_t>(model.num_parameters);
    if (at >= end) {
      offset = end;
      continue;
    }
    const std::string which = models.size() == 1
                                  ? std::string("the prepared model")
                                  : "prepared model " + std::to_string(m + 1) + " of " +
                                        std::to_string(models.size()) + " (in prepare_model order)";
    if (at == offset) {
      throw std::runtime_error(caller + ": " + which + " has " +
                               std::to_string(all[0][at].item<int64_t>()) +
                               " parameters on rank 0 and other counts on " + rank_list(ranks) +
                               " (it had " + std::to_string(model.num_parameters) +
                               " at prepare_model). Every rank must keep the same parameters");
    }
    auto names = model.module->named_parameters().keys();
    const auto& name = names.at(static_cast<size_t>(at - offset - 1));
    throw std::runtime_error(
        caller + ": the replicas have diverged: parameter '" + name + "' of " + which +
        " holds other values on " + rank_list(ranks) +
        " than on rank 0. Parameters must change alike on every rank: load or modify them on "
        "every rank (or before prepare_model), never on some ranks only. "
        "train::ModelOptions().check_divergence(false) turns this check off");
  }
  throw std::logic_error(caller + ": a hash beyond the prepared models differs");
}

}  // namespace train::detail
