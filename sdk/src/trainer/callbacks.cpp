#include <train/callbacks.h>
#include <train/trainer.h>

#include <c10/util/TypeIndex.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <stdexcept>

#include "trainer/trainer_fit.h"

namespace train {

namespace detail {
thread_local bool default_hook_reached = false;
}  // namespace detail

void Callback::on_before_optimizer_step(Trainer& /*trainer*/, LightningModule& /*module*/,
                                        torch::optim::Optimizer& /*optimizer*/) {
  detail::default_hook_reached = true;  // not overridden: a replayed step may skip it
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The monitored value, or nothing when it was not logged.
std::optional<double> monitored(const Trainer& trainer, const std::string& name) {
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(name);
  if (it == metrics.end()) return std::nullopt;
  return it->second;
}

// Whether an EarlyStopping that found no `monitor` waits (validation, where
// it would be logged, has not run yet) rather than fails.
bool missing_is_early(const Trainer& trainer) {
  return trainer.has_validation() && !trainer.validation_has_run();
}

std::string mode_name(Mode mode) { return mode == Mode::kMin ? "min" : "max"; }

std::string available(const Trainer& trainer) {
  std::string names;
  for (const auto& [name, value] : trainer.callback_metrics()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names.empty() ? "none" : names;
}

bool due(int64_t count, int64_t every) { return every > 0 && count % every == 0; }

double read_double(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t, /*is_buffer=*/true);
  return t.to(torch::kFloat64).item<double>();
}

void write_double(torch::serialize::OutputArchive& archive, const std::string& key, double value) {
  archive.write(key, torch::tensor(value, torch::kFloat64), /*is_buffer=*/true);
}

}  // namespace

std::string Callback::state_key() const { return c10::demangle(typeid(*this).name()); }

ReportCallback::ReportCallback(ReportOptions options) : options_(options) {
  if (options_.every_n_epochs() < 0 || options_.every_n_steps() < 0) {
    throw std::invalid_argument("ReportCallback: every_n_epochs and every_n_steps must be >= 0");
  }
}

void ReportCallback::on_train_batch_end(Trainer& trainer, LightningModule& /*module*/,
                                        const Batch& /*batch*/, int64_t /*batch_idx*/) {
  if (trainer.optimizer_stepped() && due(trainer.global_step(), options_.every_n_steps())) {
    trainer.request_report();
  }
}

void ReportCallback::on_train_epoch_end(Trainer& trainer, LightningModule& /*module*/) {
  if (due(trainer.current_epoch() + 1, options_.every_n_epochs())) trainer.request_report();
}

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  if (options_.save_top_k() < -1) {
    throw std::invalid_argument("ModelCheckpoint: save_top_k must be -1 (all) or more, got " +
                                std::to_string(options_.save_top_k()));
  }
  if (options_.every_n_epochs() < 0 || options_.every_n_train_steps() < 0) {
    throw std::invalid_argument(
        "ModelCheckpoint: every_n_epochs and every_n_train_steps must be >= 0");
  }
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{monitor=" + options_.monitor() + ", mode=" + mode_name(options_.mode()) +
         ", every_n_train_steps=" + std::to_string(options_.every_n_train_steps()) +
         ", every_n_epochs=" + std::to_string(options_.every_n_epochs()) + "}";
}

bool ModelCheckpoint::better(double a, double b) const {
  // NaN is never better: a diverged value does not displace a kept one.
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return options_.mode() == Mode::kMin ? a < b : a > b;
}

bool ModelCheckpoint::consider(int64_t step, double score) {
  const int64_t k = options_.save_top_k();
  if (k == 0) return false;
  // A step checked again (a newer value at the same step) is ranked anew.
  best_.erase(std::remove_if(best_.begin(), best_.end(),
                             [&](const auto& entry) { return entry.first == step; }),
              best_.end());
  if (options_.monitor().empty()) score = static_cast<double>(step);  // the latest are the best
  const bool by_step = options_.monitor().empty();
  auto position = std::find_if(best_.begin(), best_.end(), [&](const auto& entry) {
    return by_step ? score > entry.second : better(score, entry.second);
  });
  if (k > 0 && position - best_.begin() >= k) return false;
  best_.insert(position, {step, score});
  if (k > 0 && static_cast<int64_t>(best_.size()) > k) best_.resize(static_cast<size_t>(k));
  return true;
}

void ModelCheckpoint::check(Trainer& trainer) {
  // One checkpoint per step: a step check and the epoch's end can fall together.
  if (trainer.global_step() == last_step_) return;
  double score = kNaN;
  if (!options_.monitor().empty()) {
    auto value = monitored(trainer, options_.monitor());
    if (!value) {
      // As Lightning's: an error once validation has run, passed over before
      // (the value may come from a validation yet to run).
      if (!trainer.validation_has_run()) return;
      throw std::runtime_error("ModelCheckpoint: the monitored metric '" + options_.monitor() +
                               "' was not logged; logged: " + available(trainer));
    }
    score = *value;
  }
  const bool best = consider(trainer.global_step(), score);
  if (best || options_.save_last()) {
    last_step_ = trainer.global_step();
    trainer.request_checkpoint();
  }
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, LightningModule& /*module*/,
                                         const Batch& /*batch*/, int64_t /*batch_idx*/) {
  if (trainer.optimizer_stepped() && due(trainer.global_step(), options_.every_n_train_steps())) {
    check(trainer);
  }
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, LightningModule& /*module*/) {
  // A validation within the epoch; the one at its end is checked with the epoch.
  if (!trainer.is_epoch_end() && !options_.monitor().empty()) check(trainer);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, LightningModule& /*module*/) {
  if (!due(trainer.current_epoch() + 1, options_.every_n_epochs())) return;
  // A monitored value comes with validation: an epoch without one has nothing new.
  if (!options_.monitor().empty() && trainer.has_validation() && !trainer.validated_this_epoch()) {
    return;
  }
  check(trainer);
}

double ModelCheckpoint::best_model_score() const {
  if (best_.empty() || options_.monitor().empty()) return kNaN;
  return best_.front().second;
}

std::vector<std::pair<int64_t, double>> ModelCheckpoint::best_k_models() const { return best_; }

void ModelCheckpoint::on_save_checkpoint(Trainer& /*trainer*/,
                                         torch::serialize::OutputArchive& archive) {
  std::vector<double> flat;
  for (const auto& [step, score] : best_) {
    flat.push_back(static_cast<double>(step));
    flat.push_back(score);
  }
  archive.write("best", torch::tensor(flat, torch::kFloat64), /*is_buffer=*/true);
  write_double(archive, "last_step", static_cast<double>(last_step_));
}

void ModelCheckpoint::on_load_checkpoint(Trainer& /*trainer*/,
                                         torch::serialize::InputArchive& archive) {
  torch::Tensor t;
  archive.read("best", t, /*is_buffer=*/true);
  auto flat = t.to(torch::kFloat64).contiguous();
  TORCH_CHECK(flat.numel() % 2 == 0, "ModelCheckpoint: a damaged record of the best");
  best_.clear();
  for (int64_t i = 0; i + 1 < flat.numel(); i += 2) {
    best_.emplace_back(static_cast<int64_t>(flat[i].item<double>()), flat[i + 1].item<double>());
  }
  last_step_ = static_cast<int64_t>(read_double(archive, "last_step"));
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.monitor().empty()) {
    throw std::invalid_argument("EarlyStopping: monitor must name a logged metric");
  }
  if (options_.patience() < 0) {
    throw std::invalid_argument("EarlyStopping: patience must be >= 0, got " +
                                std::to_string(options_.patience()));
  }
  best_ = options_.mode() == Mode::kMin ? std::numeric_limits<double>::infinity()
                                        : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{monitor=" + options_.monitor() + ", mode=" + mode_name(options_.mode()) +
         "}";
}

bool EarlyStopping::update(double value) {
  // Lightning's check_finite: a value that is NaN or infinite stops at once.
  if (!std::isfinite(value)) return true;
  const double delta = std::abs(options_.min_delta());
  const bool improved =
      options_.mode() == Mode::kMin ? value < best_ - delta : value > best_ + delta;
  if (improved) {
    best_ = value;
    wait_count_ = 0;
    return false;
  }
  return ++wait_count_ >= options_.patience();
}

void EarlyStopping::check(Trainer& trainer) {
  auto value = monitored(trainer, options_.monitor());
  if (!value) {
    if (!options_.strict() || missing_is_early(trainer)) return;
    throw std::runtime_error("EarlyStopping: the monitored metric '" + options_.monitor() +
                             "' was not logged; logged: " + available(trainer));
  }
  if (update(*value)) {
    stopped_epoch_ = trainer.current_epoch();
    trainer.request_stop();
    if (!std::isfinite(*value)) {
      std::cout << "EarlyStopping: " << options_.monitor() << " is " << *value
                << "; stopping after this epoch" << std::endl;
    }
  }
}

void EarlyStopping::on_validation_end(Trainer& trainer, LightningModule& /*module*/) {
  check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, LightningModule& /*module*/) {
  if (!trainer.has_validation()) check(trainer);
}

void EarlyStopping::on_save_checkpoint(Trainer& /*trainer*/,
                                       torch::serialize::OutputArchive& archive) {
  write_double(archive, "best", best_);
  write_double(archive, "wait_count", static_cast<double>(wait_count_));
  write_double(archive, "stopped_epoch", static_cast<double>(stopped_epoch_));
}

void EarlyStopping::on_load_checkpoint(Trainer& /*trainer*/,
                                       torch::serialize::InputArchive& archive) {
  best_ = read_double(archive, "best");
  wait_count_ = static_cast<int64_t>(read_double(archive, "wait_count"));
  stopped_epoch_ = static_cast<int64_t>(read_double(archive, "stopped_epoch"));
}

}  // namespace train
