// What a Trainer checkpoint holds, and resuming from one. Rank 0 writes the
// shared state: model.pt, optimizer.pt and trainer.pt (the loop's position,
// the scheduler's steps, the GradScaler, each callback's state). Every rank
// writes rank-<r>.pt: its random generators and its partial sums of the
// epoch's logged values, so that an epoch resumed in its middle goes on as
// if it had not stopped.

#include <train/trainer.h>

#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <mutex>
#include <stdexcept>

#include "core/host.h"
#include "trainer/trainer_fit.h"

namespace train {
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kTrainerFile = "trainer.pt";

std::string rank_file(int rank) { return "rank-" + std::to_string(rank) + ".pt"; }

using detail::read_int;
using detail::write_int;

// For what a checkpoint of an older SDK may lack.
int64_t read_int_or(torch::serialize::InputArchive& archive, const std::string& key,
                    int64_t otherwise) {
  torch::Tensor t;
  return archive.try_read(key, t, /*is_buffer=*/true) ? t.item<int64_t>() : otherwise;
}

torch::Tensor generator_state(c10::Device device) {
  auto generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(c10::Device device, const torch::Tensor& state) {
  auto generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

std::filesystem::path required(const Checkpoint& checkpoint, const char* file) {
  auto path = checkpoint.path() / file;
  if (!std::filesystem::exists(path)) {
    throw std::runtime_error("train::Trainer: checkpoint " + checkpoint.path().string() +
                             " has no " + file + "; it was not written by train::Trainer");
  }
  return path;
}

}  // namespace

std::string detail::callback_archive_key(const std::string& state_key) {
  std::string key = "callback_";
  for (unsigned char c : state_key) key += std::isalnum(c) ? static_cast<char>(c) : '_';
  return key;
}

void load_from_checkpoint(torch::nn::Module& module, const Checkpoint& checkpoint) {
  torch::serialize::InputArchive archive;
  archive.load_from(required(checkpoint, kModelFile).string(), torch::Device(torch::kCPU));
  module.load(archive);
}

void Trainer::Fit::load_model(const Checkpoint& checkpoint) {
  // Onto the CPU, where the module is until prepare_model moves it: a
  // checkpoint saved on a GPU resumes on a CPU and the other way round.
  load_from_checkpoint(*module, checkpoint);
}

void Trainer::Fit::read_position(torch::serialize::InputArchive& state) {
  epoch = read_int(state, "epoch");
  batch = read_int(state, "batch");
  global_step = read_int(state, "global_step");
  stopping = read_int_or(state, "stopping", 0) != 0;
  validation_ran = read_int_or(state, "validation_ran", 0) != 0;
  validated_epoch = read_int_or(state, "validated_epoch", 0) != 0;
}

void Trainer::Fit::read_rest(Trainer& trainer, torch::serialize::InputArchive& state,
                             const std::string& source,
                             const std::function<void()>& load_optimizer) {
  const int64_t steps = read_int(state, "scheduler_steps");
  // A scheduler steps once per optimizer step or once per epoch.
  if (epoch < 0 || batch < 0 || global_step < 0 || steps < 0 ||
      steps > std::max(global_step, epoch)) {
    throw std::runtime_error("train::Trainer: " + source + " holds an impossible position (epoch " +
                             std::to_string(epoch) + ", batch " + std::to_string(batch) +
                             ", step " + std::to_string(global_step) + ", scheduler steps " +
                             std::to_string(steps) + ")");
  }
  // LibTorch's schedulers keep their count to themselves: replay it, then
  // the optimizer's state puts back the learning rates it had.
  if (scheduler) {
    for (int64_t i = 0; i < steps; ++i) scheduler->step();
    scheduler_steps = steps;
  }
  load_optimizer();
  torch::serialize::InputArchive nested;
  if (scaler && state.try_read("grad_scaler", nested)) scaler->load(nested);
  for (const auto& callback : trainer.callbacks_) {
    torch::serialize::InputArchive archive;
    if (state.try_read(detail::callback_archive_key(callback->state_key()), archive)) {
      callback->on_load_checkpoint(trainer, archive);
    }
  }
}

void Trainer::Fit::load_state(Trainer& trainer, const Checkpoint& checkpoint) {
  torch::serialize::InputArchive state;
  state.load_from(required(checkpoint, kTrainerFile).string(), torch::Device(torch::kCPU));
  read_position(state);
  const int64_t saved_world = read_int(state, "world_size");
  const bool same_world = saved_world == context.world_size();
  if (!same_world && batch > 0) {
    // A regroup in the middle of an epoch. A shuffled sampler deals the
    // epoch's permutation out in turn, so the batches done so far are a
    // prefix of it: the same prefix in the new world's batches, rounded
    // down to a whole accumulation window. An ordered one
    // deals contiguous blocks: the epoch starts again.
    batch =
        trainer.options_.train_loader().shuffle() ? batch * saved_world / context.world_size() : 0;
    batch -= batch % trainer.options_.accumulate_grad_batches();  // a whole window
  }
  // A loader that saves where it is (a sharded dataset's) takes its
  // position: under another world size its epoch goes on with what no rank
  // was handed, from that part's first batch.
  torch::serialize::InputArchive loader;
  if (train->saves_position() && state.try_read("train_loader", loader)) {
    train->load(loader);
    if (!same_world) batch = 0;
  }
  read_rest(trainer, state, "checkpoint " + checkpoint.path().string(), [&] {
    torch::load(*optimizer, required(checkpoint, kOptimizerFile).string(), device);
  });
  // This rank's own file, which every rank of the world that saved it wrote
  // (a regroup to more workers leaves the new ranks' generators as they are).
  auto own = checkpoint.path() / rank_file(context.world_rank());
  if (!std::filesystem::exists(own) && context.world_rank() < saved_world) {
    throw std::runtime_error(
        "train::Trainer: checkpoint " + checkpoint.path().string() + " has no " +
        rank_file(context.world_rank()) + ", which rank " + std::to_string(context.world_rank()) +
        " of the " + std::to_string(saved_world) +
        " that saved it writes (its random generators and the epoch's partial sums): it is "
        "incomplete, and resuming from it would not go on as the run left off; resume from an "
        "earlier checkpoint");
  }
  if (std::filesystem::exists(own)) {
    torch::serialize::InputArchive mine;
    mine.load_from(own.string(), torch::Device(torch::kCPU));
    torch::Tensor cpu;
    mine.read("rng.cpu", cpu, /*is_buffer=*/true);
    set_generator_state(torch::kCPU, cpu);
    torch::Tensor cuda;
    if (device.is_cuda() && mine.try_read("rng.cuda", cuda, /*is_buffer=*/true)) {
      set_generator_state(device, cuda);
    }
    // The ranks' partial sums hold for the same ranks only.
    torch::serialize::InputArchive log;
    if (batch > 0 && same_world && mine.try_read("log", log)) train_log.load(log);
  }
  if (context.world_rank() == 0) {
    std::cout << "train::Trainer: resuming at epoch " << epoch << ", batch " << batch << " (step "
              << global_step << ") from " << checkpoint.path().string();
    if (!same_world) std::cout << ", saved by " << saved_world << " workers";
    std::cout << std::endl;
  }
}

void Trainer::Fit::write_state(Trainer& trainer, torch::serialize::OutputArchive& state) {
  write_int(state, "epoch", epoch_done ? epoch + 1 : epoch);
  write_int(state, "batch", epoch_done ? 0 : batch);
  write_int(state, "global_step", global_step);
  write_int(state, "scheduler_steps", scheduler_steps);
  write_int(state, "world_size", context.world_size());
  write_int(state, "stopping", stopping ? 1 : 0);
  write_int(state, "validation_ran", validation_ran ? 1 : 0);
  write_int(state, "validated_epoch", validated_epoch && !epoch_done ? 1 : 0);
  if (train->saves_position()) {
    torch::serialize::OutputArchive loader;
    train->save(loader);
    state.write("train_loader", loader);
  }
  if (scaler) {
    torch::serialize::OutputArchive nested;
    scaler->save(nested);
    state.write("grad_scaler", nested);
  }
  for (const auto& callback : trainer.callbacks_) {
    torch::serialize::OutputArchive archive;
    callback->on_save_checkpoint(trainer, archive);
    state.write(detail::callback_archive_key(callback->state_key()), archive);
  }
}

void Trainer::Fit::save_checkpoint(Trainer& trainer, const std::filesystem::path& dir) {
  // The group's first rank: rank 0, or after it was lost, the lowest one left.
  if (detail::leads_group()) {
    std::shared_ptr<torch::nn::Module> model = module;
    torch::save(model, (dir / kModelFile).string());
    torch::save(*optimizer, (dir / kOptimizerFile).string());
    torch::serialize::OutputArchive state;
    write_state(trainer, state);
    state.save_to((dir / kTrainerFile).string());
  }
  torch::serialize::OutputArchive mine;
  mine.write("rng.cpu", generator_state(torch::kCPU), /*is_buffer=*/true);
  if (device.is_cuda()) mine.write("rng.cuda", generator_state(device), /*is_buffer=*/true);
  if (!epoch_done) {
    torch::serialize::OutputArchive log;
    train_log.save(log);
    mine.write("log", log);
  }
  mine.save_to((dir / rank_file(context.world_rank())).string());
}

}  // namespace train
