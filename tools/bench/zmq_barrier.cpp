// The transport's floor for the scale simulation: the same barrier as
// train::report's, with no trainrun code. One ROUTER waits for a message from
// each of N DEALER processes, then answers every one, R times, over a Unix
// socket. Each client records when it sent and when its answer came
// (CLOCK_MONOTONIC), as the fake workers do; the server prints one JSON line
// with the same measures as scale_bench, and the time from spawning the
// clients until every one has said hello.
//
//   zmq_barrier --clients N --rounds R

#include <nlohmann/json.hpp>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "barrier_times.h"

extern char** environ;

namespace {

int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

int client(const std::string& endpoint, int rounds, const std::string& out_path) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 60000);  // bounded: a lost server ends the client
  dealer.connect(endpoint);
  dealer.send(zmq::str_buffer("hello"));
  zmq::message_t reply;
  if (!dealer.recv(reply)) return 1;  // the start signal
  std::vector<std::pair<int64_t, int64_t>> times;
  for (int i = 0; i < rounds; ++i) {
    auto sent = monotonic_ns();
    dealer.send(zmq::str_buffer("report"));
    if (!dealer.recv(reply)) return 1;
    times.emplace_back(sent, monotonic_ns());
  }
  std::ofstream out(out_path);
  for (auto [s, a] : times) out << s << " " << a << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--client") {
    return client(argv[2], std::atoi(argv[3]), argv[4]);
  }
  int clients = 0, rounds = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--clients") clients = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  if (clients <= 0 || rounds <= 0) {
    std::cerr << "usage: zmq_barrier --clients N --rounds R\n";
    return 2;
  }
  char pattern[] = "/tmp/trainrun-zmq-barrier-XXXXXX";
  std::filesystem::path dir = ::mkdtemp(pattern);
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  std::string endpoint = "ipc://" + (dir / "s").string();
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::rcvtimeo, 60000);
  router.bind(endpoint);
  std::vector<pid_t> pids;
  auto start = monotonic_ns();
  auto rounds_text = std::to_string(rounds);
  for (int c = 0; c < clients; ++c) {
    auto out = (dir / ("c" + std::to_string(c))).string();
    std::vector<char*> args{argv[0], const_cast<char*>("--client"), endpoint.data(),
                            rounds_text.data(), out.data(), nullptr};
    pid_t pid;
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, args.data(), environ) != 0) return 1;
    pids.push_back(pid);
  }
  std::vector<std::string> ids;
  auto collect = [&](bool keep) {
    for (int c = 0; c < clients; ++c) {
      zmq::message_t id, body;
      if (!router.recv(id) || !router.recv(body)) return false;
      if (keep) ids.push_back(id.to_string());
    }
    return true;
  };
  auto answer = [&] {
    for (const auto& id : ids) {
      router.send(zmq::buffer(id), zmq::send_flags::sndmore);
      router.send(zmq::str_buffer("ack"));
    }
  };
  bool ok = collect(true);
  double ready = static_cast<double>(monotonic_ns() - start) / 1e9;  // every client connected
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  answer();
  for (int r = 0; ok && r < rounds; ++r) {
    ok = collect(false);
    if (ok) answer();
  }
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  bench::BarrierTimes times(static_cast<size_t>(rounds));
  for (int c = 0; c < clients; ++c) {
    std::ifstream in(dir / ("c" + std::to_string(c)));
    double s = 0, a = 0;
    for (size_t i = 0; i < times.size() && in >> s >> a; ++i) times[i].emplace_back(s, a);
  }
  auto [round_trips, releases] = bench::round_trips_and_releases(times);
  auto cpu = [](const rusage& u) {
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  nlohmann::json out = {{"clients", clients},
                        {"rounds", rounds},
                        {"ok", ok},
                        {"ready_s", ready},
                        {"round_trip_p50_us", bench::percentile(round_trips, 0.5)},
                        {"round_trip_p99_us", bench::percentile(round_trips, 0.99)},
                        {"release_p50_us", bench::percentile(releases, 0.5)},
                        {"release_p99_us", bench::percentile(releases, 0.99)},
                        {"server_cpu_s", cpu(after) - cpu(before)}};
  std::cout << out.dump() << std::endl;
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
