#include <train/distributed.h>
#include <train/optim.h>
#include <train/report.h>
#include <train/trainer.h>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/collectives.h"
#include "core/host.h"
#include "trainer/trainer_fit.h"

namespace train {
namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("train::TrainerOptions: " + message);
}

bool divides(int64_t every, int64_t count) { return every > 0 && count % every == 0; }

// The forward pass's autocast for `precision`: none for float32.
void enter_autocast(std::optional<Autocast>& scope, Precision precision, torch::Device device) {
  if (precision == Precision::k32) return;
  scope.emplace(device.type(),
                precision == Precision::kBF16Mixed ? torch::kBFloat16 : torch::kFloat16);
}

// The Trainer's own callbacks, kept apart from the user's for the checks below.
template <typename Kind>
bool has(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  return std::any_of(callbacks.begin(), callbacks.end(),
                     [](const auto& c) { return dynamic_cast<Kind*>(c.get()) != nullptr; });
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::k32: return "32";
    case Precision::kBF16Mixed: return "bf16-mixed";
    case Precision::kFP16Mixed: return "16-mixed";
  }
  return "?";
}

}  // namespace

void detail::clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  std::vector<torch::Tensor> grads, norms;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) grads.push_back(parameter.grad().data());
  }
  if (grads.empty()) return;
  norms.reserve(grads.size());
  for (const auto& grad : grads) norms.push_back(grad.norm(2.0));
  auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  auto coefficient = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& grad : grads) grad.mul_(coefficient);
}

Precision precision_from_string(const std::string& text) {
  if (text == "32" || text == "32-true") return Precision::k32;
  if (text == "bf16-mixed" || text == "bf16") return Precision::kBF16Mixed;
  if (text == "16-mixed" || text == "16" || text == "fp16") return Precision::kFP16Mixed;
  throw std::invalid_argument(
      "precision must be 32, bf16-mixed (bf16) or 16-mixed (16, fp16), got '" + text + "'");
}

void LightningModule::validation_step(Batch& /*batch*/, int64_t /*batch_idx*/) {}

Trainer& LightningModule::trainer() const {
  if (trainer_ == nullptr) {
    throw std::logic_error("train::LightningModule: not inside Trainer::fit");
  }
  return *trainer_;
}

int64_t LightningModule::current_epoch() const { return trainer().current_epoch(); }
int64_t LightningModule::global_step() const { return trainer().global_step(); }

void LightningModule::log(const std::string& name, const torch::Tensor& value,
                          const LogOptions& options) {
  trainer().log(name, &value, 0.0, options);
}

void LightningModule::log(const std::string& name, double value, const LogOptions& options) {
  trainer().log(name, nullptr, value, options);
}

Trainer::Trainer(TrainerOptions options, std::vector<std::shared_ptr<Callback>> callbacks)
    : options_(std::move(options)), callbacks_(std::move(callbacks)) {
  require(options_.max_epochs() >= 0, "max_epochs must be >= 0");
  require(options_.max_steps() >= -1, "max_steps must be -1 (no limit) or more");
  require(options_.limit_train_batches() >= -1, "limit_train_batches must be -1 (all) or more");
  require(options_.limit_val_batches() >= -1, "limit_val_batches must be -1 (all) or more");
  require(options_.val_check_interval() >= 0, "val_check_interval must be >= 0");
  require(options_.check_val_every_n_epoch() >= 1, "check_val_every_n_epoch must be >= 1");
  require(options_.accumulate_grad_batches() >= 1, "accumulate_grad_batches must be >= 1");
  require(options_.gradient_clip_val() >= 0, "gradient_clip_val must be >= 0");
  require(options_.log_every_n_steps() >= 0, "log_every_n_steps must be >= 0");
  require(options_.train_loader().batch_size() >= 1, "train_loader's batch_size must be >= 1");
  require(options_.val_loader().batch_size() >= 1, "val_loader's batch_size must be >= 1");
  require(!options_.capture().enabled() || options_.capture().warmup_steps() >= 1,
          "capture's warmup_steps must be >= 1");
  std::set<std::string> keys;
  for (const auto& callback : callbacks_) {
    if (!callback) throw std::invalid_argument("train::Trainer: a callback is null");
    if (!keys.insert(detail::callback_archive_key(callback->state_key())).second) {
      throw std::invalid_argument("train::Trainer: two callbacks have the state key '" +
                                  callback->state_key() + "'; override state_key() in one");
    }
  }
  if (!has<ReportCallback>(callbacks_)) callbacks_.push_back(std::make_shared<ReportCallback>());
  if (options_.enable_checkpointing() && !has<ModelCheckpoint>(callbacks_)) {
    callbacks_.push_back(std::make_shared<ModelCheckpoint>());
  }
}

