// Train functions that check prepare_model and prepare_data_loader from the
// inside: each writes what it observed to files under config "out" or reports
// it, for tests/integration/test_ddp.cpp to compare.

#include <train/train.h>

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

namespace {

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

train::ModelOptions model_options(const train::Config& config) {
  return train::ModelOptions()
      .bucket_cap_mb(config.get<double>("bucket_cap_mb", 25))
      .first_bucket_cap_mb(config.get<double>("first_bucket_cap_mb", 1))
      .find_unused_parameters(config.get<bool>("find_unused", false))
      .check_divergence(config.get<bool>("check_divergence", true));
}

// One SGD step of the MLP on a random batch of 4.
void random_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer) {
  optimizer.zero_grad();
  torch::mse_loss(model->forward(torch::randn({4, 8})), torch::randn({4, 4})).backward();
  optimizer.step();
}

// max - min of each element across ranks, reduced to its largest value.
double spread_across_ranks(const torch::Tensor& flat) {
  auto group = train::process_group();
  std::vector<torch::Tensor> hi{flat.clone()}, lo{flat.clone()};
  c10d::AllreduceOptions max_options, min_options;
  max_options.reduceOp = c10d::ReduceOp::MAX;
  min_options.reduceOp = c10d::ReduceOp::MIN;
  group->allreduce(hi, max_options)->wait();
  group->allreduce(lo, min_options)->wait();
  return (hi[0] - lo[0]).max().item<double>();
}

torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

torch::Tensor flat_grads(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.grad().detach().flatten().clone());
  return torch::cat(parts);
}

void write_tensor(const std::string& path, const torch::Tensor& t) {
  std::ofstream out(path);
  out.precision(17);
  auto data = t.cpu().contiguous();
  for (int64_t i = 0; i < data.numel(); ++i) out << data[i].item<double>() << "\n";
}

}  // namespace

// The global batch of 16 is split across ranks; SGD for `steps` steps. Rank 0
// writes the final parameters to config "out": with 1 or 2 workers they must match.
void equivalence(const train::Config& config) {
  auto ctx = train::get_context();
  torch::manual_seed(0);
  auto model = train::prepare_model(make_mlp(), model_options(config));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::manual_seed(1234);
  auto x = torch::randn({16, 8}).to(ctx.device());  // drawn on the CPU: the same on any device
  auto y = torch::randn({16, 4}).to(ctx.device());
  const int64_t per_rank = 16 / ctx.world_size();
  auto local_x = x.narrow(0, per_rank * ctx.world_rank(), per_rank);
  auto local_y = y.narrow(0, per_rank * ctx.world_rank(), per_rank);
  for (int step = 0; step < config.get<int>("steps", 5); ++step) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(local_x), local_y).backward();
    optimizer.step();
  }
  auto params = flat_parameters(*model);
  if (ctx.world_rank() == 0) write_tensor(config.get<std::string>("out"), params);
  double spread = ctx.world_size() > 1 ? spread_across_ranks(params) : 0.0;
  train::report({{"replica_spread", spread}});
}

// Ranks initialise with different seeds; prepare_model must make them identical.
void init(const train::Config& config) {
  auto ctx = train::get_context();
  torch::manual_seed(100 + ctx.world_rank());
  auto model = make_mlp();
  double before = spread_across_ranks(flat_parameters(*model));
  model = train::prepare_model(model, model_options(config));
  double after = spread_across_ranks(flat_parameters(*model));
  train::report({{"spread_before", before}, {"spread_after", after}});
}

// Each rank writes the sample indices it saw in epochs 0 and 1, in order.
void sampler(const train::Config& config) {
  struct Indices : torch::data::datasets::Dataset<Indices> {
    torch::data::Example<> get(size_t i) override {
      return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(static_cast<int64_t>(i))};
    }
    c10::optional<size_t> size() const override { return 103; }
  };
  auto ctx = train::get_context();
  auto loader = train::prepare_data_loader(Indices(), train::LoaderOptions().batch_size(10));
  for (size_t epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    std::vector<torch::Tensor> seen;
    for (auto& batch : loader) seen.push_back(batch.data);
    write_tensor(config.get<std::string>("out") + "/rank" + std::to_string(ctx.world_rank()) +
                     "-epoch" + std::to_string(epoch),
                 torch::cat(seen));
  }
  // A sampler of the user's own decides what this rank reads: here, everything.
  auto own = train::prepare_data_loader(Indices(), torch::data::samplers::SequentialSampler(103),
                                        train::LoaderOptions().batch_size(10));
  int64_t own_samples = 0;
  for (auto& batch : own) own_samples += batch.data.size(0);
  train::report({{"batches", static_cast<int64_t>(loader.size())}, {"own_samples", own_samples}});
}

