#include "trainer/metric_log.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/collectives.h"

namespace train::detail {
namespace {

constexpr char kNameSeparator = '\n';

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += name + kNameSeparator;
  return text;
}

// "[a, b]" from joined()'s text.
std::string listed(const std::string& text) {
  std::string list;
  for (char c : text) {
    if (c == kNameSeparator) {
      list += ", ";
    } else {
      list += c;
    }
  }
  if (!list.empty()) list.resize(list.size() - 2);  // the last separator
  return "[" + list + "]";
}

double to_double(const torch::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; }

}  // namespace

std::vector<WeightedSum> sum_across_ranks(c10d::ProcessGroup* group, torch::Device device,
                                          const std::vector<std::string>& names,
                                          const std::vector<WeightedSum>& sums) {
  TORCH_CHECK(names.size() == sums.size(), "sum_across_ranks: names and sums differ in size");
  std::vector<double> flat;
  for (const auto& s : sums) {
    flat.push_back(s.sum);
    flat.push_back(s.count);
  }
  if (group != nullptr && group->getSize() > 1) {
    const auto text = joined(names);
    if (auto texts = texts_if_different(*group, device, text)) {
      std::string message =
          "train::LightningModule::log: the ranks logged different metrics to average "
          "(sync_dist): rank 0 logged " +
          listed((*texts)[0]);
      for (size_t rank = 1; rank < texts->size(); ++rank) {
        if ((*texts)[rank] != (*texts)[0]) {
          message += ", rank " + std::to_string(rank) + " " + listed((*texts)[rank]);
        }
      }
      throw std::runtime_error(message +
                               ". Every rank must log the same names with sync_dist between "
                               "two averages (each epoch, validation run and logged step)");
    }
    if (!flat.empty()) {
      std::vector<torch::Tensor> buffer{torch::tensor(flat, torch::kFloat64).to(device)};
      run_collective([&] { return group->allreduce(buffer); });
      auto summed = buffer[0].cpu();
      std::copy(summed.data_ptr<double>(), summed.data_ptr<double>() + summed.numel(),
                flat.begin());
    }
  }
  std::vector<WeightedSum> totals;
  for (size_t i = 0; i < names.size(); ++i) totals.push_back({flat[2 * i], flat[2 * i + 1]});
  return totals;
}

void MetricLog::add(const std::string& name, const torch::Tensor* tensor, double value,
                    double weight, bool on_step, bool on_epoch, bool prog_bar, bool sync_dist) {
  auto [it, inserted] = entries_.try_emplace(name);
  Entry& entry = it->second;
  if (inserted || entry.restored) {
    entry.on_step = on_step;
    entry.on_epoch = on_epoch;
    entry.prog_bar = prog_bar;
    entry.sync_dist = sync_dist;
  } else if (entry.on_step != on_step || entry.on_epoch != on_epoch || entry.prog_bar != prog_bar ||
             entry.sync_dist != sync_dist) {
    throw std::invalid_argument("train::LightningModule::log: '" + name +
                                "' was logged with other options before in this epoch");
  }
  if (tensor != nullptr) {
    auto detached = tensor->detach();
    if (on_epoch) {
      if (!entry.device_sum.defined()) {
        // A resumed epoch's sum goes on where the saved one stopped, in the
        // same order of additions, so that it ends as the uninterrupted one.
        entry.device_sum = torch::tensor(entry.host_sum, detached.options().dtype(torch::kFloat64));
        entry.host_sum = 0;
      }
      entry.device_sum.add_(detached.reshape({}), weight);
    }
    entry.step_tensor = detached;
  } else {
    if (on_epoch) entry.host_sum += value * weight;
    entry.step_tensor = torch::Tensor();
    entry.step_value = value;
  }
  if (on_epoch) entry.count += weight;
  entry.step_count = weight;
  entry.restored = false;
}