Trainer::~Trainer() = default;

int64_t Trainer::current_epoch() const { return fit_ ? fit_->epoch : 0; }
int64_t Trainer::global_step() const { return fit_ ? fit_->global_step : 0; }

const std::map<std::string, double>& Trainer::callback_metrics() const {
  static const std::map<std::string, double> kNone;
  return fit_ ? fit_->callback_metrics : kNone;
}

bool Trainer::has_validation() const {
  return fit_ && fit_->val != nullptr && options_.limit_val_batches() != 0;
}
bool Trainer::validation_has_run() const { return fit_ && fit_->validation_ran; }
bool Trainer::validated_this_epoch() const { return fit_ && fit_->validated_epoch; }
bool Trainer::is_epoch_end() const { return fit_ && fit_->at_epoch_end; }
bool Trainer::optimizer_stepped() const { return fit_ && fit_->stepped; }

void Trainer::request_checkpoint() {
  if (fit_) fit_->want_checkpoint = true;
}
void Trainer::request_report() {
  if (fit_) fit_->want_report = true;
}
void Trainer::recapture() {
  if (fit_) fit_->recapture();
}
void Trainer::request_stop() {
  if (fit_) fit_->want_stop = true;
}
bool Trainer::should_stop() const { return fit_ && fit_->stopping; }

void Trainer::log(const std::string& name, const torch::Tensor* tensor, double value,
                  const LogOptions& options) {
  if (!fit_) throw std::logic_error("train::LightningModule::log: not inside Trainer::fit");
  if (name.empty() || name.find_first_of("\n\r") != std::string::npos) {
    throw std::invalid_argument(
        "train::LightningModule::log: a metric name must be one "
        "non-empty line, got '" +
        name + "'");
  }
  if (tensor != nullptr && tensor->numel() != 1) {
    throw std::invalid_argument("train::LightningModule::log: '" + name +
                                "' must be one number, got a tensor of shape " +
                                c10::str(tensor->sizes()));
  }
  auto& f = *fit_;
  const bool validating = f.validating;
  // Lightning's defaults: per step in training_step, per epoch elsewhere.
  const bool training_step = f.in_step && !validating;
  const bool on_step = options.on_step().value_or(training_step);
  const bool on_epoch = options.on_epoch().value_or(!training_step);
  if (!training_step && on_step) {
    throw std::invalid_argument("train::LightningModule::log: '" + name +
                                "' with on_step outside training_step; only training steps have "
                                "step values");
  }
  double weight = static_cast<double>(options.batch_size());
  if (weight <= 0) weight = f.in_step ? static_cast<double>(std::max<int64_t>(f.batch_size, 1)) : 1;
  if (f.defer_logs && training_step) {  // added after the step, and after each replay of it
    if (f.capture->capturing() && (tensor == nullptr || !tensor->is_cuda())) {
      throw std::runtime_error(
          "training_step logs '" + name + "' as " +
          (tensor == nullptr ? std::string("a number")
                             : "a tensor on the " + tensor->device().str()) +
          ", which a replayed step cannot compute again; log a tensor computed on the GPU");
    }
    // A copy: what the rest of the step changes in place (a parameter, a
    // buffer) is logged as it was here, and a replay writes the copy again.
    f.step_logs.push_back({name, tensor != nullptr ? tensor->detach().clone() : torch::Tensor(),
                           value, weight, on_step, on_epoch, options.prog_bar(),
                           options.sync_dist()});
    return;
  }
  (validating ? f.val_log : f.train_log)
      .add(name, tensor, value, weight, on_step, on_epoch, options.prog_bar(), options.sync_dist());
}

