#pragma once

// Ranks as processes, for the GPU tests that put two ranks on one GPU. They
// cannot be threads of one process: autograd runs a CUDA device's backward
// work on one thread per process, and the reducer's end-of-backward wait for
// its collectives (run on that thread when it finishes the graph) would hold
// up the other rank's backward, which those collectives need, until the
// collective timeout. So each rank is a child forked before this process
// touches CUDA (a CUDA context does not survive fork), the ranks meet over a
// FileStore, and what a child returns comes back through a file. The parent
// never initializes CUDA: it counts devices in a child too, and every CUDA
// case of tests/gpu runs its CUDA work in children.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>
#include <train/torch_compat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace process_ranks {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

/// Bounds every rendezvous and collective, so a failing rank cannot hang the others.
constexpr std::chrono::seconds kCollectiveTimeout{30};
/// Bounds a whole child: it is killed past this.
constexpr std::chrono::seconds kChildLimit{180};

/// A Gloo group of `world` ranks over loopback, meeting in `dir`.
inline Group gloo_group(int rank, int world, const std::filesystem::path& dir) {
  auto store = c10::make_intrusive<c10d::FileStore>((dir / "store").string(), world);
  store->setTimeout(kCollectiveTimeout);
  return train::compat::make_gloo_group(
      store, rank, world, c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"),
      kCollectiveTimeout);
}

/// Runs `body(index, dir)` in `count` forked children at once; returns what
/// each returned (moved to the CPU). Throws with every child's failure: an
/// exception's message, a signal, or the time limit.
inline std::vector<torch::Tensor> run(
    int count, const std::function<torch::Tensor(int index, const std::filesystem::path& dir)>& body) {
  char pattern[] = "/tmp/trainrun-ranks-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::filesystem::path dir = pattern;
  auto result_file = [&](int i) { return dir / ("result-" + std::to_string(i) + ".pt"); };
  auto error_file = [&](int i) { return dir / ("error-" + std::to_string(i) + ".txt"); };
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        torch::save(body(i, dir).cpu(), result_file(i).string());
      } catch (const std::exception& e) {
        std::ofstream(error_file(i)) << e.what();
        code = 1;
      } catch (...) {
        std::ofstream(error_file(i)) << "an exception that is not a std::exception";
        code = 1;
      }
      std::_Exit(code);  // no static destructors, no test report from the child
    }
    if (pid < 0) {
      for (pid_t child : children) ::kill(child, SIGKILL);
      for (pid_t child : children) ::waitpid(child, nullptr, 0);
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
      throw std::runtime_error("fork failed");
    }
    children.push_back(pid);
  }
  std::vector<int> statuses(count, -1);
  const auto deadline = std::chrono::steady_clock::now() + kChildLimit;
  for (int left = count; left > 0;) {
    for (int i = 0; i < count; ++i) {
      if (statuses[i] != -1) continue;
      int status = 0;
      if (::waitpid(children[i], &status, WNOHANG) == children[i]) {
        statuses[i] = status;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int i = 0; i < count; ++i) {
        if (statuses[i] == -1) ::kill(children[i], SIGKILL);
      }
      for (int i = 0; i < count; ++i) {
        if (statuses[i] == -1) ::waitpid(children[i], nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string failed;
  std::vector<torch::Tensor> results(count);
  for (int i = 0; i < count; ++i) {
    std::string why;
    if (statuses[i] == -1) {
      why = "did not finish in " + std::to_string(kChildLimit.count()) + " s";
    } else if (WIFSIGNALED(statuses[i])) {
      why = "was killed by signal " + std::to_string(WTERMSIG(statuses[i]));
    } else if (WEXITSTATUS(statuses[i]) != 0) {
      std::ifstream in(error_file(i));
      std::stringstream text;
      text << in.rdbuf();
      why = text.str();
      if (why.empty()) why = "exited " + std::to_string(WEXITSTATUS(statuses[i]));
    } else {
      torch::load(results[i], result_file(i).string());
    }
    if (why.empty()) continue;
    if (!failed.empty()) failed += "; ";
    failed += "rank " + std::to_string(i) + ": " + why;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!failed.empty()) throw std::runtime_error(failed);
  return results;
}

/// The CUDA devices a child sees, counted without initializing CUDA here;
/// throws where the count fails (a child that crashes, or outlives kChildLimit).
inline int count_cuda_devices(const std::function<int()>& count) {
  auto counted = run(1, [&](int, const std::filesystem::path&) {
    return torch::tensor(static_cast<int64_t>(count()));
  });
  return static_cast<int>(counted[0].item<int64_t>());
}

}  // namespace process_ranks