std::map<std::string, double> MetricLog::values(c10d::ProcessGroup* group, torch::Device device,
                                                Which which) {
  std::vector<std::string> synced_names;
  std::vector<WeightedSum> synced;
  std::map<std::string, double> result;
  auto take = [&](const std::string& reported, const Entry& e, WeightedSum sum) {
    if (e.sync_dist) {
      synced_names.push_back(reported);
      synced.push_back(sum);
    } else if (sum.count > 0) {
      result[reported] = sum.sum / sum.count;
    }
  };
  for (const auto& [name, e] : entries_) {
    const bool both = e.on_step && e.on_epoch;
    if (e.on_step && which != Which::kEpoch) {
      const double v = e.step_tensor.defined() ? to_double(e.step_tensor) : e.step_value;
      take(both ? name + "_step" : name, e, {v * e.step_count, e.step_count});
    }
    if (e.on_epoch && which != Which::kStep) {
      take(both ? name + "_epoch" : name, e, {e.host_sum + to_double(e.device_sum), e.count});
    }
  }
  auto totals = sum_across_ranks(group, device, synced_names, synced);
  for (size_t i = 0; i < totals.size(); ++i) {
    // Nothing logged on any rank (a restored name not logged again): no value.
    if (totals[i].count > 0) result[synced_names[i]] = totals[i].sum / totals[i].count;
  }
  return result;
}

bool MetricLog::has_prog_bar() const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [](const auto& e) { return e.second.prog_bar && e.second.on_step; });
}

bool MetricLog::is_prog_bar(const std::string& reported) const {
  auto it = entries_.find(reported);
  if (it == entries_.end() && reported.size() > 5 &&
      reported.compare(reported.size() - 5, 5, "_step") == 0) {
    it = entries_.find(reported.substr(0, reported.size() - 5));
  }
  return it != entries_.end() && it->second.prog_bar;
}

void MetricLog::clear() { entries_.clear(); }

void MetricLog::zero_sums() {
  for (auto& [name, e] : entries_) {
    e.host_sum = 0;
    e.count = 0;
    e.device_sum = torch::Tensor();
  }
}

namespace {
enum Flag : int { kOnStep = 1, kOnEpoch = 2, kProgBar = 4, kSyncDist = 8 };
}  // namespace

void MetricLog::save(torch::serialize::OutputArchive& archive) const {
  // Names as one text, the rest as one [n, 3] tensor (sum, count, flags): a
  // metric's name need not be a valid archive key.
  std::string names;
  std::vector<double> rows;
  for (const auto& [name, e] : entries_) {
    if (!e.on_epoch) continue;
    names += name + kNameSeparator;
    rows.push_back(e.host_sum + to_double(e.device_sum));
    rows.push_back(e.count);
    rows.push_back((e.on_step ? kOnStep : 0) | kOnEpoch | (e.prog_bar ? kProgBar : 0) |
                   (e.sync_dist ? kSyncDist : 0));
  }
  auto text = torch::empty({static_cast<int64_t>(names.size())}, torch::kByte);
  std::copy(names.begin(), names.end(), static_cast<char*>(text.data_ptr()));
  archive.write("names", text, /*is_buffer=*/true);
  archive.write("sums", torch::tensor(rows, torch::kFloat64), /*is_buffer=*/true);
}

void MetricLog::load(torch::serialize::InputArchive& archive) {
  clear();
  torch::Tensor text, rows;
  archive.read("names", text, /*is_buffer=*/true);
  archive.read("sums", rows, /*is_buffer=*/true);
  text = text.to(torch::kByte).contiguous();
  rows = rows.to(torch::kFloat64).contiguous();
  const auto* bytes = static_cast<const char*>(text.data_ptr());
  std::vector<std::string> names;
  std::string name;
  for (int64_t i = 0; i < text.numel(); ++i) {
    if (bytes[i] == kNameSeparator) {
      names.push_back(name);
      name.clear();
    } else {
      name += bytes[i];
    }
  }
  TORCH_CHECK(rows.numel() == static_cast<int64_t>(3 * names.size()),
              "the logged sums in the checkpoint do not match their names");
  const auto* values = rows.data_ptr<double>();
  for (size_t i = 0; i < names.size(); ++i) {
    const int flags = static_cast<int>(values[3 * i + 2]);
    Entry& e = entries_[names[i]];
    e.on_step = (flags & kOnStep) != 0;
    e.on_epoch = true;
    e.prog_bar = (flags & kProgBar) != 0;
    e.sync_dist = (flags & kSyncDist) != 0;
    e.host_sum = values[3 * i];
    e.count = values[3 * i + 1];
    e.restored = true;
  }
}

}  // namespace train::detail
