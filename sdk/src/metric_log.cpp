#include "metric_log.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "collectives.h"

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

std::vector<double> average_across_ranks(c10d::ProcessGroup* group, torch::Device device,
                                         const std::vector<std::string>& names,
                                         const std::vector<WeightedSum>& sums) {
  TORCH_CHECK(names.size() == sums.size(), "average_across_ranks: names and sums differ in size");
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
      group->allreduce(buffer)->wait();
      auto summed = buffer[0].cpu();
      std::copy(summed.data_ptr<double>(), summed.data_ptr<double>() + summed.numel(),
                flat.begin());
    }
  }
  std::vector<double> averages;
  for (size_t i = 0; i < names.size(); ++i) {
    const double count = flat[2 * i + 1];
    averages.push_back(count > 0 ? flat[2 * i] / count : std::numeric_limits<double>::quiet_NaN());
  }
  return averages;
}

void MetricLog::add(const std::string& name, const torch::Tensor* tensor, double value,
                    double weight, bool on_step, bool on_epoch, bool prog_bar, bool sync_dist) {
  auto [it, inserted] = entries_.try_emplace(name);
  Entry& entry = it->second;
  if (inserted) {
    entry.on_step = on_step;
    entry.on_epoch = on_epoch;
    entry.prog_bar = prog_bar;
    entry.sync_dist = sync_dist;
    // A resumed epoch's sum goes on where the saved one stopped, in the same
    // order of additions, so that it ends as the uninterrupted one would.
    if (auto restored = restored_.find(name); restored != restored_.end()) {
      if (tensor != nullptr) {
        entry.device_sum =
            torch::tensor(restored->second.sum, tensor->options().dtype(torch::kFloat64));
      } else {
        entry.host_sum = restored->second.sum;
      }
      entry.count = restored->second.count;
      restored_.erase(restored);
    }
  } else if (entry.on_step != on_step || entry.on_epoch != on_epoch ||
             entry.prog_bar != prog_bar || entry.sync_dist != sync_dist) {
    throw std::invalid_argument("train::LightningModule::log: '" + name +
                                "' was logged with other options before in this epoch");
  }
  if (tensor != nullptr) {
    auto detached = tensor->detach();
    if (on_epoch) {
      if (!entry.device_sum.defined()) {
        entry.device_sum = torch::zeros({}, detached.options().dtype(torch::kFloat64));
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
}

std::map<std::string, double> MetricLog::averages(c10d::ProcessGroup* group, torch::Device device,
                                                  bool step, bool prog_bar_only) {
  std::vector<std::string> synced_names;
  std::vector<WeightedSum> synced;
  std::map<std::string, double> result;
  auto reported = [&](const std::string& name, const Entry& e) {
    return e.on_step && e.on_epoch ? name + (step ? "_step" : "_epoch") : name;
  };
  for (const auto& [name, e] : entries_) {
    if (step ? !e.on_step : !e.on_epoch) continue;
    if (prog_bar_only && !e.prog_bar) continue;
    WeightedSum sum;
    if (step) {
      const double v = e.step_tensor.defined() ? to_double(e.step_tensor) : e.step_value;
      sum = {v * e.step_count, e.step_count};
    } else {
      sum = {e.host_sum + to_double(e.device_sum), e.count};
    }
    if (e.sync_dist) {
      synced_names.push_back(reported(name, e));
      synced.push_back(sum);
    } else {
      result[reported(name, e)] =
          sum.count > 0 ? sum.sum / sum.count : std::numeric_limits<double>::quiet_NaN();
    }
  }
  auto values = average_across_ranks(group, device, synced_names, synced);
  for (size_t i = 0; i < values.size(); ++i) result[synced_names[i]] = values[i];
  return result;
}

std::map<std::string, double> MetricLog::epoch_values(c10d::ProcessGroup* group,
                                                      torch::Device device) {
  return averages(group, device, /*step=*/false, /*prog_bar_only=*/false);
}

std::map<std::string, double> MetricLog::step_values(c10d::ProcessGroup* group,
                                                     torch::Device device, bool prog_bar_only) {
  return averages(group, device, /*step=*/true, prog_bar_only);
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

void MetricLog::clear() {
  entries_.clear();
  restored_.clear();
}

void MetricLog::save(torch::serialize::OutputArchive& archive) const {
  // Names as one text, sums as one [n, 2] tensor: a metric's name need not
  // be a valid archive key.
  std::string names;
  std::vector<double> sums;
  for (const auto& [name, e] : entries_) {
    if (!e.on_epoch) continue;
    names += name + kNameSeparator;
    sums.push_back(e.host_sum + to_double(e.device_sum));
    sums.push_back(e.count);
  }
  auto text = torch::empty({static_cast<int64_t>(names.size())}, torch::kByte);
  std::copy(names.begin(), names.end(), static_cast<char*>(text.data_ptr()));
  archive.write("names", text, /*is_buffer=*/true);
  archive.write("sums", torch::tensor(sums, torch::kFloat64), /*is_buffer=*/true);
}

void MetricLog::load(torch::serialize::InputArchive& archive) {
  clear();
  torch::Tensor text, sums;
  archive.read("names", text, /*is_buffer=*/true);
  archive.read("sums", sums, /*is_buffer=*/true);
  text = text.to(torch::kByte).contiguous();
  sums = sums.to(torch::kFloat64).contiguous();
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
  TORCH_CHECK(sums.numel() == static_cast<int64_t>(2 * names.size()),
              "the logged sums in the checkpoint do not match their names");
  const auto* values = sums.data_ptr<double>();
  for (size_t i = 0; i < names.size(); ++i) restored_[names[i]] = {values[2 * i], values[2 * i + 1]};
}

}  // namespace train::detail
