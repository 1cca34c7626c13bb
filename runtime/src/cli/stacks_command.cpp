#include "cli/stacks_command.h"

#include <trainrun/error.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include "storage/run_directory.h"

namespace trainrun {
namespace {

// The highest n of the run's logs/stacks-<n>.txt; 0 for none.
int64_t last_stacks(const std::filesystem::path& logs) {
  static const std::regex kName(R"(stacks-([0-9]{1,9})\.txt)");
  int64_t last = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(logs, ec)) {
    std::smatch match;
    const auto name = entry.path().filename().string();
    if (std::regex_match(name, match, kName))
      last = std::max<int64_t>(last, std::stoll(match[1].str()));
  }
  return last;
}

// Whether process `pid` catches `signal` (/proc's SigCgt mask): a host program
// that embeds the controller without its signal handling would die of it.
bool catches(pid_t pid, int signal) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    auto mask = std::stoull(line.substr(7), nullptr, 16);
    return (mask >> (signal - 1)) & 1;
  }
  return false;
}

}  // namespace

int print_stacks(const std::filesystem::path& run_dir, std::chrono::milliseconds wait) {
  if (!std::filesystem::exists(run_dir / run_directory::kLockFile)) {
    throw UsageError(run_dir.string() + " holds no trainrun run");
  }
  if (!run_directory::is_held(run_dir)) {
    throw UsageError("no run is live in " + run_dir.string());
  }
  // The holder's name, as RunLock writes it: "pid 42 on host node1".
  std::ifstream lock(run_dir / run_directory::kLockFile);
  std::string holder;
  std::getline(lock, holder);
  std::smatch match;
  static const std::regex kHolder(R"(pid ([0-9]{1,9}) on host (.*))");
  if (!std::regex_match(holder, match, kHolder)) {
    throw UsageError("cannot tell which process runs " + run_dir.string() + " (its .lock says '" +
                     holder + "')");
  }
  const auto pid = static_cast<pid_t>(std::stol(match[1].str()));
  const std::string host = match[2].str();
  char here[256] = {};
  ::gethostname(here, sizeof(here) - 1);
  if (host != here) {
    throw UsageError("the run's controller is pid " + std::to_string(pid) + " on host " + host +
                     ": run this there, or send that process SIGUSR1");
  }
  if (!catches(pid, SIGUSR1)) {
    throw UsageError("the run's controller (pid " + std::to_string(pid) +
                     ") does not take SIGUSR1: a program that runs trainrun without its signal "
                     "handling (TrainerOptions::handle_signals) cannot be asked");
  }
  const auto logs = run_dir / run_directory::kLogsDir;
  const int64_t before = last_stacks(logs);
  if (::kill(pid, SIGUSR1) != 0) {
    throw UsageError("cannot signal the run's controller (pid " + std::to_string(pid) +
                     "): " + std::strerror(errno));
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (const int64_t last = last_stacks(logs); last > before) {
      const auto file = logs / ("stacks-" + std::to_string(last) + ".txt");
      std::ifstream in(file);
      std::cout << in.rdbuf() << "(written to " << file.string() << ")\n";
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cerr << "trainrun: the run's controller (pid " << pid << ") wrote no stacks within "
            << wait.count() / 1000 << " s\n";
  return 1;
}

}  // namespace trainrun
