// Node agents (`trainrun worker --nproc N`) on loopback: each starts and
// supervises its host's workers, forwards their output to the controller, and
// reports how each ended; the controller names the cause as for local workers.

#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <regex>
#include <thread>

#include "run_helpers.h"

namespace {

const std::string kTestPlugin = std::string("--plugin '") + TEST_PLUGIN + "'";

// A run of `workers` workers of the test plugin on loopback with the run key,
// and `agents` node agents of `nproc` workers each (default: workers / agents).
// `num_workers` is what -n says (default: workers).
AgentRun start_agent_run(const Sandbox& box, const std::string& args, int workers, int agents,
                         int nproc = 0, const std::string& num_workers = "") {
  return start_agents(box, kTestPlugin + " " + args, workers, agents, nproc, num_workers);
}

// The processes the train functions started ("child <pid>" lines), once each
// is gone or a zombie; false if one is still running after 5 s.
bool children_end(const Sandbox& box) {
  std::vector<pid_t> children;
  std::regex child_line("child ([0-9]+)");
  auto out = box.output_so_far();
  for (std::sregex_iterator it(out.begin(), out.end(), child_line), end; it != end; ++it) {
    children.push_back(std::stoi((*it)[1]));
  }
  auto alive = [&] {
    for (pid_t child : children) {
      auto status = read_text("/proc/" + std::to_string(child) + "/stat");
      auto state = status.find(") ");
      if (state != std::string::npos && status[state + 2] != 'Z') return true;
    }
    return box.any_worker_alive();
  };
  for (int i = 0; i < 100 && alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return !alive();
}

}  // namespace

TEST_CASE(
    "node agents start their workers, forward their output by rank, and fetch the plugin once a "
    "host") {
  Sandbox box;
  auto run = start_agent_run(box, "--entry context --name agents", 4, 2);
  CHECK(Sandbox::wait(run.controller) == 0);
  for (pid_t agent : run.agents) CHECK(Sandbox::wait(agent) == 0);
  auto out = box.output_so_far();
  INFO(out);
  auto agents_out = read_text(box.root() / "agent-0.txt") + read_text(box.root() / "agent-1.txt");
  INFO(agents_out);
  auto controller_log = read_text(box.run_dir("agents") / "logs" / "controller.log");
  INFO(controller_log);
  CHECK(out.find("started 2 workers") != std::string::npos);
  CHECK(std::regex_search(out, std::regex("node 0 \\([^)]+\\): ranks 0-3")));
  // Each rank's line, on the controller's terminal and in its log by rank.
  for (int rank = 0; rank < 4; ++rank) {
    auto r = std::to_string(rank);
    CHECK(std::regex_search(
        out, std::regex("\\[rank " + r + " \\([^)]+\\)\\] context world_rank=" + r)));
    CHECK(read_text(box.run_dir("agents") / "logs" / ("worker-" + r + ".log"))
              .find("world_rank=" + r + " ") != std::string::npos);
  }
  // Four workers, one host, one cache: one download, nothing partial left.
  int plugins = 0, partial = 0;
  for (const auto& entry : std::filesystem::directory_iterator(box.root() / "remote-cache")) {
    auto name = entry.path().filename().string();
    plugins += name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0;
    partial += name.find(".part.") != std::string::npos;
  }
  CHECK(plugins == 1);
  CHECK(partial == 0);
  CHECK(read_text(box.run_dir("agents") / "logs" / "controller.log")
            .find("sent the plugin to 1 worker; the others found it in their host's plugin "
                  "cache") != std::string::npos);
}

TEST_CASE("a worker's crash under a node agent is named at once, with its signal") {
  Sandbox box;
  auto started = std::chrono::steady_clock::now();
  auto run = start_agent_run(
      box, "--entry crash --config how=segv --name crash --heartbeat-timeout 60", 2, 1);
  CHECK(Sandbox::wait(run.controller) == 1);
  CHECK(Sandbox::wait(run.agents[0]) == 1);  // a worker of its failed
  // Not the heartbeat timeout: the agent saw the exit.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(50));
  auto error = read_json(box.run_dir("crash") / "error.json");
  INFO(error.dump());
  CHECK(error["kind"] == "signal");
  CHECK(error["rank"] == 1);
  CHECK(error["message"].get<std::string>().find("SIGSEGV") != std::string::npos);
  CHECK_FALSE(error["host"].get<std::string>().empty());
  CHECK(box.output_so_far().find("rank 1 is about to crash") != std::string::npos);
}

TEST_CASE(
    "a killed node agent fails the run after the heartbeat timeout, naming its workers' host") {
  Sandbox box;
  auto run = start_agent_run(
      box, "--entry sleeps --config child=true --name lost --heartbeat-timeout 3", 4, 2);
  REQUIRE(wait_for_lines(box, "\\] sleeping", 4));
  ::kill(run.agents[1], SIGKILL);
  CHECK(Sandbox::wait(run.controller) == 1);
  Sandbox::wait(run.agents[1]);
  CHECK(Sandbox::wait(run.agents[0]) == 0);  // its workers were told SHUTDOWN
  auto error = read_json(box.run_dir("lost") / "error.json");
  INFO(error.dump());
  CHECK(error["kind"] == "lost");
  CHECK_FALSE(error["host"].get<std::string>().empty());
  CHECK(error["message"].get<std::string>().find("nor did the node agent on") != std::string::npos);
  CHECK(children_end(box));  // the killed agent's workers took their children with them
}

TEST_CASE("SIGTERM to a node agent, as scancel sends, ends its workers and names the signal") {
  Sandbox box;
  auto run = start_agent_run(box, "--entry sleeps --config child=true --name term", 2, 1);
  REQUIRE(wait_for_lines(box, "\\] sleeping", 2));
  ::kill(run.agents[0], SIGTERM);
  CHECK(Sandbox::wait(run.agents[0]) == 1);
  CHECK(Sandbox::wait(run.controller) == 1);
  auto error = read_json(box.run_dir("term") / "error.json");
  INFO(error.dump());
  CHECK(error["kind"] == "signal");
  CHECK(error["message"].get<std::string>().find("SIGTERM") != std::string::npos);
  CHECK(children_end(box));
}

TEST_CASE("node agents end their workers when the controller is killed") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry sleeps --config child=true --name orphan "
                             "--heartbeat-timeout 2",
                             2, 1);
  REQUIRE(wait_for_lines(box, "\\] sleeping", 2));
  ::kill(run.controller, SIGKILL);
  Sandbox::wait(run.controller);
  CHECK(Sandbox::wait(run.agents[0]) == 1);
  CHECK(read_text(box.root() / "agent-0.txt").find("lost the controller") != std::string::npos);
  CHECK(children_end(box));
}

