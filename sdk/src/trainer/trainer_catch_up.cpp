// A replacement catches up from a peer (docs/design.md, "A replacement catches
// up"). A rank started in place of a lost one joins the group in its first
// prepare_model, which the others form with it at their next step boundary
// (the top of a training batch, no gradients accumulated): the SDK's state
// and the models' parameters and buffers come from the group's first rank
// (core/catch_up.cpp), then the Trainer's state, in memory over the group: the
// loop's position, the optimizer's and scheduler's state, the callbacks', and a
// seed for the replacement's generators (the synchronised steps came in the
// SDK's).
// Nothing is read from storage.

#include <train/trainer.h>

#include <torch/torch.h>

#include <iostream>
#include <sstream>
#include <stdexcept>

#include "core/catch_up.h"
#include "core/host.h"
#include "ddp/reducer.h"
#include "trainer/trainer_fit.h"

namespace train {

using detail::read_int;
using detail::write_int;

void Trainer::Fit::take_replacement(Trainer& trainer) {
  detail::hand_over_to_replacement(/*position=*/nullptr);
  exchange_state(trainer, /*replacement=*/false);
}

void Trainer::Fit::catch_up(Trainer& trainer) {
  if (!group()) {  // one rank: prepare_model had nothing to join
    throw std::logic_error("train::Trainer: a replacement without a group to join");
  }
  exchange_state(trainer, /*replacement=*/true);
}

void Trainer::Fit::exchange_state(Trainer& trainer, bool replacement) {
  auto membership = detail::current_membership();
  const bool first = membership.group->getRank() == 0;
  std::string bytes;
  if (first) {
    torch::serialize::OutputArchive state;
    write_state(trainer, state);
    // As bytes, loaded apart onto the parameters' device (the rest onto the CPU).
    detail::write_bytes(state, "optimizer", detail::saved_optimizer(*optimizer));
    write_int(state, "seed", static_cast<int64_t>(detail::generator_digest() >> 1));
    write_int(state, "rank", context.world_rank());
    write_int(state, "models", static_cast<int64_t>(detail::prepared_model_count()));
    state.write("setup", c10::IValue(setup_text(trainer)));
    // The latest averages (what callbacks monitor), and the names logged in
    // this epoch (which every rank's averages must name).
    c10::List<std::string> names;
    std::vector<double> values;
    for (const auto& [name, value] : callback_metrics) {
      names.push_back(name);
      values.push_back(value);
    }
    state.write("metric_names", c10::IValue(names));
    state.write("metric_values", torch::tensor(values, torch::kFloat64), /*is_buffer=*/true);
    torch::serialize::OutputArchive log;
    train_log.save(log);
    state.write("log", log);
    std::ostringstream out;
    state.save_to(out);
    bytes = out.str();
  }
  bytes = detail::broadcast_bytes(membership, std::move(bytes));
  if (!replacement) return;
  std::istringstream in(bytes);
  torch::serialize::InputArchive state;
  state.load_from(in, torch::Device(torch::kCPU));
  const int64_t from = read_int(state, "rank");
  c10::IValue setup;
  state.read("setup", setup);
  const auto mine = setup_text(trainer);
  if (!setup.isString() || setup.toStringRef() != mine) {
    throw std::runtime_error("train::Trainer::fit: rank " + std::to_string(context.world_rank()) +
                             "'s options or callbacks differ from rank " + std::to_string(from) +
                             "'s (rank " + std::to_string(from) + ": " +
                             (setup.isString() ? setup.toStringRef() : "?") + "; rank " +
                             std::to_string(context.world_rank()) + ": " + mine +
                             "); every rank must fit with the same");
  }
  const int64_t models = read_int(state, "models");
  if (models != static_cast<int64_t>(detail::prepared_model_count())) {
    throw std::runtime_error(
        "train::Trainer: rank " + std::to_string(context.world_rank()) +
        " replaces a lost rank, and had prepared " +
        std::to_string(detail::prepared_model_count()) + " models when it joined, rank " +
        std::to_string(from) + " " + std::to_string(models) +
        ": a replacement joins at its first prepare_model, so only train::Trainer's model may be "
        "prepared before fit");
  }
  read_position(state);
  // The loader's position, which write_state put in: the epoch's segments
  // under other world sizes come with it.
  torch::serialize::InputArchive loader;
  if (train->saves_position() && state.try_read("train_loader", loader)) train->load(loader);
  c10::IValue names;
  state.read("metric_names", names);
  torch::Tensor values;
  state.read("metric_values", values, /*is_buffer=*/true);
  const auto list = names.toList();
  for (size_t i = 0; i < list.size() && static_cast<int64_t>(i) < values.numel(); ++i) {
    callback_metrics[list.get(i).toStringRef()] = values[static_cast<int64_t>(i)].item<double>();
  }
  // The epoch's names, with nothing of theirs: its averages count its batches.
  torch::serialize::InputArchive log;
  state.read("log", log);
  train_log.load(log);
  train_log.zero_sums();
  read_rest(trainer, state, "the state of rank " + std::to_string(from), [&] {
    detail::load_optimizer(*optimizer, detail::read_bytes(state, "optimizer"), device);
  });
  // Its own generators, not a copy of the first rank's (dropout masks would
  // repeat its), derived from them and this rank.
  torch::manual_seed(detail::replacement_seed(static_cast<uint64_t>(read_int(state, "seed")),
                                              context.world_rank()));
  std::cout << "train::Trainer: rank " << context.world_rank() << " caught up from rank " << from
            << " at epoch " << epoch << ", batch " << batch << " (step " << global_step << ")"
            << std::endl;
}

}  // namespace train