// Two backward passes under no_sync then one outside it; compared with the same
// passes on an unprepared copy whose gradients are averaged by hand.
void no_sync(const train::Config& config) {
  auto ctx = train::get_context();
  torch::manual_seed(0);
  auto reference = make_mlp();
  auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
  model = train::prepare_model(model, model_options(config));
  torch::manual_seed(50 + ctx.world_rank());  // different data on every rank
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(torch::randn({4, 8}));
    ys.push_back(torch::randn({4, 4}));
  }
  double spread_local = 0;
  {
    auto guard = train::NoSync(*model);
    for (int i = 0; i < 2; ++i) torch::mse_loss(model->forward(xs[i]), ys[i]).backward();
    spread_local = spread_across_ranks(flat_grads(*model));
  }
  torch::mse_loss(model->forward(xs[2]), ys[2]).backward();
  auto synced = flat_grads(*model);

  for (int i = 0; i < 3; ++i) torch::mse_loss(reference->forward(xs[i]), ys[i]).backward();
  // Every parameter is used here, so every .grad is defined on both.
  std::vector<torch::Tensor> expected{flat_grads(*reference)};
  train::process_group()->allreduce(expected)->wait();
  expected[0].div_(ctx.world_size());
  train::report({{"spread_under_no_sync", spread_local},
                 {"spread_after_sync", spread_across_ranks(synced)},
                 {"error_vs_reference", (synced - expected[0]).abs().max().item<double>()}});
}

// A model with a layer that the forward pass never uses.
void unused(const train::Config& config) {
  struct WithUnused : torch::nn::Module {
    torch::nn::Linear used{nullptr}, unused{nullptr};
    WithUnused() {
      used = register_module("used", torch::nn::Linear(4, 2));
      unused = register_module("unused", torch::nn::Linear(4, 2));
    }
    torch::Tensor forward(const torch::Tensor& x) { return used(x); }
  };
  auto model = train::prepare_model(std::make_shared<WithUnused>(), model_options(config));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    model->forward(torch::randn({8, 4})).sum().backward();
    optimizer.step();
  }
  // As in one process: a parameter no rank used has no gradient.
  train::report({{"unused_grad_defined", model->unused->weight.grad().defined()},
                 {"used_grad_defined", model->used->weight.grad().defined()}});
}

// Every rank saves its model and loads it back after prepare_model, as a port of
// an example that restores a checkpoint may, then trains on its own data.
void load_after_prepare(const train::Config& config) {
  auto ctx = train::get_context();
  auto model = train::prepare_model(make_mlp(), model_options(config));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  train::TempDir dir;
  const auto file = (dir.path() / "model.pt").string();
  torch::save(model, file);
  torch::load(model, file);
  torch::manual_seed(10 + ctx.world_rank());  // different data on every rank
  for (int step = 0; step < 3; ++step) {
    random_step(model, optimizer);
  }
  train::report({{"replica_spread", spread_across_ranks(flat_parameters(*model))}});
}

// Rank 1 builds a narrower first layer.
void mismatch(const train::Config& config) {
  auto ctx = train::get_context();
  auto model = make_mlp();
  if (ctx.world_rank() == 1) model = torch::nn::Sequential(torch::nn::Linear(8, 24));
  train::prepare_model(model, model_options(config));
  train::report({});
}

// Rank 1 changes one parameter after prepare_model, then every rank reports.
void diverge(const train::Config& config) {
  auto ctx = train::get_context();
  auto model = train::prepare_model(make_mlp(), model_options(config));
  if (ctx.world_rank() == 1) {
    torch::NoGradGuard no_grad;
    model[2]->as<torch::nn::Linear>()->bias.add_(1e-3);
  }
  train::report({{"reported", true}});
}