TEST_CASE("Ctrl-C on the controller stops the node agents' workers too") {
  Sandbox box;
  auto run = start_agent_run(box, "--entry sleeps --config child=true --name interrupted", 2, 1);
  REQUIRE(wait_for_lines(box, "\\] sleeping", 2));
  ::kill(run.controller, SIGINT);
  CHECK(Sandbox::wait(run.controller) == 130);
  CHECK(Sandbox::wait(run.agents[0]) == 0);  // its workers left on SHUTDOWN
  CHECK(read_json(box.run_dir("interrupted") / "error.json")["kind"] == "interrupted");
  CHECK(children_end(box));
}

TEST_CASE("a node agent with more workers than the run has room for fails it at once, saying so") {
  Sandbox box;
  auto started = std::chrono::steady_clock::now();
  auto run = start_agent_run(box, "--entry context --name crowded --heartbeat-timeout 60", 2, 1, 3);
  CHECK(Sandbox::wait(run.controller) == 1);
  CHECK(Sandbox::wait(run.agents[0]) == 2);                                      // refused
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(50));  // not a timeout
  auto error = read_json(box.run_dir("crowded") / "error.json");
  INFO(error.dump());
  CHECK(error["kind"] == "usage");  // a deployment's mistake: never retried
  CHECK(error["message"].get<std::string>().find(
            "started 3 workers, but the run has room for 2 (--num-workers 2)") !=
        std::string::npos);
  CHECK(children_end(box));
}