void Trainer::run_fit(std::shared_ptr<LightningModule> module,
                      std::unique_ptr<detail::BatchStream> train,
                      std::unique_ptr<detail::BatchStream> val) {
  if (fit_) throw std::logic_error("train::Trainer::fit: called twice; make a new Trainer");
  if (!module) throw std::invalid_argument("train::Trainer::fit: the module is null");
  fit_ = std::make_unique<Fit>(get_context(), module, std::move(train), std::move(val));
  // Which fit of the train function this is: a replacement that joins one
  // must be in the same (it is compared as part of the setup).
  static uint64_t entry = 0;
  static int64_t fits = 0;
  if (entry != detail::entry_serial()) {
    entry = detail::entry_serial();
    fits = 0;
  }
  fit_->ordinal = ++fits;
  struct Attach {  // the module knows its trainer while fit runs
    LightningModule& module;
    ~Attach() { module.trainer_ = nullptr; }
  } attach{*module};
  module->trainer_ = this;
  try {
    fit_->run(*this);
  } catch (const std::exception& error) {
    for (const auto& callback : callbacks_) {
      try {
        callback->on_exception(*this, *module, error);
      } catch (...) {  // the first error is the one that counts
      }
    }
    throw;
  }
}

Trainer::Fit::Fit(Context ctx, std::shared_ptr<LightningModule> m,
                  std::unique_ptr<detail::BatchStream> t, std::unique_ptr<detail::BatchStream> v)
    : context(std::move(ctx)),
      module(std::move(m)),
      train(std::move(t)),
      val(std::move(v)),
      device(context.device()) {}

void Trainer::Fit::run(Trainer& trainer) {
  const auto& options = trainer.options_;
  if (options.precision() == Precision::kFP16Mixed && !device.is_cuda()) {
    throw std::invalid_argument(
        "train::Trainer: precision 16-mixed needs a CUDA device; on the CPU use bf16-mixed");
  }
  // A rank that replaces a lost one takes what the others have at their next
  // step boundary: prepare_model joins their group, catch_up the rest.
  const bool replacement = detail::joining();
  check_same_setup(trainer);  // a replacement's is checked as it catches up
  if (val && options.limit_val_batches() != 0 && val->size() == 0) {
    // Equal on every rank: each rank gets size / world samples.
    throw std::invalid_argument(
        "train::Trainer::fit: the validation set gives no batch to any of the " +
        std::to_string(context.world_size()) +
        " ranks (fewer samples than ranks, or drop_last with fewer than a batch each); pass a "
        "larger one, or none");
  }
  auto checkpoint = options.resume() && !replacement ? get_checkpoint() : std::nullopt;
  if (checkpoint) load_model(*checkpoint);
  prepare_model(module, options.model());
  auto config = module->configure_optimizers();
  if (!config.optimizer) {
    throw std::invalid_argument(
        "train::LightningModule::configure_optimizers returned no optimizer");
  }
  optimizer = config.optimizer;
  scheduler = config.scheduler;
  interval = config.interval;
  if (options.precision() == Precision::kFP16Mixed) scaler.emplace(options.grad_scaler());
  if (checkpoint) load_state(trainer, *checkpoint);
  if (replacement) {
    catch_up(trainer);
  } else {
    detail::declare_joinable(true);  // this loop takes a replacement at its step boundaries
  }
  optimizer->zero_grad();
  setup_capture(trainer);

  for (const auto& callback : trainer.callbacks_) callback->on_fit_start(trainer, *module);
  // An epoch resumed in its middle is finished as it would have been (its
  // validation, report and checkpoint), even if the stop or the last step
  // came before the checkpoint it resumed from.
  while (epoch < options.max_epochs() && (batch > 0 || (!stopping && !steps_done(options)))) {
    train_epoch(trainer);
  }
  detail::declare_joinable(false);  // no step boundary follows
  for (const auto& callback : trainer.callbacks_) callback->on_fit_end(trainer, *module);
}

