#pragma once

// The host table of the running entry. One per plugin: the SDK is linked
// statically into each plugin with hidden visibility, so every plugin has its
// own copy of this state. Set by run_entry for the duration of the call.

#include <train/abi.h>
#include <train/report.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <functional>
#include <thread>

namespace train::detail {

/// The host table of the entry being run; throws std::logic_error outside one.
const train_host_v1_t& current_host(const char* caller);

/// The host table of the entry being run, or nullptr outside one.
const train_host_v1_t* current_host_or_null();

/// The same, but nullptr on any thread other than the entry's own.
const train_host_v1_t* entry_host_on_this_thread();

/// Which entry runs: a new number for each, so that state of one train
/// function is never taken for the next one's.
uint64_t entry_serial();

/// Runs `cleanup` when the running entry returns (before its HostScope ends):
/// state tied to one train function, such as prepared models, goes with it.
void at_entry_end(std::function<void()> cleanup);

/// train::report's body: `checkpoint_dir` is NULL for a report without one;
/// `upload_mode` is TRAIN_UPLOAD_SYNC or TRAIN_UPLOAD_ASYNC.
void report_with(const Metrics& metrics, const char* checkpoint_dir,
                 uint32_t upload_mode = TRAIN_UPLOAD_SYNC);

/// The process group the running entry's collectives use, and its
/// generation: the host's group at first, the survivors' after an in-place
/// recovery. Null outside an entry of more than one worker.
struct Membership {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  int64_t generation = 0;
};
Membership current_membership();

/// Whether this rank is its group's first: rank 0, unless rank 0 was lost
/// and the others went on in place. It saves what one rank saves.
bool leads_group();

/// The train function took the group itself: tells the host once per entry
/// (its collectives cannot be done again, so a lost rank restarts the group).
void note_group_taken();

/// Whether the run recovers in place: survivors of a lost rank go on.
bool recovers_in_place();

/// Whether the host has announced a group newer than `generation`.
bool group_ended(int64_t generation);

/// Joins the group after `generation` (host->regroup), makes it the current
/// membership and returns it. Throws std::runtime_error when none forms.
Membership regroup_after(int64_t generation);

/// Waits for `work` of the group of `generation`: true once it completed,
/// false when the group ended under it (a rank was lost, or the collective
/// failed with in-place recovery on: the survivors regroup). Throws the
/// collective's error otherwise. Waits in slices, so that a collective with a
/// dead peer ends when the controller says so, not at its timeout.
bool wait_unless_group_ended(c10d::Work& work, int64_t generation);

/// The next synchronised step of the running entry, counted from 1 across
/// its prepared models: the same on every rank, as their backward passes are.
int64_t next_synchronised_step();

/// host->step_vote: whether synchronised step `step` in `generation` is
/// applied on every rank (true) or done again in the next group (false).
bool vote_step(int64_t step, int64_t generation);

/// A replacement (docs/design.md, "A replacement catches up").
/// Whether this rank replaces a lost one and has not joined the group yet.
bool joining();

/// Tells the host whether the train function takes replacements at its step
/// boundaries (the Trainer's loop does, while it runs); a replacement due
/// and not yet taken is forgotten when it stops.
void declare_joinable(bool joinable);

/// Whether a vote said that a replacement joins at the next step boundary.
bool join_due();

/// Joins the group with the replacement: on a survivor at its step boundary
/// (after join_due), on the replacement in its first prepare_model. Makes it
/// the current membership and returns it; throws std::runtime_error when
/// none forms.
Membership join_group();

/// The synchronised steps counted so far (next_synchronised_step's), and
/// their count set on a replacement to its group's.
int64_t synchronised_steps();
void set_synchronised_steps(int64_t steps);

/// Installs `host` for the lifetime of the guard.
class HostScope {
 public:
  explicit HostScope(const train_host_v1_t* host);
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;

 private:
  const train_host_v1_t* previous_;
  std::thread::id previous_thread_;
};

}  // namespace train::detail
