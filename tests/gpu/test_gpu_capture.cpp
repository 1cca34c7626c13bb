// train::CapturedStep and train::optim on a GPU: a captured step trains as the
// eager steps do, a host synchronisation inside the step falls back to eager,
// and the optimizers' paths agree with torch::optim's on CUDA. Skipped
// without a CUDA device.

#include <train/capture.h>
#include <train/optim.h>

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <string>

#include "gpu_skip.h"
#include "process_ranks.h"

namespace {

// Ten steps of a small network on cuda:0, their losses, and (in the last
// element) whether the steps were captured.
torch::Tensor train_steps(bool capture, bool sync_inside) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  net->to(gpu);
  train::optim::Adam optimizer(net->parameters(), train::optim::AdamOptions(1e-2));
  train::CapturedStep step(
      [&](const torch::Tensor& x, const torch::Tensor& y) {
        auto loss = torch::mse_loss(net->forward(x), y);
        optimizer.zero_grad();
        loss.backward();
        optimizer.step();
        if (sync_inside) (void)loss.item<float>();  // a host sync: cannot be captured
        return loss;
      },
      train::CaptureOptions().enabled(capture).warmup_steps(3));
  auto generator = at::detail::createCPUGenerator(11);
  auto losses = torch::zeros({11}, torch::kFloat64);
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({64, 16}, generator).to(gpu);
    auto y = torch::randn({64, 4}, generator).to(gpu);
    losses[i] = step(x, y).item<double>();
  }
  losses[10] = step.captured() ? 1.0 : 0.0;
  return losses;
}

}  // namespace

TEST_CASE("a step captured as a CUDA graph trains as the eager steps do") {
  skip_unless_gpus(1);
  auto results = process_ranks::run(1, [](int, const std::filesystem::path&) {
    auto eager = train_steps(false, false);
    auto captured = train_steps(true, false);
    auto fallback = train_steps(true, true);
    return torch::stack({eager, captured, fallback});
  })[0];
  auto eager = results[0], captured = results[1], fallback = results[2];
  CHECK(captured[10].item<double>() == 1.0);
  CHECK(fallback[10].item<double>() == 0.0);
  CHECK(torch::allclose(captured.slice(0, 0, 10), eager.slice(0, 0, 10), 1e-4, 1e-5));
  CHECK(torch::allclose(fallback.slice(0, 0, 10), eager.slice(0, 0, 10), 1e-4, 1e-5));
}

TEST_CASE("train::optim on CUDA: every path ends where torch::optim does") {
  skip_unless_gpus(1);
  auto gaps = process_ranks::run(1, [](int, const std::filesystem::path&) {
    const torch::Device gpu(torch::kCUDA, 0);
    std::vector<double> gap;
    for (auto kernels : {train::optim::Kernels::kForeach, train::optim::Kernels::kFused}) {
      torch::manual_seed(1);
      std::vector<torch::Tensor> a, b;
      for (int i = 0; i < 6; ++i) {
        a.push_back(torch::randn({5 + i, 3}, gpu).requires_grad_());
        b.push_back(a.back().detach().clone().requires_grad_());
      }
      const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
      train::optim::AdamW ours(a, options, kernels);
      torch::optim::AdamW theirs(b, options);
      for (int step = 0; step < 5; ++step) {
        for (size_t i = 0; i < a.size(); ++i) {
          auto g = torch::randn(a[i].sizes(), gpu);
          a[i].mutable_grad() = g;
          b[i].mutable_grad() = g.clone();
        }
        ours.step();
        theirs.step();
      }
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
      }
      gap.push_back(worst);
    }
    return torch::tensor(gap, torch::kFloat64);
  })[0];
  CHECK(gaps[0].item<double>() < 1e-5);  // foreach
  CHECK(gaps[1].item<double>() < 1e-5);  // fused
}
