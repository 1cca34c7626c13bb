#include "core/host.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace train::detail {
namespace {
const train_host_v1_t* g_host = nullptr;
std::thread::id g_entry_thread;
uint64_t g_entry_serial = 0;
std::vector<std::function<void()>> g_cleanups;
}  // namespace

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
  g_host = previous_;
  g_entry_thread = previous_thread_;
}

}  // namespace train::detail