std::map<std::string, double> Trainer::Fit::synced_values(detail::MetricLog& log,
                                                          detail::MetricLog::Which which) {
  if (!group()) return log.values(nullptr, device, which);
  // A rank lost meanwhile: the survivors average again, in their group.
  std::map<std::string, double> values;
  detail::run_surviving(
      [&](c10d::ProcessGroup& group) { values = log.values(&group, device, which); });
  return values;
}

bool Trainer::Fit::steps_done(const TrainerOptions& options) const {
  return options.max_steps() >= 0 && global_step >= options.max_steps();
}

std::string Trainer::Fit::setup_text(const Trainer& trainer) const {
  const auto& o = trainer.options_;
  std::ostringstream setup;
  setup << "fit " << ordinal << " of the train function, max_epochs " << o.max_epochs()
        << ", max_steps " << o.max_steps() << ", limit_train_batches " << o.limit_train_batches()
        << ", limit_val_batches " << o.limit_val_batches() << ", val_check_interval "
        << o.val_check_interval() << ", check_val_every_n_epoch " << o.check_val_every_n_epoch()
        << ", accumulate_grad_batches " << o.accumulate_grad_batches() << ", log_every_n_steps "
        << o.log_every_n_steps() << ", gradient_clip_val " << o.gradient_clip_val() << " by "
        << static_cast<int>(o.gradient_clip_algorithm()) << ", precision "
        << precision_name(o.precision()) << ", resume " << o.resume() << ", validation "
        << (val ? "yes" : "no") << ", capture " << o.capture().enabled() << " after "
        << o.capture().warmup_steps();
  for (const auto* loader : {&o.train_loader(), &o.val_loader()}) {
    setup << ", loader batch_size " << loader->batch_size() << " shuffle " << loader->shuffle()
          << " drop_last " << loader->drop_last() << " seed " << loader->seed()
          << " allow_duplicates " << loader->allow_duplicates();
  }
  setup << ", callbacks [";
  for (size_t i = 0; i < trainer.callbacks_.size(); ++i) {
    const auto& c = trainer.callbacks_[i];
    setup << (i ? ", " : "") << c->state_key() << " every " << c->step_interval() << " steps";
  }
  setup << "]";
  return setup.str();
}

void Trainer::Fit::check_same_setup(const Trainer& trainer) {
  if (!group()) return;
  if (auto texts = detail::texts_if_different(*group(), device, setup_text(trainer))) {
    for (size_t rank = 1; rank < texts->size(); ++rank) {
      if ((*texts)[rank] == (*texts)[0]) continue;
      throw std::runtime_error(
          "train::Trainer::fit: rank " + std::to_string(rank) +
          "'s options or callbacks differ from rank 0's (rank 0: " + (*texts)[0] + "; rank " +
          std::to_string(rank) + ": " + (*texts)[rank] + "); every rank must fit with the same");
    }
  }
}

