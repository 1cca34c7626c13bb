#include "host.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace train::detail {
namespace {
const train_host_v1_t* g_host = nullptr;
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

HostScope::HostScope(const train_host_v1_t* host) : previous_(g_host) { g_host = host; }
HostScope::~HostScope() {
  for (auto& cleanup : std::exchange(g_cleanups, {})) cleanup();
  g_host = previous_;
}

}  // namespace train::detail
