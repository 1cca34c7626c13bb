#include "host.h"

#include <stdexcept>
#include <string>

namespace train::detail {
namespace {
const train_host_v1_t* g_host = nullptr;
}  // namespace

const train_host_v1_t& current_host(const char* caller) {
  if (g_host == nullptr) {
    throw std::logic_error(std::string(caller) +
                           " was called outside a train function started by trainrun");
  }
  return *g_host;
}

HostScope::HostScope(const train_host_v1_t* host) : previous_(g_host) { g_host = host; }
HostScope::~HostScope() { g_host = previous_; }

}  // namespace train::detail