void Trainer::Fit::train_epoch(Trainer& trainer) {
  const auto& options = trainer.options_;
  const int64_t first = batch;
  if (first == 0) {  // else resumed in the middle: what it had done stands
    train_log.clear();
    validated_epoch = false;
  }
  epoch_done = false;
  for (const auto& callback : trainer.callbacks_) callback->on_train_epoch_start(trainer, *module);
  module->train();
  // What the last epoch's end and this one's start changed on the host (the
  // scheduler's learning rate, a callback's) is captured again.
  recapture();
  train->start(epoch, first);
  int64_t batches = train->size();
  if (options.limit_train_batches() >= 0) {
    batches = std::min(batches, options.limit_train_batches());
  }
  for (int64_t index = first; index < batches && !steps_done(options); ++index) {
    // A step boundary, with no gradients accumulated: where a replacement joins.
    if (detail::join_due() && index % options.accumulate_grad_batches() == 0) {
      take_replacement(trainer);
    }
    Batch* next = train->next();
    if (next == nullptr) break;
    stepped = training_batch(trainer, *next, index, index + 1 == batches);
    batch = index + 1;
    // Decided from counters alone, the same on every rank.
    const bool step_sync = stepped && step_sync_due(trainer);
    const bool validate_now = divides(options.val_check_interval(), index + 1) &&
                              index + 1 < batches && trainer.has_validation();
    // The callbacks see this step's averaged values.
    if (step_sync) update_step_values();
    for (const auto& callback : trainer.callbacks_) {
      callback->on_train_batch_end(trainer, *module, *next, index);
    }
    if (validate_now) validate(trainer);
    // One sync point after both, so that a checkpoint taken there resumes
    // after this batch's validation. Within an accumulation window a
    // checkpoint would lose the gradients accumulated so far: the requests
    // wait for the next step's sync point.
    if (step_sync || (validate_now && stepped)) sync_point(trainer, step_sync, batches);
  }
  stepped = false;
  at_epoch_end = true;
  if (trainer.has_validation() && divides(options.check_val_every_n_epoch(), epoch + 1)) {
    validate(trainer);
  }
  module->on_train_epoch_end();
  for (const auto& [name, value] : synced_values(train_log, detail::MetricLog::Which::kBoth)) {
    callback_metrics[name] = value;
  }
  if (scheduler && interval == SchedulerInterval::kEpoch) {
    scheduler->step();
    ++scheduler_steps;
  }
  epoch_done = true;  // a checkpoint from here on resumes at the next epoch
  for (const auto& callback : trainer.callbacks_) callback->on_train_epoch_end(trainer, *module);
  sync_point(trainer, /*step_sync=*/false, batches);
  ++epoch;
  batch = 0;
  epoch_done = false;
  at_epoch_end = false;
}

bool Trainer::Fit::training_batch(Trainer& trainer, Batch& data, int64_t index, bool last) {
  const auto& options = trainer.options_;
  batch_size = data.data.dim() > 0 ? data.data.size(0) : 1;
  const int64_t accumulate = options.accumulate_grad_batches();
  const bool accumulating = accumulate > 1 && (index + 1) % accumulate != 0 && !last;
  if (capture) {  // never with accumulation
    captured_batch(data, index);
  } else {
    forward_backward(trainer, data, index, accumulating);
    if (accumulating) return false;
    optimizer_step(trainer);
  }
  ++global_step;
  if (scheduler && interval == SchedulerInterval::kStep) {
    scheduler->step();
    ++scheduler_steps;
  }
  return true;
}

torch::Tensor Trainer::Fit::forward_backward(Trainer& trainer, Batch& data, int64_t index,
                                             bool accumulating) {
  const int64_t accumulate = trainer.options_.accumulate_grad_batches();
  std::optional<NoSync> no_sync;
  if (accumulating) no_sync.emplace(*module);
  torch::Tensor loss;
  {
    std::optional<Autocast> autocast;
    enter_autocast(autocast, trainer.options_.precision(), device);
    in_step = true;
    loss = module->training_step(data, index);
    in_step = false;
  }
  if (!loss.defined() || loss.numel() != 1) {
    throw std::runtime_error(
        "train::LightningModule::training_step must return the loss, one "
        "number; got " +
        (loss.defined() ? "a tensor of shape " + c10::str(loss.sizes())
                        : std::string("an undefined tensor")));
  }
  if (accumulate > 1) loss = loss / static_cast<double>(accumulate);
  (scaler ? scaler->scale(loss) : loss).backward();
  return loss;
}

