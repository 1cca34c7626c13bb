// What train::report's divergence check costs, against a training step of the
// same model measured in the same run. Ranks are threads over Gloo in one
// process (as the reducer's tests run them); each prepares a 784-1024-256-10
// MLP (1.07M parameters) with replicate(), then times SGD steps on a batch of
// 64, the check alone, a bare allreduce the size of the check's, and the
// check's hashes against the bit sums they replaced. Rank 0 prints medians
// and ratios. Intra-op parallelism is one thread, shared by
// the ranks' threads.
//
//   divergence_bench [--ranks 2] [--rounds 50]

#include <train/torch_compat.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "ddp/reducer.h"
#include "ddp/replica_check.h"

namespace {

using Clock = std::chrono::steady_clock;

double median_ms(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Milliseconds of each of `rounds` calls of `body`, after two untimed ones.
std::vector<double> time_each(int rounds, const std::function<void()>& body) {
  for (int i = 0; i < 2; ++i) body();
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    auto start = Clock::now();
    body();
    samples.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return samples;
}

void run_rank(int rank, int world, int rounds, const c10::intrusive_ptr<c10d::Store>& store) {
  auto group = train::compat::make_gloo_group(
      store, rank, world, c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"),
      std::chrono::seconds(60));

  auto model = torch::nn::Sequential(torch::nn::Linear(784, 1024), torch::nn::ReLU(),
                                     torch::nn::Linear(1024, 256), torch::nn::ReLU(),
                                     torch::nn::Linear(256, 10));
  auto prepared = train::detail::replicate(model.ptr(), group, torch::kCPU, {});
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::manual_seed(rank);
  auto x = torch::randn({64, 784});
  auto y = torch::randint(10, {64});

  auto step = time_each(rounds, [&] {
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    optimizer.step();
  });
  auto check =
      time_each(rounds, [&] { train::detail::check_divergence({prepared}, *group, "bench"); });
  // The check's collective alone: one int64 and its complement per tensor, plus two counts.
  const auto length = 2 * static_cast<int64_t>(model->parameters().size() + 2);
  auto allreduce = time_each(rounds, [&] {
    std::vector<torch::Tensor> t{torch::zeros({length}, torch::kLong)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    group->allreduce(t, max)->wait();
  });

  // The hashes alone, against the checksum they replaced in the same run: a
  // sum of the elements' bit patterns (which missed swapped elements and
  // changes that cancel).
  const auto tensors = model->parameters();
  int64_t sink = 0;
  auto hashes = time_each(rounds, [&] {
    for (const auto& p : tensors) sink ^= train::detail::bit_hash(p);
  });
  auto sums = time_each(rounds, [&] {
    for (const auto& p : tensors) {
      sink ^=
          p.detach().contiguous().view({-1}).view(torch::kInt).sum(torch::kLong).item<int64_t>();
    }
  });

  if (rank != 0) return;
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  const double step_ms = median_ms(step), check_ms = median_ms(check);
  const double allreduce_ms = median_ms(allreduce);
  std::printf("%d ranks, %lld parameters in %zu tensors, %d rounds (medians)\n", world,
              static_cast<long long>(params), model->parameters().size(), rounds);
  std::printf("training step (batch 64): %.3f ms\n", step_ms);
  std::printf("divergence check:         %.3f ms  (%.4f of a step)\n", check_ms,
              check_ms / step_ms);
  std::printf("  of which the allreduce: %.3f ms\n", allreduce_ms);
  std::printf("the hashes alone:         %.3f ms  (%.2fx the former bit sums' %.3f ms)%s\n",
              median_ms(hashes), median_ms(hashes) / median_ms(sums), median_ms(sums),
              sink == 42 ? " " : "");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"divergence_bench: the cost of train::report's divergence check"};
  int world = 2, rounds = 50;
  app.add_option("--ranks", world);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);

  at::set_num_threads(1);  // a core per rank, as trainrun gives each local worker its share
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] { run_rank(rank, world, rounds, store); });
  }
  for (auto& t : ranks) t.join();
  return 0;
}
