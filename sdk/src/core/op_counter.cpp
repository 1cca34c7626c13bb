#include <train/op_counter.h>

#include <ATen/record_function.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace train {
namespace {

// RecordFunction takes plain function pointers: the one live counter's state
// is the process's. Depth is per thread: an operator is top-level when none
// is running on its thread.
std::atomic<bool> alive{false};
std::mutex names_mutex;
std::map<std::string, int64_t> names;  // under names_mutex
std::atomic<int64_t> total{0};
// Each counter is a generation: a thread's depth left over from an operator
// that a previous counter saw begin, and not end, starts again from zero.
std::atomic<uint64_t> generation{0};
thread_local uint64_t depth_generation = 0;
thread_local int depth = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (depth_generation != generation.load(std::memory_order_relaxed)) {
    depth_generation = generation.load(std::memory_order_relaxed);
    depth = 0;
  }
  if (depth++ == 0) {
    total.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(names_mutex);
    ++names[fn.name()];
  }
  return nullptr;
}

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*context*/) {
  // An operator that began before the counter did ends without a start.
  if (depth > 0) --depth;
}

}  // namespace

OpCounter::OpCounter() {
  if (alive.exchange(true)) {
    throw std::logic_error("train::OpCounter: another counter is alive in this process");
  }
  reset();
  generation.fetch_add(1);
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  alive = false;
}

int64_t OpCounter::count() const { return total.load(); }

std::map<std::string, int64_t> OpCounter::by_name() const {
  std::lock_guard<std::mutex> lock(names_mutex);
  return names;
}

void OpCounter::reset() {
  std::lock_guard<std::mutex> lock(names_mutex);
  names.clear();
  total = 0;
}

}  // namespace train