TEST_CASE("a node agent starts new workers for a new attempt after one of its workers is killed") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = start_agent_run(box,
                             "--entry resumable --name again --max-failures 1 --config steps=4 "
                             "--config marker=" +
                                 marker,
                             2, 1);
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);  // its last attempt's workers finished
  auto out = box.output_so_far();
  INFO(out);
  INFO(read_text(box.root() / "agent-0.txt"));
  CHECK(out.find("attempt 2/2 after rank 1") != std::string::npos);
  CHECK(std::regex_search(out, std::regex("node agent on [^ ]+ \\(pid [0-9]+\\) started 2 "
                                          "workers[^]*node agent on [^ ]+ \\(pid [0-9]+\\) "
                                          "started 2 workers")));
  auto info = read_json(box.run_dir("again") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["kind"] == "signal");
  auto results = read_jsonl(box.run_dir("again") / "result.jsonl");
  REQUIRE_FALSE(results.empty());
  CHECK(results.back()["metrics"]["step"] == 3);
  CHECK(results.back()["attempt"] == 2);
  CHECK(children_end(box));
}

TEST_CASE("a lost node is replaced by a new node agent, and the next attempt goes on") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry resumable --name replaced --max-failures 1 "
                             "--heartbeat-timeout 4 --config steps=200 --config sleep_ms=20",
                             2, 2);
  REQUIRE(wait_for_lines(box, "report 3 ", 1));
  ::kill(run.agents[1], SIGKILL);
  Sandbox::wait(run.agents[1]);
  REQUIRE(wait_for_lines(box, "attempt 2/2 after", 1));
  pid_t replacement = add_agent(box, run, 1, "agent-2.txt");  // on the "same node"
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  CHECK(Sandbox::wait(replacement) == 0);
  auto out = box.output_so_far();
  INFO(out);
  CHECK(out.find("is gone: the next attempt goes on without it") != std::string::npos);
  auto info = read_json(box.run_dir("replaced") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["kind"] == "lost");
  CHECK(info["attempts"][0]["error"]["message"].get<std::string>().find(
            "nor did the node agent on") != std::string::npos);
  auto results = read_jsonl(box.run_dir("replaced") / "result.jsonl");
  CHECK(results.back()["metrics"]["step"] == 199);
  CHECK(children_end(box));
}

TEST_CASE("an elastic group shrinks from 4 to 2 workers when a node is lost, and grows back") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry resumable --name elastic --max-failures 1 "
                             "--heartbeat-timeout 4 --config steps=800 --config sleep_ms=20",
                             4, 2, 0, "2:4");
  REQUIRE(wait_for_lines(box, "report 3 ", 1));
  ::kill(run.agents[1], SIGKILL);
  Sandbox::wait(run.agents[1]);
  REQUIRE(wait_for_lines(box, "attempt 2 goes on with 2 of 4 workers", 1));
  REQUIRE(wait_for_lines(box, "sum=2 ", 2));  // it trains on 2
  pid_t joining = add_agent(box, run, 2, "agent-2.txt");
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  CHECK(Sandbox::wait(joining) == 0);
  auto out = box.output_so_far();
  INFO(out);
  CHECK(out.find("joined with 2 workers") != std::string::npos);
  CHECK(out.find("the group grows from 2 workers at checkpoint") != std::string::npos);
  auto info = read_json(box.run_dir("elastic") / "run.json");
  REQUIRE(info["attempts"].size() == 3);
  CHECK(info["attempts"][0]["world_size"] == 4);
  CHECK(info["attempts"][0]["error"]["kind"] == "lost");
  CHECK(info["attempts"][1]["world_size"] == 2);
  CHECK(info["attempts"][1]["regrouped"] == true);
  CHECK(info["attempts"][2]["world_size"] == 4);
  CHECK_FALSE(info["attempts"][2].contains("error"));
  // Each report's allreduce sums over the attempt's world; iterations count on.
  auto results = read_jsonl(box.run_dir("elastic") / "result.jsonl");
  int64_t iteration = 0;
  for (const auto& line : results) {
    int attempt = line["attempt"].get<int>();
    CHECK(line["iteration"] == ++iteration);
    CHECK(line["metrics"]["sum"] == (attempt == 2 ? 2.0 : 4.0));
  }
  CHECK(results.back()["metrics"]["step"] == 799);
  CHECK(results.back()["attempt"] == 3);
  CHECK(children_end(box));
}

