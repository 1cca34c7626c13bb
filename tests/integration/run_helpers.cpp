#include "run_helpers.h"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>

Sandbox::Sandbox() {
  char pattern[] = "/tmp/trainrun-it-XXXXXX";
  root_ = ::mkdtemp(pattern);
}

Sandbox::~Sandbox() { std::filesystem::remove_all(root_); }

std::string Sandbox::command(const std::string& args) const {
  return "export TRAINRUN_CACHE_DIR='" + (root_ / "cache").string() +
         "'; exec '" TRAINRUN_EXE "' --storage-path '" + results().string() + "' " + args;
}

namespace {

// Runs a shell command line to its end, stdout and stderr together.
RunOutput run_shell(const std::string& line) {
  RunOutput out;
  auto start = std::chrono::steady_clock::now();
  std::FILE* pipe = ::popen((line + " 2>&1").c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.output.append(buffer, n);
  int status = ::pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

RunOutput Sandbox::run(const std::string& args) const { return run_shell(command(args)); }

RunOutput Sandbox::run_wrapped(const std::string& wrapper, const std::string& args) const {
  return run_shell("export TRAINRUN_CACHE_DIR='" + (root_ / "cache").string() + "'; exec " +
                   wrapper + " '" TRAINRUN_EXE "' --storage-path '" + results().string() + "' " +
                   args);
}

RunOutput Sandbox::run_in_root(const std::string& args) const {
  return run_shell("cd '" + root_.string() + "' && export TRAINRUN_CACHE_DIR='" +
                   (root_ / "cache").string() + "' && exec '" TRAINRUN_EXE "' " + args);
}

RunOutput Sandbox::run_on_terminal(const std::string& args, int columns) const {
  auto script = root_ / "on_terminal.sh";
  std::ofstream(script) << "stty cols " << columns << " rows 40\n" << command(args) << "\n";
  // -e: script(1) exits with the command's status.
  return run_shell("TERM=xterm script -qec \"sh '" + script.string() + "'\" /dev/null < /dev/null");
}

pid_t Sandbox::start(const std::string& args) const {
  auto line = command(args) + " > '" + (root_ / "out.txt").string() + "' 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

pid_t Sandbox::start_worker(const std::string& args, const std::string& log) const {
  auto line = "exec '" TRAINRUN_EXE "' worker --cache-dir '" + (root_ / "remote-cache").string() +
              "' " + args + " > '" + (root_ / log).string() + "' 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int Sandbox::wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Sandbox::output_so_far() const { return read_text(root_ / "out.txt"); }

std::vector<pid_t> Sandbox::worker_pids() const {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    auto cmdline = read_text(entry.path() / "cmdline");
    if (cmdline.find(root_.string()) == std::string::npos ||
        cmdline.find("trainrun-worker") == std::string::npos) {
      continue;
    }
    auto status = read_text(entry.path() / "stat");  // a zombie is not alive
    auto close = status.rfind(')');
    if (close != std::string::npos && status.size() > close + 2 && status[close + 2] == 'Z') {
      continue;
    }
    pids.push_back(std::stoi(entry.path().filename().string()));
  }
  return pids;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_text(path));
}

int reset_connections(pid_t pid, int port) {
  if (::geteuid() != 0) return -1;
  // "ESTAB 0 0 127.0.0.1:40000 127.0.0.1:PORT users:(("trainrun-worker",pid=42,fd=9))"
  auto local_ports = [&] {
    auto listed = run_shell("ss -tnpH state established 'dport = :" + std::to_string(port) + "'");
    std::istringstream lines(listed.output);
    std::vector<std::string> ports;
    for (std::string line; std::getline(lines, line);) {
      if (line.find("pid=" + std::to_string(pid) + ",") == std::string::npos) continue;
      std::istringstream fields(line);
      std::string local;
      fields >> local >> local >> local;  // Recv-Q, Send-Q, then the local address
      auto colon = local.rfind(':');
      if (colon != std::string::npos) ports.push_back(local.substr(colon + 1));
    }
    return ports;
  };
  auto before = local_ports();
  // Both ports: Linux gives one ephemeral port to connections to different
  // destinations, and "sport" alone also killed another test's Gloo pairs.
  for (const auto& local : before) {
    run_shell("ss -K -tn 'sport = :" + local + " and dport = :" + std::to_string(port) + "'");
  }
  // Counted by what is gone: a kernel without INET_DIAG_DESTROY kills nothing.
  auto after = local_ports();
  int reset = 0;
  for (const auto& local : before)
    reset += std::find(after.begin(), after.end(), local) == after.end();
  return before.empty() || reset > 0 ? reset : -1;
}

std::vector<std::string> staging_leftovers(const std::filesystem::path& run_dir) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir)) {
    if (entry.path().filename().string().rfind(".staging", 0) == 0) {
      found.push_back(entry.path().filename());
    }
  }
  return found;
}

