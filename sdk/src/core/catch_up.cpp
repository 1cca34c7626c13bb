// What a replacement gets from its peers besides the models (docs/design.md,
// "A replacement catches up"), and the step boundary of a loop over a
// loader's epochs(). The group's first rank sends one archive over the new
// group right after it forms, before the models' parameters: the synchronised
// steps counted, a seed, and from such a loop its position and the state of
// every optimizer known to the SDK. The replacement takes it in its first
// prepare_model and applies the loop's part when its own loop begins, after
// the train function built its optimizers (and perhaps loaded a checkpoint
// into them, which the peer's state then overrides).

#include "core/catch_up.h"

#include <train/amp.h>
#include <train/context.h>
#include <train/data.h>
#include <train/optim.h>

#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/collectives.h"
#include "ddp/reducer.h"

namespace train {
namespace detail {
namespace {

// Optimizers known to the SDK, in the order they became known. Built and
// destroyed on any thread (tests build them outside a train function), and
// perhaps at exit: never destroyed themselves.
std::mutex& known_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::vector<torch::optim::Optimizer*>& known() {
  static auto* optimizers = new std::vector<torch::optim::Optimizer*>;
  return *optimizers;
}

std::atomic<int64_t> g_optimizer_steps{0};
std::atomic<int64_t> g_live_scalers{0};

// Taken when a vote said that a replacement joins, in a loop over epochs()
// (the vote of a backward, or of any other collective the SDK votes on): the
// optimizer steps counted and copies of the prepared parameters. A batch
// boundary where neither changed since still holds gradients no optimizer
// used.
struct Synchronised {
  uint64_t serial = 0;
  int64_t optimizer_steps = 0;
  std::vector<torch::Tensor> parameters;
};
std::optional<Synchronised> g_synchronised;

// What a replacement took from its peer, until its loop begins.
struct Received {
  uint64_t serial = 0;
  int64_t from = 0;  // the sender's world rank
  uint64_t seed = 0;
  std::optional<LoopPosition> position;   // sent from a loop over epochs()
  std::vector<std::string> optimizers;    // each one's saved archive
  std::vector<int64_t> optimizer_states;  // and how many parameters' state it held
};
std::optional<Received> g_received;

// The loop over epochs() of the entry `serial` that takes a replacement
// while it runs (the entry's first), and the loops begun in that entry.
uint64_t g_loop_serial = 0;
uint64_t g_loops_serial = 0;
int64_t g_loops_begun = 0;
// A replacement's loop began, and its loader has not begun the epoch's
// batches: its peers are past the top of that epoch's body.
uint64_t g_top_of_epoch_serial = 0;

std::vector<torch::optim::Optimizer*> known_optimizers() {
  std::lock_guard<std::mutex> lock(known_mutex());
  return known();
}

std::string rank_name() { return "rank " + std::to_string(get_context().world_rank()); }

constexpr const char* kScalerReason =
    "a train::GradScaler lives (enabled or not), whose scale is not sent to a replacement";

// One voted collective of the new group, on the members once they handed
// over and on the replacement once its loop took the state: the controller
// makes the replacement a member at the first vote of the group, before
// either side's next report or the loop's end (a join at an epoch's last
// batch leaves the replacement no batch before its report).
void agree_on_the_join() {
  auto nothing = torch::zeros({1});
  allreduce_surviving(nothing);
}

}  // namespace

void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value) {
  archive.write(key, torch::tensor(value, torch::kLong), /*is_buffer=*/true);
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t, /*is_buffer=*/true);
  return t.item<int64_t>();
}