namespace {

// Ends a started run whose test cannot reset connections (ss -K needs root).
void skip_without_root(const AgentRun& run) {
  MESSAGE("skipped: resetting a TCP connection (ss -K) needs root and INET_DIAG_DESTROY");
  ::kill(run.controller, SIGINT);
  Sandbox::wait(run.controller);
  for (pid_t agent : run.agents) Sandbox::wait(agent);
}

int port_of(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

}  // namespace

TEST_CASE("a node agent whose connection is reset mid-run reconnects and keeps its place") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry steps --name reset --config steps=24 --config sleep_ms=250"
                             " --max-failures 2",
                             2, 1);
  REQUIRE(wait_for_lines(box, "report 2 \\(", 1));
  const int reset = reset_connections(run.agents[0], port_of(run.endpoint));
  if (reset < 0) return skip_without_root(run);
  CHECK(reset == 1);
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  auto log = read_text(box.run_dir("reset") / "logs" / "controller.log");
  INFO(log);
  INFO(read_text(box.root() / "agent-0.txt"));
  CHECK(read_jsonl(box.run_dir("reset") / "result.jsonl").size() == 24);
  auto info = read_json(box.run_dir("reset") / "run.json");
  CHECK(info["attempts"].size() == 1);  // survived: no restart
  CHECK(log.find("dropped a message") == std::string::npos);
}

TEST_CASE(
    "a remote worker whose connection is reset before the ranks are assigned keeps its place") {
  Sandbox box;
  auto run = start_agent_run(box, "--entry steps --name early --config steps=3", 2, 0, 1);
  pid_t first =
      box.start_worker("--connect " + run.endpoint + " --auth-key '" + run.key + "'", "first.txt");
  REQUIRE(wait_for_lines(box, "a worker on [^ ]+ \\(pid " + std::to_string(first) + "\\) connected",
                         1));
  const int reset = reset_connections(first, port_of(run.endpoint));
  if (reset < 0) {
    MESSAGE("skipped: resetting a TCP connection (ss -K) needs root and INET_DIAG_DESTROY");
    ::kill(first, SIGTERM);
    ::kill(run.controller, SIGINT);
    Sandbox::wait(first);
    Sandbox::wait(run.controller);
    return;
  }
  CHECK(reset == 1);  // its main connection: the only one before the ranks are assigned
  // Heartbeats cross the new connection before the second worker comes (in
  // either order the run must finish).
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  pid_t second =
      box.start_worker("--connect " + run.endpoint + " --auth-key '" + run.key + "'", "second.txt");
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(first) == 0);
  CHECK(Sandbox::wait(second) == 0);
  INFO(read_text(box.root() / "first.txt"));
  CHECK(read_jsonl(box.run_dir("early") / "result.jsonl").size() == 3);
}