std::vector<double> read_numbers(const std::filesystem::path& path) {
  std::istringstream in(read_text(path));
  std::vector<double> values;
  double v;
  while (in >> v) values.push_back(v);
  return values;
}

double largest_difference(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto x = read_numbers(a);
  const auto y = read_numbers(b);
  if (x.size() != y.size() || x.empty()) return std::numeric_limits<double>::infinity();
  double gap = 0;
  for (size_t i = 0; i < x.size(); ++i) gap = std::max(gap, std::abs(x[i] - y[i]));
  return gap;
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

std::vector<nlohmann::json> read_reports(const std::filesystem::path& results) {
  std::vector<nlohmann::json> reports;
  for (auto& line : read_jsonl(results)) {
    if (line.contains("metrics")) {
      reports.push_back(std::move(line));
      continue;
    }
    for (auto report = reports.rbegin(); report != reports.rend(); ++report) {
      if ((*report)["iteration"] == line["iteration"]) {
        (*report)["checkpoint"] = line["checkpoint"];
        break;
      }
    }
  }
  return reports;
}

std::map<int64_t, double> by_step(const std::vector<nlohmann::json>& reports,
                                  const std::string& metric) {
  std::map<int64_t, double> values;
  for (const auto& line : reports) {
    const auto& m = line["metrics"];
    if (m.contains(metric)) values[m["step"].get<int64_t>()] = m[metric].get<double>();
  }
  return values;
}

std::string pack_id_samples(const Sandbox& box, int samples) {
  const auto source = box.root() / "samples";
  for (int i = 0; i < samples; ++i) {
    const auto dir = source / ("c" + std::to_string(i / 60));
    std::filesystem::create_directories(dir);
    char name[16];
    std::snprintf(name, sizeof(name), "%04d.id", i);
    std::ofstream(dir / name) << i;
  }
  std::filesystem::create_directories(box.root() / "shards");
  auto packed = box.run_in_root("pack samples shards/train-%04d.tar --shard-samples 50");
  INFO(packed.output);
  REQUIRE(packed.exit_code == 0);
  char last[16];
  std::snprintf(last, sizeof(last), "%04d", (samples + 49) / 50 - 1);
  return (box.root() / "shards" / ("train-{0000.." + std::string(last) + "}.tar")).string();
}

std::string trained_line(const std::string& output) {
  std::smatch match;
  std::regex_search(output, match, std::regex("trained min=[0-9.]+ max=[0-9.]+ sum=[0-9.]+"));
  return match.str();
}

std::string each_trained(int epochs, int samples) {
  return "trained min=" + std::to_string(epochs) + " max=" + std::to_string(epochs) +
         " sum=" + std::to_string(epochs * samples);
}

pid_t add_agent(const Sandbox& box, const AgentRun& run, int nproc, const std::string& log) {
  return box.start_worker("--connect " + run.endpoint + " --auth-key '" + run.key + "' --nproc " +
                              std::to_string(nproc),
                          log);
}

AgentRun start_agents(const Sandbox& box, const std::string& args, int workers, int agents,
                      int nproc, const std::string& num_workers) {
  if (nproc == 0) nproc = workers / agents;
  auto key = (box.root() / "run.key").string();
  REQUIRE(box.run("keygen '" + key + "'").exit_code == 0);
  AgentRun run;
  const bool timeout_given = args.find("--startup-timeout") != std::string::npos;
  run.controller = box.start(
      args + " -n " + (num_workers.empty() ? std::to_string(workers) : num_workers) +
      " --listen tcp://127.0.0.1:0" + (timeout_given ? "" : " --startup-timeout 60") +
      " --auth-key '" + key + "'");
  std::regex listening("remote workers connect to (tcp://[0-9.]+:[0-9]+)");
  std::string endpoint;
  for (int i = 0; i < 400 && endpoint.empty(); ++i) {
    auto out = box.output_so_far();
    std::smatch match;  // points into `out`: read before the next pass
    if (std::regex_search(out, match, listening)) {
      endpoint = match[1];
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  REQUIRE_FALSE(endpoint.empty());
  run.endpoint = endpoint;
  run.key = key;
  for (int i = 0; i < agents; ++i) {
    run.agents.push_back(add_agent(box, run, nproc, "agent-" + std::to_string(i) + ".txt"));
  }
  return run;
}

bool wait_for_lines(const Sandbox& box, const std::string& pattern, size_t count) {
  std::regex line(pattern);
  for (int i = 0; i < 1200; ++i) {
    auto out = box.output_so_far();
    auto found =
        std::distance(std::sregex_iterator(out.begin(), out.end(), line), std::sregex_iterator());
    if (static_cast<size_t>(found) >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}
