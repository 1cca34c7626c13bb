#include "replica_check.h"

#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

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

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// Every rank's `mine` (equal shapes on every rank), on the CPU, by rank.
std::vector<torch::Tensor> allgather(c10d::ProcessGroup& group, const torch::Tensor& mine) {
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int rank = 0; rank < group.getSize(); ++rank) outputs[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> inputs{mine};
  group.allgather(outputs, inputs)->wait();
  std::vector<torch::Tensor> gathered;
  for (const auto& t : outputs[0]) gathered.push_back(t.cpu());
  return gathered;
}

}  // namespace

std::vector<ModelEntry> describe_model(const torch::nn::Module& module,
                                       const ModelOptions& options) {
  std::vector<ModelEntry> entries{
      option("bucket_cap_mb", number(options.bucket_cap_mb())),
      option("first_bucket_cap_mb", number(options.first_bucket_cap_mb())),
      option("find_unused_parameters", flag(options.find_unused_parameters())),
      option("broadcast_buffers", flag(options.broadcast_buffers())),
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
  // A digest first: when the models agree, as they should, 16 bytes per rank.
  auto digest = torch::tensor(
      {static_cast<int64_t>(fnv1a(text)), static_cast<int64_t>(text.size())}, torch::kLong);
  auto digests = allgather(group, digest.to(device));
  std::vector<int> differing;
  int64_t longest = 0;
  for (int rank = 0; rank < group.getSize(); ++rank) {
    if (!torch::equal(digests[rank], digests[0])) differing.push_back(rank);
    longest = std::max(longest, digests[rank][1].item<int64_t>());
  }
  if (differing.empty()) return;

  // Every rank takes the slow path together: the descriptions themselves.
  auto padded = torch::zeros({longest}, torch::kByte);
  std::memcpy(padded.data_ptr(), text.data(), text.size());
  auto texts = allgather(group, padded.to(device));
  auto decode = [&](int rank) {
    const auto* bytes = static_cast<const char*>(texts[rank].data_ptr());
    return decode_entries(std::string(bytes, digests[rank][1].item<int64_t>()));
  };
  const int first = differing.front();
  auto difference = first_difference(decode(0), decode(first), first);
  if (difference.empty()) difference = "their descriptions differ";
  throw std::runtime_error("prepare_model: rank " + std::to_string(first) +
                           "'s model differs from rank 0's: " + difference +
                           " (ranks that differ from rank 0: " + numbers(differing) +
                           "). Every rank must build the same model and pass the same "
                           "ModelOptions to prepare_model");
}

}  // namespace train::detail