std::string broadcast_bytes(const Membership& membership, std::string bytes) {
  auto broadcast = [&](torch::Tensor tensor) {
    std::vector<torch::Tensor> tensors{std::move(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    auto work = membership.group->broadcast(tensors, options);
    if (!wait_unless_group_ended(*work, membership.generation)) {
      throw std::runtime_error("a rank was lost while a replacement caught up");
    }
  };
  auto size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kLong);
  broadcast(size);
  const int64_t length = size.item<int64_t>();
  // A peer's number: bounded before it sizes a buffer.
  constexpr int64_t kMostBytes = int64_t{1} << 40;
  if (length < 0 || length > kMostBytes) {
    throw std::runtime_error("a replacement's state of " + std::to_string(length) +
                             " bytes: not a size the group's first rank sends");
  }
  bytes.resize(static_cast<size_t>(length));
  broadcast(torch::from_blob(bytes.data(), {length}, torch::kUInt8));
  return bytes;
}

uint64_t generator_digest() {
  auto generator = at::globalContext().defaultGenerator(torch::kCPU);
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  const auto* bytes = state.data_ptr<uint8_t>();
  for (int64_t i = 0; i < state.numel(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  return hash;
}

uint64_t replacement_seed(uint64_t digest, int rank) {
  return (digest ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(rank + 1))) >> 1;
}

Membership hand_over_to_replacement(const LoopPosition* position) {
  auto membership = join_group();
  std::string bytes;
  if (membership.group->getRank() == 0) {
    torch::serialize::OutputArchive state;
    write_int(state, "rank", get_context().world_rank());
    write_int(state, "synchronised_steps", synchronised_steps());
    write_int(state, "seed", static_cast<int64_t>(generator_digest() >> 1));
    write_int(state, "loop", position != nullptr ? 1 : 0);
    if (position != nullptr) {
      write_int(state, "epoch", position->epoch);
      write_int(state, "batch", position->batch);
      const auto optimizers = known_optimizers();
      write_int(state, "optimizers", static_cast<int64_t>(optimizers.size()));
      for (size_t i = 0; i < optimizers.size(); ++i) {
        write_int(state, "optimizer_states_" + std::to_string(i),
                  static_cast<int64_t>(optimizers[i]->state().size()));
        write_bytes(state, "optimizer_" + std::to_string(i), saved_optimizer(*optimizers[i]));
      }
    }
    std::ostringstream out;
    state.save_to(out);
    bytes = out.str();
  }
  broadcast_bytes(membership, std::move(bytes));
  replicate_to_replacement(*membership.group);
  return membership;
}

Membership join_as_replacement() {
  auto membership = join_group();
  const auto bytes = broadcast_bytes(membership, {});
  std::istringstream in(bytes);
  torch::serialize::InputArchive state;
  state.load_from(in, torch::Device(torch::kCPU));
  Received received;
  received.serial = entry_serial();
  received.from = read_int(state, "rank");
  received.seed = static_cast<uint64_t>(read_int(state, "seed"));
  set_synchronised_steps(read_int(state, "synchronised_steps"));
  if (read_int(state, "loop") != 0) {
    received.position = LoopPosition{read_int(state, "epoch"), read_int(state, "batch")};
    const int64_t count = read_int(state, "optimizers");
    for (int64_t i = 0; i < count; ++i) {
      received.optimizers.push_back(read_bytes(state, "optimizer_" + std::to_string(i)));
      received.optimizer_states.push_back(read_int(state, "optimizer_states_" + std::to_string(i)));
    }
  }
  g_received = std::move(received);
  return membership;
}

bool catching_up() {
  return joining() ||
         (g_received && g_received->serial == entry_serial() && g_received->position) ||
         g_top_of_epoch_serial == entry_serial();
}

void note_join_due() {
  if (g_loop_serial != entry_serial()) return;
  if (g_synchronised && g_synchronised->serial == entry_serial()) return;
  Synchronised synchronised{entry_serial(), g_optimizer_steps.load(), {}};
  for (const auto& parameter : prepared_parameters()) {
    synchronised.parameters.push_back(parameter.detach().clone());
  }
  g_synchronised = std::move(synchronised);
}

bool gradients_pending() {
  if (gradients_accumulated()) return true;
  if (!g_synchronised || g_synchronised->serial != entry_serial()) return false;
  if (g_synchronised->optimizer_steps != g_optimizer_steps.load()) return false;
  // LibTorch's own optimizers update `p.data()`, whose version counter is
  // not the parameter's: the values tell.
  const auto parameters = prepared_parameters();
  if (parameters.size() != g_synchronised->parameters.size()) return false;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!torch::equal(parameters[i].detach(), g_synchronised->parameters[i])) return false;
  }
  return true;
}

void note_optimizer_step() { ++g_optimizer_steps; }