TEST_CASE("a worker whose train connection is reset ends the attempt as a loss that says so") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry steps --name lost --config steps=20 --config sleep_ms=250"
                             " --max-failures 2",
                             2, 1);
  REQUIRE(wait_for_lines(box, "report 2 \\(", 1));
  auto workers = box.worker_pids();
  workers.erase(std::remove(workers.begin(), workers.end(), run.agents[0]), workers.end());
  REQUIRE_FALSE(workers.empty());
  // Every connection of one worker: its main one survives, its train one cannot.
  const int reset = reset_connections(workers[0], port_of(run.endpoint));
  if (reset < 0) return skip_without_root(run);
  CHECK(reset >= 3);  // main, train, store (and upload, once it exists)
  INFO(box.output_so_far());
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  auto attempts = read_json(box.run_dir("lost") / "run.json")["attempts"];
  REQUIRE(attempts.size() == 2);
  auto error = attempts[0]["error"];
  CHECK(error["kind"] == "lost");
  CHECK(error["message"].get<std::string>().find("connection to the controller was reset") !=
        std::string::npos);
  CHECK(read_jsonl(box.run_dir("lost") / "result.jsonl").back()["attempt"] == 2);
}

TEST_CASE("a node agent with another key starts no worker and says at once that it was refused") {
  Sandbox box;
  auto run = start_agent_run(box, "--entry steps --name k --config steps=2", 1, 0, 1);
  auto other = (box.root() / "other.key").string();
  REQUIRE(box.run("keygen '" + other + "'").exit_code == 0);
  // Without the handshake first it would start 3 workers and wait the minute out.
  pid_t wrong = box.start_worker(
      "--connect " + run.endpoint + " --auth-key '" + other + "' --nproc 3 --startup-timeout 60",
      "wrong.txt");
  CHECK(Sandbox::wait(wrong) == 2);
  auto said = read_text(box.root() / "wrong.txt");
  INFO(said);
  CHECK(said.find("the controller at " + run.endpoint + " refused this key") != std::string::npos);
  CHECK(said.find("no worker was started") != std::string::npos);
  CHECK(said.find("started 3 workers") == std::string::npos);
  // The run takes an agent with its key all the same.
  pid_t right = add_agent(box, run, 1, "right.txt");
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(right) == 0);
}

TEST_CASE(
    "a node agent stopped for longer than the heartbeat timeout does not blame the controller") {
  Sandbox box;
  auto run = start_agent_run(box,
                             "--entry steps --name stall --config steps=40 --config sleep_ms=500"
                             " --heartbeat-timeout 5",
                             2, 1);
  REQUIRE(wait_for_lines(box, "report 2 \\(", 1));
  // Its workers go on and the controller keeps talking; the agent hears
  // nothing for 9 s, as on a frozen VM.
  ::kill(run.agents[0], SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(9));
  ::kill(run.agents[0], SIGCONT);
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  auto said = read_text(box.root() / "agent-0.txt");
  INFO(said);
  CHECK(said.find("lost the controller") == std::string::npos);
  CHECK(said.find("this agent did not run for a while") != std::string::npos);
  CHECK(read_json(box.run_dir("stall") / "run.json")["attempts"].size() == 1);
  CHECK(read_jsonl(box.run_dir("stall") / "result.jsonl").size() == 40);
}

TEST_CASE(
    "two node agents at the same instant for the room of one: one is refused, the run goes on") {
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    Sandbox box;
    // Both agents at once (they race for the room), or the second a moment
    // later (the first one's workers already hold it): the same end.
    const auto args =
        std::string("--entry steps --name race --config steps=3 --config sleep_ms=1000");
    auto run = start_agent_run(box, args, 2, round == 0 ? 2 : 1, 2);
    if (round == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      run.agents.push_back(add_agent(box, run, 2, "agent-1.txt"));
    }
    CHECK(Sandbox::wait(run.controller) == 0);
    const int a = Sandbox::wait(run.agents[0]);
    const int b = Sandbox::wait(run.agents[1]);
    const auto said = read_text(box.root() / "agent-0.txt") + read_text(box.root() / "agent-1.txt");
    INFO(said);
    CHECK(std::min(a, b) == 0);  // one agent's workers ran the run
    CHECK(std::max(a, b) == 2);  // the other was refused
    CHECK(read_jsonl(box.run_dir("race") / "result.jsonl").size() == 3);
    CHECK(read_json(box.run_dir("race") / "run.json")["status"] == "finished");
  }
}