// A prepared model, two training steps each followed by a report; then every
// rank but rank 1 makes a last report of its own (with no collective between).
void fewer_reports(const train::Config& config) {
  auto ctx = train::get_context();
  auto model = train::prepare_model(make_mlp(), model_options(config));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 2; ++i) {
    random_step(model, optimizer);
    train::report({{"step", i}});
  }
  if (ctx.world_rank() != 1) train::report({{"final", true}});
}

// Rank 1 returns after config "rank1_steps" training steps (default 1), while
// the others train config "steps" steps (default 50), without reporting.
void early_return(const train::Config& config) {
  auto ctx = train::get_context();
  auto model = train::prepare_model(make_mlp(), model_options(config));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  const int steps =
      ctx.world_rank() == 1 ? config.get<int>("rank1_steps", 1) : config.get<int>("steps", 50);
  for (int i = 0; i < steps; ++i) {
    random_step(model, optimizer);
  }
}

// A dataset of 100 samples on rank 0 and config "rank1_size" (default 104) on
// the others, through prepare_data_loader.
void dataset_sizes(const train::Config& config) {
  struct Numbers : torch::data::datasets::Dataset<Numbers> {
    explicit Numbers(size_t n) : n(n) {}
    torch::data::Example<> get(size_t i) override {
      return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(static_cast<int64_t>(i))};
    }
    c10::optional<size_t> size() const override { return n; }
    size_t n;
  };
  auto ctx = train::get_context();
  const size_t size =
      ctx.world_rank() == 0 ? 100 : static_cast<size_t>(config.get<int>("rank1_size", 104));
  auto loader = train::prepare_data_loader(Numbers(size), train::LoaderOptions().batch_size(10));
  int64_t samples = 0;
  for (auto& batch : loader) samples += batch.data.size(0);
  train::report({{"samples", samples}});
}

// Sizes 10, 101 and 1000, shuffled or not, with duplicates or not, epochs 0
// to 3: the indices this rank reads, as JSON lines
// "<size>/<shuffle>/<allow_duplicates>/<epoch>/<rank>: [...]" in config "out".
void sampler_indices(const train::Config& config) {
  auto ctx = train::get_context();
  std::ofstream out(config.get<std::string>("out") + "/rank" + std::to_string(ctx.world_rank()) +
                    ".txt");
  for (size_t size : {10, 101, 1000}) {
    for (bool shuffle : {true, false}) {
      for (bool duplicates : {true, false}) {
        train::DistributedSampler sampler(size, ctx, shuffle, duplicates);
        for (size_t epoch = 0; epoch < 4; ++epoch) {
          sampler.set_epoch(epoch);
          sampler.reset();
          out << size << "/" << shuffle << "/" << duplicates << "/" << epoch << "/"
              << ctx.world_rank() << ":";
          while (auto batch = sampler.next(7)) {
            for (size_t i : *batch) out << " " << i;
          }
          out << "\n";
        }
      }
    }
  }
  train::report({});
}

TRAIN_FUNC(fewer_reports);
TRAIN_FUNC(early_return);
TRAIN_FUNC(dataset_sizes);
TRAIN_FUNC(sampler_indices);
TRAIN_FUNC(equivalence);
TRAIN_FUNC(init);
TRAIN_FUNC(sampler);
TRAIN_FUNC(no_sync);
TRAIN_FUNC(unused);
TRAIN_FUNC(load_after_prepare);
TRAIN_FUNC(mismatch);
TRAIN_FUNC(diverge);

namespace {

// "<event> <step> <unix seconds> <pid>", appended to <events>/rank<r>.txt.
void log_event(const std::string& events, int rank, const char* event, int step) {
  auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch());
  std::ofstream out(events + "/rank" + std::to_string(rank) + ".txt", std::ios::app);
  out.precision(17);
  out << event << " " << step << " " << now.count() << " " << ::getpid() << "\n";
}

}  // namespace

