#pragma once

// A replacement catches up from a peer (docs/design.md, "A replacement
// catches up"): what the SDK sends it besides the models' parameters, and
// where a survivor takes it. Used by prepare_model (the replacement joins
// there), train::Trainer and loops over a loader's epochs().

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>

#include "core/host.h"

namespace train::detail {

/// Where a loop over a loader's epochs() is: its epoch, and the index of the
/// next batch in it.
struct LoopPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
};

/// On a survivor at a step boundary, with join_due(): forms the group with the
/// replacement, sends it the SDK's state (the synchronised steps, a seed, and
/// with `position` the loop's position and every known optimizer's state),
/// then every prepared model's parameters and buffers. Returns the new group.
/// Throws std::runtime_error when a rank is lost meanwhile.
Membership hand_over_to_replacement(const LoopPosition* position);

/// On the replacement, in its first prepare_model: joins the group and takes
/// what hand_over_to_replacement sent; the models' parameters come next.
Membership join_as_replacement();

/// `optimizer`'s saved archive, as bytes, and the same into an archive under
/// `key` (a uint8 buffer).
std::string saved_optimizer(const torch::optim::Optimizer& optimizer);
void write_bytes(torch::serialize::OutputArchive& archive, const std::string& key,
                 const std::string& bytes);
std::string read_bytes(torch::serialize::InputArchive& archive, const std::string& key);

/// Loads saved_optimizer's bytes into `optimizer`, its state's tensors onto
/// `device` (its parameters'), as torch::load(optimizer, file, device) does.
void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes,
                    torch::Device device);

/// Whether this rank replaces a lost one and has not caught up yet: it has not
/// joined, or joined and its loop over epochs() has not begun its first
/// epoch's batches. Its peers are in their loop meanwhile: it makes no collective of its
/// setup, nor of the top of the epoch it starts in.
bool catching_up();

/// Whether the prepared models hold gradients that no optimizer used yet: no
/// known optimizer's step nor a change of the parameters since a replacement
/// became due, or gradients accumulated under NoSync. A replacement cannot join there: the
/// gradients it missed would be lost to it.
bool gradients_pending();

/// A vote said that a replacement joins at the next step boundary: in a loop
/// over epochs(), what gradients_pending compares with is taken.
void note_join_due();

/// `bytes` of the group's first rank on every rank of `membership`. Throws
/// std::runtime_error when a rank is lost meanwhile (the controller restarts
/// the group).
std::string broadcast_bytes(const Membership& membership, std::string bytes);

/// A seed for a replacement's generators, from the group's first rank's CPU
/// generator: its own, not a copy of the first rank's (whose dropout masks
/// it would repeat).
uint64_t generator_digest();
uint64_t replacement_seed(uint64_t digest, int rank);

/// A number in an archive (a 0-d long tensor).
void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value);
int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key);

}  // namespace train::detail