void Trainer::Fit::optimizer_step(Trainer& trainer) {
  const auto& options = trainer.options_;
  if (scaler) scaler->unscale_(*optimizer);
  // As Lightning: the hook sees the gradients before clipping.
  for (const auto& callback : trainer.callbacks_) {
    detail::default_hook_reached = false;
    callback->on_before_optimizer_step(trainer, *module, *optimizer);
    if (!detail::default_hook_reached && !overriding_hook) overriding_hook = callback->state_key();
  }
  if (options.gradient_clip_val() > 0) {
    if (options.gradient_clip_algorithm() == GradientClip::kNorm) {
      detail::clip_grad_norm(module->parameters(), options.gradient_clip_val());
    } else {
      torch::nn::utils::clip_grad_value_(module->parameters(), options.gradient_clip_val());
    }
  }
  if (scaler) {
    scaler->step(*optimizer);
    scaler->update();
  } else {
    optimizer->step();
  }
  optimizer->zero_grad();
}

bool Trainer::Fit::step_sync_due(const Trainer& trainer) const {
  if (divides(trainer.options_.log_every_n_steps(), global_step)) return true;
  return std::any_of(trainer.callbacks_.begin(), trainer.callbacks_.end(),
                     [&](const auto& c) { return divides(c->step_interval(), global_step); });
}

void Trainer::Fit::validate(Trainer& trainer) {
  const auto& options = trainer.options_;
  val_log.clear();
  validating = true;
  {
    torch::NoGradGuard no_grad;
    module->eval();
    val->start(epoch, 0);
    for (int64_t index = 0; options.limit_val_batches() < 0 || index < options.limit_val_batches();
         ++index) {
      Batch* next = val->next();
      if (next == nullptr) break;
      batch_size = next->data.dim() > 0 ? next->data.size(0) : 1;
      std::optional<Autocast> autocast;
      enter_autocast(autocast, options.precision(), device);
      in_step = true;
      module->validation_step(*next, index);
      in_step = false;
    }
    module->on_validation_epoch_end();
  }
  validating = false;
  validation_ran = true;
  validated_epoch = true;
  module->train();
  for (const auto& [name, value] : synced_values(val_log, detail::MetricLog::Which::kEpoch)) {
    callback_metrics[name] = value;
  }
  for (const auto& callback : trainer.callbacks_) callback->on_validation_end(trainer, *module);
}

void Trainer::Fit::update_step_values() {
  for (const auto& [name, value] : synced_values(train_log, detail::MetricLog::Which::kStep)) {
    callback_metrics[name] = value;
  }
}

void Trainer::Fit::sync_point(Trainer& trainer, bool step_sync, int64_t batches) {
  const auto& options = trainer.options_;
  // The ranks' requests, combined: any rank's counts for all.
  auto flag = [](bool b) { return b ? 1.0 : 0.0; };
  std::array<double, 3> flags{flag(want_report), flag(want_checkpoint), flag(want_stop)};
  if (group()) {
    auto buffer =
        torch::tensor(std::vector<double>(flags.begin(), flags.end()), torch::kFloat64).to(device);
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    // Once a step: a rank lost here is survived like one lost in backward.
    detail::allreduce_surviving(buffer, max);
    auto agreed = buffer.cpu();
    for (size_t i = 0; i < flags.size(); ++i) {
      flags[i] = agreed[static_cast<int64_t>(i)].item<double>();
    }
  }
  want_report = want_checkpoint = want_stop = false;
  if (flags[2] > 0) stopping = true;

  if (step_sync && divides(options.log_every_n_steps(), global_step) && detail::leads_group() &&
      train_log.has_prog_bar()) {
    std::ostringstream line;
    line << "epoch " << epoch << " step " << batch << "/" << batches << ":";
    for (const auto& [name, value] : callback_metrics) {
      if (train_log.is_prog_bar(name)) line << " " << name << " " << value;
    }
    std::cout << line.str() << std::endl;
  }
  if (flags[0] == 0 && flags[1] == 0) return;
  Metrics metrics;
  for (const auto& [name, value] : callback_metrics) metrics.emplace(name, value);
  metrics.insert_or_assign("epoch", epoch);
  metrics.insert_or_assign("step", global_step);
  if (flags[1] > 0) {
    TempDir dir;
    save_checkpoint(trainer, dir.path());
    report(metrics, Checkpoint::from_directory(dir.path()), options.checkpoint_upload());
  } else {
    report(metrics);
  }
}

}  // namespace train