// The loop tools/bench/recovery.py restarts (its torchrun twin is
// tools/bench/recovery_torchrun.py): an MLP under prepare_model, Adam, a batch
// of 64 per rank, a checkpoint of model and optimizer every `checkpoint_every`
// steps (1). Each rank logs "start" on entry, "loaded" once the checkpoint is read, and "step"
// after each step, to config "events".
void recovery(const train::Config& config) {
  auto ctx = train::get_context();
  const auto events = config.get<std::string>("events");
  log_event(events, ctx.world_rank(), "start", -1);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 10));
  auto checkpoint = train::get_checkpoint();
  int start = 0;
  if (checkpoint) {
    torch::load(net, (checkpoint->path() / "model.pt").string());
    std::ifstream(checkpoint->path() / "step.txt") >> start;
  }
  auto model = train::prepare_model(net);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  if (checkpoint) torch::load(optimizer, (checkpoint->path() / "optimizer.pt").string());
  log_event(events, ctx.world_rank(), "loaded", start);
  torch::manual_seed(ctx.world_rank());
  const int steps = config.get<int>("steps", 40);
  const int sleep_ms = config.get<int>("sleep_ms", 50);
  const int checkpoint_every = std::max(1, config.get<int>("checkpoint_every", 1));
  for (int step = start; step < steps; ++step) {
    auto x = torch::randn({64, 64});
    auto y = torch::randint(0, 10, {64});
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    log_event(events, ctx.world_rank(), "step", step);
    if ((step + 1) % checkpoint_every != 0) {
      train::report({{"step", step}, {"loss", loss.item<double>()}});
    } else {
      train::TempDir dir;
      if (ctx.world_rank() == 0) {
        torch::save(model, (dir.path() / "model.pt").string());
        torch::save(optimizer, (dir.path() / "optimizer.pt").string());
        std::ofstream(dir.path() / "step.txt") << step + 1;
      }
      train::report({{"step", step}, {"loss", loss.item<double>()}},
                    train::Checkpoint::from_directory(dir.path()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
}

TRAIN_FUNC(recovery);

// Recovery in place (--recovery in-place): the MLP under prepare_model (small
// buckets, so that some collectives are in flight when a rank dies), Adam,
// `steps` steps on each rank's own random batches of 8, a report every
// `report_every` steps. Rank `kill_rank` kills itself with SIGKILL inside the
// backward pass of step `kill_step`, once its last gradient is ready (and
// rank `kill_rank2` at `kill_step2`; -1: none). With `checkpoint_every`, every
// such report has a checkpoint (`upload_mode` sync or async, with a file of
// 1 KiB per rank, `checkpoint_kb` KiB from the rank about to die), and with
// `marker` the kill is at the end of step `kill_step`, after its report, once
// per run (the marker file says it happened). With `scaler`, each step goes
// through a train::GradScaler (its agreement on inf is a collective too). Rank `stall_rank` sleeps
// `stall_ms` before the backward pass of step `stall_step`. A rank that
// finishes writes how many steps it applied and its parameters to
// <out>/rank<r>.txt.
void survivors(const train::Config& config) {
  auto ctx = train::get_context();
  torch::manual_seed(0);
  auto net = make_mlp();
  auto checkpoint = train::get_checkpoint();
  int start = 0;
  if (checkpoint) {
    torch::load(net, (checkpoint->path() / "model.pt").string());
    std::ifstream(checkpoint->path() / "step.txt") >> start;
  }
  auto model = train::prepare_model(net, model_options(config));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  if (checkpoint) torch::load(optimizer, (checkpoint->path() / "optimizer.pt").string());
  const int steps = config.get<int>("steps", 30);
  const int report_every = config.get<int>("report_every", 5);
  const int checkpoint_every = config.get<int>("checkpoint_every", 0);
  const int sleep_ms = config.get<int>("sleep_ms", 0);
  const auto marker = config.get<std::string>("marker", "");
  const auto mode = config.get<std::string>("upload_mode", "sync") == "async"
                        ? train::CheckpointUploadMode::kAsync
                        : train::CheckpointUploadMode::kSync;
  int kill_step = -1;
  if (ctx.world_rank() == config.get<int>("kill_rank", -1))
    kill_step = config.get<int>("kill_step", -1);
  if (ctx.world_rank() == config.get<int>("kill_rank2", -1)) {
    kill_step = config.get<int>("kill_step2", -1);
  }
  if (!marker.empty() && std::filesystem::exists(marker)) kill_step = -1;
  torch::manual_seed(100 + ctx.world_rank() + 1000 * start);
  std::optional<train::GradScaler> scaler;
  if (config.get<bool>("scaler", false)) scaler.emplace();
  int applied = 0;
  for (int step = start; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(torch::randn({8, 8})), torch::randn({8, 4}));
    if (ctx.world_rank() == config.get<int>("stall_rank", -1) &&
        step == config.get<int>("stall_step", -1)) {  // alive, but too slow for the collective
      std::this_thread::sleep_for(std::chrono::milliseconds(config.get<int>("stall_ms", 0)));
    }
    if (step == kill_step && marker.empty()) {
      // The first layer's gradient comes last: the later layers' buckets are
      // allreduced (or waiting for this rank) when it dies.
      model->parameters().front().register_hook([](const torch::Tensor& grad) {
        ::raise(SIGKILL);
        return grad;
      });
    }
    if (scaler) {
      scaler->scale(loss).backward();
      scaler->step(optimizer);
      scaler->update();
    } else {
      loss.backward();
      optimizer.step();
    }
    ++applied;
    const double loss_value = loss.item<double>();
    if ((step + 1) % report_every == 0) {
      train::Metrics metrics{{"step", step}, {"applied", applied}, {"loss", loss_value}};
      if (checkpoint_every > 0 && (step + 1) % checkpoint_every == 0) {
        train::TempDir dir;
        if (ctx.world_rank() == 0) {
          torch::save(net, (dir.path() / "model.pt").string());
          torch::save(optimizer, (dir.path() / "optimizer.pt").string());
          std::ofstream(dir.path() / "step.txt") << step + 1;
        }
        std::ofstream filler(dir.path() / ("filler-" + std::to_string(ctx.world_rank())));
        const int kb = step == kill_step ? config.get<int>("checkpoint_kb", 1) : 1;
        filler << std::string(static_cast<size_t>(kb) * 1024, 'x');
        filler.close();
        train::report(metrics, train::Checkpoint::from_directory(dir.path()), mode);
      } else {
        train::report(metrics);
      }
    }
    if (step == kill_step && !marker.empty()) {
      std::ofstream(marker) << "killed\n";
      ::raise(SIGKILL);
    }
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  std::ofstream out(config.get<std::string>("out") + "/rank" + std::to_string(ctx.world_rank()) +
                    ".txt");
  out.precision(17);
  out << applied << "\n";
  auto params = flat_parameters(*model);
  for (int64_t i = 0; i < params.numel(); ++i) out << params[i].item<double>() << "\n";
}

TRAIN_FUNC(survivors);

// A loop of its own over a loader's epochs(), which takes a replacement for a
// lost rank: SGD with momentum 0.9 over a TensorDataset of fixed random
// samples, `epochs` (3) epochs of `batches` (10) batches of 8 per rank.
// optimizer: "train" (train::optim::SGD), "registered" (torch::optim::SGD made
// known with train::register_optimizer) or "unknown" (torch::optim::SGD, not
// made known: no replacement). Rank kill_rank dies with SIGKILL in the backward
// of its optimizer step kill_step (counted from 1) once: it writes <marker>
// first. Its replacement writes <marker>.replacement as it starts, and once
// the marker exists the lowest other rank waits for that, once, at most 60 s
// (unless await_replacement=false); with report_first=true the replacement
// first waits, before it says so, for the others' first report after the
// kill (<marker>.reported). Every step sleeps step_sleep_ms (20),
// so that the replacement joins with steps to spare. A report after each
// epoch: {epoch, applied}, and with checkpoint=true a checkpoint of each
// rank's rank-<r>.txt (its applied steps), rank 0's with model.txt,
// uploaded as `upload_mode` says (sync or async). Rank
// raise_rank raises before its step raise_step once the marker exists. Writes
// <out>/rank<r>.txt: the optimizer steps it applied, the global index of its
// first batch, then its parameters.
void epochs_loop(const train::Config& config) {
  auto ctx = train::get_context();
  const auto marker = config.get<std::string>("marker", "");
  const int kill_rank = config.get<int>("kill_rank", -1);
  const bool killed_once = !marker.empty() && std::filesystem::exists(marker);
  const bool report_first = config.get<bool>("report_first", false);
  if (killed_once && ctx.world_rank() == kill_rank) {
    for (int i = 0; report_first && i < 6000 && !std::filesystem::exists(marker + ".reported");
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ofstream(marker + ".replacement") << "started\n";
  }
  const int epochs = config.get<int>("epochs", 3);
  const int batches = config.get<int>("batches", 10);
  const int step_sleep_ms = config.get<int>("step_sleep_ms", 20);
  const bool checkpoint = config.get<bool>("checkpoint", false);
  const auto upload_mode = config.get<std::string>("upload_mode", "sync") == "async"
                               ? train::CheckpointUploadMode::kAsync
                               : train::CheckpointUploadMode::kSync;
  const int waiter = kill_rank == 0 ? 1 : 0;
  const int raise_step = ctx.world_rank() == config.get<int>("raise_rank", -1)
                             ? config.get<int>("raise_step", -1)
                             : -1;
  bool await_replacement = config.get<bool>("await_replacement", true);
  const auto awaited_after = report_first ? marker + ".reported" : marker;
  torch::manual_seed(0);
  auto model = train::prepare_model(make_mlp());
  const auto kind = config.get<std::string>("optimizer", "train");
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
  std::unique_ptr<torch::optim::SGD> optimizer;
  if (kind == "train") {
    optimizer = std::make_unique<train::optim::SGD>(model->parameters(), options);
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(), options);
  }
  std::optional<train::KnownOptimizer> known;
  if (kind == "registered") known.emplace(*optimizer);
  const auto samples = static_cast<int64_t>(batches) * 8 * ctx.world_size();
  train::TensorDataset dataset(torch::randn({samples, 8}), torch::randn({samples, 4}));
  auto loader = train::prepare_data_loader(dataset, train::LoaderOptions().batch_size(8));
  const int kill_step =
      ctx.world_rank() == kill_rank && !killed_once ? config.get<int>("kill_step", -1) : -1;
  int applied = 0;
  int64_t first_batch = -1;
  for (size_t epoch : loader.epochs(0, static_cast<size_t>(epochs))) {
    for (auto& batch : loader) {
      if (first_batch < 0) {
        first_batch =
            static_cast<int64_t>(epoch) * batches + static_cast<int64_t>(loader.batches_done());
      }
      if (await_replacement && ctx.world_rank() == waiter && !marker.empty() &&
          std::filesystem::exists(awaited_after)) {
        for (int i = 0; i < 6000 && !std::filesystem::exists(marker + ".replacement"); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        await_replacement = false;  // once
      }
      if (applied + 1 == raise_step && std::filesystem::exists(marker)) {
        throw std::runtime_error("raised at step " + std::to_string(raise_step));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(step_sleep_ms));
      optimizer->zero_grad();
      auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
      if (applied + 1 == kill_step) {
        model->parameters().front().register_hook([marker](const torch::Tensor& grad) {
          std::ofstream(marker) << "killed\n";
          ::raise(SIGKILL);
          return grad;
        });
      }
      loss.backward();
      optimizer->step();
      ++applied;
    }
    const train::Metrics metrics{{"epoch", static_cast<int>(epoch)}, {"applied", applied}};
    if (checkpoint) {
      train::TempDir dir;
      std::ofstream(dir.path() / ("rank-" + std::to_string(ctx.world_rank()) + ".txt"))
          << applied << "\n";
      if (ctx.world_rank() == 0) std::ofstream(dir.path() / "model.txt") << applied << "\n";
      train::report(metrics, train::Checkpoint::from_directory(dir.path()), upload_mode);
    } else {
      train::report(metrics);
    }
    if (report_first && ctx.world_rank() == waiter && std::filesystem::exists(marker) &&
        !std::filesystem::exists(marker + ".reported")) {
      std::ofstream(marker + ".reported") << "reported\n";
    }
  }
  std::ofstream out(config.get<std::string>("out") + "/rank" + std::to_string(ctx.world_rank()) +
                    ".txt");
  out.precision(17);
  out << applied << "\n" << first_batch << "\n";
  auto params = flat_parameters(*model);
  for (int64_t i = 0; i < params.numel(); ++i) out << params[i].item<double>() << "\n";
}

TRAIN_FUNC(epochs_loop);
