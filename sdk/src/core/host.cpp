#include "core/host.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/catch_up.h"

namespace train::detail {
namespace {
const train_host_v1_t* g_host = nullptr;
std::thread::id g_entry_thread;
uint64_t g_entry_serial = 0;
std::vector<std::function<void()>> g_cleanups;
Membership g_membership;  // the entry's group once it changed; else the host's
int64_t g_synchronised_steps = 0;
bool g_join_due = false;  // a vote said a replacement joins at the next boundary

// The slice a collective is waited for before the host's generation is
// looked at again: a lost rank is noticed within it.
constexpr auto kWaitSlice = std::chrono::milliseconds(10);

bool has_recovery(const train_host_v1_t* host) {
  return host != nullptr && TRAIN_HOST_HAS(host, group_taken) && host->in_place != 0 &&
         host->group_generation != nullptr && host->regroup != nullptr &&
         host->step_vote != nullptr;
}
bool has_joining(const train_host_v1_t* host) {
  return has_recovery(host) && TRAIN_HOST_HAS(host, joinable) && host->joinable != nullptr;
}
}  // namespace

Membership current_membership() {
  if (g_membership.group) return g_membership;
  const auto* host = g_host;
  if (host == nullptr || host->world_size <= 1 || host->process_group == nullptr) return {};
  auto* group = static_cast<c10d::ProcessGroup*>(host->process_group);
  return {c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(group), 0};
}

bool recovers_in_place() { return has_recovery(g_host); }

void note_group_taken() {
  static uint64_t told = 0;  // the entry told, by serial
  if (!has_recovery(g_host) || g_host->group_taken == nullptr || told == g_entry_serial) return;
  told = g_entry_serial;
  g_host->group_taken(g_host->handle);
}

bool leads_group() {
  if (g_membership.group) return g_membership.group->getRank() == 0;
  return g_host == nullptr || g_host->world_rank == 0;
}

bool group_ended(int64_t generation) {
  return has_recovery(g_host) && g_host->group_generation(g_host->handle) > generation;
}

Membership regroup_after(int64_t generation) {
  const auto& host = current_host("train::detail::regroup_after");
  if (!has_recovery(&host)) throw std::logic_error("regroup_after without in-place recovery");
  // Another collective of this rank joined a newer group already.
  if (g_membership.group && g_membership.generation > generation) return g_membership;
  int64_t formed = 0;
  int32_t rank = 0, size = 0;
  char error[1024] = "";
  void* group = host.regroup(host.handle, generation, &formed, &rank, &size, error, sizeof(error));
  if (group == nullptr) {
    throw std::runtime_error(std::string("cannot form the group of the ranks left: ") + error);
  }
  g_membership = {c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(
                      static_cast<c10d::ProcessGroup*>(group)),
                  formed};
  return g_membership;
}

bool wait_unless_group_ended(c10d::Work& work, int64_t generation) {
  if (!has_recovery(g_host)) {
    work.wait();
    return true;
  }
  // Polled, not waited for with a timeout: a timed-out wait throws, and
  // LibTorch 1.13's exceptions record a backtrace. 50 us between looks for the
  // first slice, then 200 us.
  const auto began = std::chrono::steady_clock::now();
  while (!work.isCompleted()) {
    if (group_ended(generation)) return false;
    const bool early = std::chrono::steady_clock::now() - began < kWaitSlice;
    std::this_thread::sleep_for(early ? std::chrono::microseconds(50)
                                      : std::chrono::microseconds(200));
  }
  // With in-place recovery a failed collective is the group's end: a peer's
  // connection closed. The controller confirms it with a new generation, or
  // the regroup's wait runs out and raises.
  try {
    work.wait();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int64_t next_synchronised_step() { return ++g_synchronised_steps; }

bool vote_step(int64_t step, int64_t generation) {
  const auto& host = current_host("train::detail::vote_step");
  char error[1024] = "";
  const int vote = host.step_vote(host.handle, step, generation, error, sizeof(error));
  if (vote < 0) throw std::runtime_error(std::string("the step's vote failed: ") + error);
  if (vote == 2 && !g_join_due) {
    g_join_due = true;
    note_join_due();
  }
  return vote >= 1;
}

bool joining() { return has_joining(g_host) && g_host->joining != 0 && !g_membership.group; }

void declare_joinable(bool joinable) {
  static uint64_t told = 0;  // the entry that told, by serial
  static bool told_joinable = false;
  if (!has_joining(g_host)) return;
  if (!joinable) g_join_due = false;
  if (told == g_entry_serial && told_joinable == joinable) return;
  told = g_entry_serial;
  told_joinable = joinable;
  g_host->joinable(g_host->handle, joinable ? 1 : 0);
}

bool join_due() { return g_join_due; }

Membership join_group() {
  const bool replacement = joining();
  if (!replacement && !g_join_due) throw std::logic_error("join_group with no replacement due");
  if (replacement) {
    declare_joinable(true);  // it waits to join
    return regroup_after(0);
  }
  g_join_due = false;
  g_host->joinable(g_host->handle, 2);  // at the boundary: the next regroup takes it
  return regroup_after(current_membership().generation);
}

int64_t synchronised_steps() { return g_synchronised_steps; }
void set_synchronised_steps(int64_t steps) { g_synchronised_steps = steps; }

void at_entry_end(std::function<void()> cleanup) { g_cleanups.push_back(std::move(cleanup)); }

const train_host_v1_t& current_host(const char* caller) {
  if (g_host == nullptr) {
    throw std::logic_error(std::string(caller) +
                           " was called outside a train function started by trainrun");
  }
  return *g_host;
}

const train_host_v1_t* current_host_or_null() { return g_host; }

const train_host_v1_t* entry_host_on_this_thread() {
  return std::this_thread::get_id() == g_entry_thread ? g_host : nullptr;
}

uint64_t entry_serial() { return g_entry_serial; }

HostScope::HostScope(const train_host_v1_t* host)
    : previous_(g_host), previous_thread_(g_entry_thread) {
  g_host = host;
  g_entry_thread = std::this_thread::get_id();
  ++g_entry_serial;
}
HostScope::~HostScope() {
  for (auto& cleanup : std::exchange(g_cleanups, {})) cleanup();
  // Groups formed in place are the worker's (it keeps a reference to each);
  // this entry's view of them ends.
  g_membership = {};
  g_synchronised_steps = 0;
  g_join_due = false;
  g_host = previous_;
  g_entry_thread = previous_thread_;
}

}  // namespace train::detail
