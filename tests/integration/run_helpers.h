#pragma once

// Runs the real trainrun executable in a private temporary directory (its
// storage path and plugin cache), and reads what it left behind.

#include <nlohmann/json.hpp>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

struct RunOutput {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

class Sandbox {
 public:
  Sandbox();
  ~Sandbox();

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path results() const { return root_ / "results"; }
  std::filesystem::path run_dir(const std::string& name) const { return results() / name; }

  /// Runs `trainrun --storage-path <root>/results ARGS` to completion.
  RunOutput run(const std::string& args) const;
  /// `WRAPPER trainrun --storage-path <root>/results ARGS` (a debugger's
  /// command line, say) to completion.
  RunOutput run_wrapped(const std::string& wrapper, const std::string& args) const;
  /// `trainrun ARGS` with the sandbox as its working directory and no
  /// --storage-path of its own.
  RunOutput run_in_root(const std::string& args) const;
  /// The same on a terminal (a pseudo-terminal `columns` wide, from
  /// script(1)): what a person at a terminal sees, control characters and all.
  RunOutput run_on_terminal(const std::string& args, int columns = 100) const;
  /// Starts it in the background with output going to <root>/out.txt.
  pid_t start(const std::string& args) const;
  /// Starts `trainrun worker ARGS` in the background (a remote worker: its own
  /// plugin cache under the sandbox), output to <root>/<log>.
  pid_t start_worker(const std::string& args, const std::string& log) const;
  /// Waits for a started run; returns its exit code.
  static int wait(pid_t pid);
  std::string output_so_far() const;

  /// The live worker processes started from this sandbox.
  std::vector<pid_t> worker_pids() const;
  bool any_worker_alive() const { return !worker_pids().empty(); }

 private:
  std::string command(const std::string& args) const;
  std::filesystem::path root_;
};

std::string read_text(const std::filesystem::path& path);
nlohmann::json read_json(const std::filesystem::path& path);
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path);
/// Resets (ss -K: an RST both ways) every established TCP connection that
/// process `pid` holds to `port`; returns how many. -1 where that cannot be
/// done: without root, or on a kernel without INET_DIAG_DESTROY.
int reset_connections(pid_t pid, int port);
/// The staging directories (.staging-*) a run directory holds.
std::vector<std::string> staging_leftovers(const std::filesystem::path& run_dir);
/// The whitespace-separated numbers of a text file.
std::vector<double> read_numbers(const std::filesystem::path& path);
/// The largest difference between two files of numbers, element by element;
/// infinite when they hold different counts, or none.
double largest_difference(const std::filesystem::path& a, const std::filesystem::path& b);
/// The last value of `metric` reported at each step (the metric "step"): a
/// restart reports some steps twice, and the later one counts.
std::map<int64_t, double> by_step(const std::vector<nlohmann::json>& reports,
                                  const std::string& metric);
/// result.jsonl's reports, oldest first, each with the checkpoint it
/// committed: an asynchronous upload's commit line folded into its report.
std::vector<nlohmann::json> read_reports(const std::filesystem::path& results);

/// Sharded data for tests/plugins/shards_plugin.cpp: `samples` samples, each
/// an "id" field, in classes of 60 consecutive ids (so that the shards are
/// sorted by label), packed by `trainrun pack` into <root>/shards/train-NNNN.tar,
/// 50 samples each. Returns the spec of the shards.
std::string pack_id_samples(const Sandbox& box, int samples);
/// The "trained min=A max=B sum=C" line the shards plugin's rank 0 prints,
/// and that line when each of `samples` samples was trained `epochs` times.
std::string trained_line(const std::string& output);
std::string each_trained(int epochs, int samples);

/// A run started with node agents: the controller, the agents, where the
/// controller listens and the run key's file.
struct AgentRun {
  pid_t controller = -1;
  std::vector<pid_t> agents;
  std::string endpoint;
  std::string key;
};
/// One more node agent of `nproc` workers for a started run, output to <root>/<log>.
pid_t add_agent(const Sandbox& box, const AgentRun& run, int nproc, const std::string& log);
/// Starts `trainrun ARGS` (its plugin among them) for `workers` workers on
/// loopback with a new run key, and `agents` node agents of `nproc` workers
/// each (default: workers / agents). `num_workers` is what -n says (default:
/// workers); the startup timeout is 60 s unless ARGS give one.
AgentRun start_agents(const Sandbox& box, const std::string& args, int workers, int agents,
                      int nproc = 0, const std::string& num_workers = "");
/// Waits (at most 60 s) until the controller's output holds `count` lines
/// matching `pattern`.
bool wait_for_lines(const Sandbox& box, const std::string& pattern, size_t count);