LoopStart begin_epochs_loop(bool resumable) {
  if (!recovers_in_place()) return {};
  if (joining()) {
    throw std::runtime_error(
        "train: " + rank_name() +
        " replaces a lost rank and began its loop over loader.epochs() before prepare_model: a "
        "replacement joins its group in its first prepare_model, before its loop");
  }
  if (g_loops_serial != entry_serial()) {
    g_loops_serial = entry_serial();
    g_loops_begun = 0;
  }
  // The entry's first loop only: a replacement's position names no other, and
  // a loop inside it must not end its joinability.
  if (++g_loops_begun > 1) return {};
  g_loop_serial = entry_serial();
  const auto optimizers = known_optimizers();
  std::string why_not;
  if (get_context().world_size() > 1 && prepared_model_count() == 0) {
    why_not = "no model was prepared with train::prepare_model";
  } else if (optimizers.empty()) {
    why_not = "no optimizer is known to the SDK (a train::optim one, or train::register_optimizer)";
  } else if (!resumable) {
    why_not = "its loader's sampler cannot start an epoch part-way (it has no resume)";
  } else if (g_live_scalers.load() > 0) {
    why_not = kScalerReason;
  }
  if (!why_not.empty()) {
    if (leads_group()) {
      std::cout << "train: this loop over loader.epochs() takes no replacement for a lost rank: "
                << why_not << std::endl;
    }
    declare_joinable(false);
  } else {
    declare_joinable(true);
  }
  LoopStart start{true, c10::nullopt};
  if (!g_received || g_received->serial != entry_serial() || !g_received->position) return start;
  auto received = std::move(*g_received);
  g_received.reset();
  const auto& position = *received.position;
  if (position.epoch < 0 || position.batch < 0) {
    throw std::runtime_error(
        "train: rank " + std::to_string(received.from) + " sent an impossible position (epoch " +
        std::to_string(position.epoch) + ", batch " + std::to_string(position.batch) + ")");
  }
  if (received.optimizers.size() != optimizers.size()) {
    throw std::runtime_error(
        "train: " + rank_name() + " replaces a lost rank, and knows " +
        std::to_string(optimizers.size()) + " optimizers at its loop over loader.epochs(), rank " +
        std::to_string(received.from) + " " + std::to_string(received.optimizers.size()) +
        ": every rank must build the same optimizers before its loop");
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    load_optimizer(*optimizers[i], received.optimizers[i], get_context().device());
    const auto states = static_cast<int64_t>(optimizers[i]->state().size());
    if (states != received.optimizer_states[i]) {
      throw std::runtime_error("train: " + rank_name() +
                               " replaces a lost rank, and its optimizer " + std::to_string(i) +
                               " holds the state of " + std::to_string(states) +
                               " parameters after loading rank " + std::to_string(received.from) +
                               "'s, which held " + std::to_string(received.optimizer_states[i]) +
                               ": an optimizer of your own must save() and load() its state");
    }
  }
  torch::manual_seed(replacement_seed(received.seed, get_context().world_rank()));
  agree_on_the_join();
  g_top_of_epoch_serial = entry_serial();
  std::cout << "train: " << rank_name() << " caught up from rank " << received.from << " at epoch "
            << position.epoch << ", batch " << position.batch << std::endl;
  start.at =
      std::make_pair(static_cast<size_t>(position.epoch), static_cast<size_t>(position.batch));
  return start;
}

void epochs_loop_pass_begins() { g_top_of_epoch_serial = 0; }

void epochs_loop_boundary(size_t epoch, size_t next) {
  if (!join_due() || g_loop_serial != entry_serial() || gradients_pending()) return;
  if (g_live_scalers.load() > 0) {  // built since the loop began
    if (leads_group()) {
      std::cout << "train: this loop over loader.epochs() takes no replacement for a lost rank: "
                << kScalerReason << std::endl;
    }
    declare_joinable(false);
    return;
  }
  const LoopPosition position{static_cast<int64_t>(epoch), static_cast<int64_t>(next)};
  g_synchronised.reset();
  hand_over_to_replacement(&position);
  agree_on_the_join();
}

void end_epochs_loop() {
  if (g_loop_serial != entry_serial()) return;
  g_loop_serial = 0;
  g_top_of_epoch_serial = 0;
  g_synchronised.reset();
  declare_joinable(false);  // no step boundary follows
}

std::string saved_optimizer(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void write_bytes(torch::serialize::OutputArchive& archive, const std::string& key,
                 const std::string& bytes) {
  auto view = torch::from_blob(const_cast<char*>(bytes.data()),
                               {static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  archive.write(key, view.clone(), /*is_buffer=*/true);
}

std::string read_bytes(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor bytes;
  archive.read(key, bytes, /*is_buffer=*/true);
  bytes = bytes.to(torch::kCPU).contiguous();
  return {static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())};
}

void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes,
                    torch::Device device) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in, device);
  optimizer.load(archive);
}

}  // namespace detail

KnownOptimizer::KnownOptimizer(torch::optim::Optimizer& optimizer) : optimizer_(&optimizer) {
  std::lock_guard<std::mutex> lock(detail::known_mutex());
  detail::known().push_back(optimizer_);
}

KnownOptimizer::KnownOptimizer(torch::optim::Optimizer& optimizer, KnownOptimizer& moved)
    : optimizer_(&optimizer) {
  std::lock_guard<std::mutex> lock(detail::known_mutex());
  auto& known = detail::known();
  auto at = std::find(known.begin(), known.end(), moved.optimizer_);
  if (at != known.end()) {
    *at = optimizer_;  // in its place in the order
  } else {
    known.push_back(optimizer_);
  }
  moved.optimizer_ = nullptr;
}

KnownOptimizer::~KnownOptimizer() {
  if (optimizer_ == nullptr) return;  // moved away
  std::lock_guard<std::mutex> lock(detail::known_mutex());
  auto& known = detail::known();
  // One of its entries: it may be known twice (a train::optim one registered too).
  auto at = std::find(known.begin(), known.end(), optimizer_);
  if (at != known.end()) known.erase(at);
}

namespace detail {
LiveScaler::LiveScaler() { ++g_live_scalers; }
LiveScaler::LiveScaler(const LiveScaler&) { ++g_live_scalers; }
LiveScaler::~LiveScaler() { --g_live_scalers; }
}  // namespace detail

}  // namespace train
