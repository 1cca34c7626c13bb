#pragma once

// Ranks as threads in one process, each with its own Gloo process group over
// one in-memory HashStore (as c10d's ProcessGroupGlooTest does), over loopback.

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <train/torch_compat.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

// Bounds every rendezvous and collective, so a failing rank cannot hang the others.
constexpr std::chrono::seconds kCollectiveTimeout{30};

// Runs `rank_body` on `world` threads. Joins them all, then throws what every
// failed rank threw.
inline void run_ranks(int world, const std::function<void(int rank, Group group)>& rank_body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(kCollectiveTimeout);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        rank_body(rank, train::compat::make_gloo_group(
                            store, rank, world,
                            c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"),
                            kCollectiveTimeout));
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      } catch (...) {
        failures[rank] = "an exception that is not a std::exception";
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Every failure, not only the first: a rank's error often shows up on its peers.
  std::string failed;
  for (int rank = 0; rank < world; ++rank) {
    if (failures[rank].empty()) continue;
    if (!failed.empty()) failed += "; ";
    failed += "rank " + std::to_string(rank) + ": " + failures[rank];
  }
  if (!failed.empty()) throw std::runtime_error(failed);
}
