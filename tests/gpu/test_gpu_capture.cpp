// train::CapturedStep and train::optim on a GPU: a captured step trains as the
// eager steps do, a host synchronisation inside the step falls back to eager
// and leaves the caching allocator as it was, and the optimizers' paths agree
// with torch::optim's on CUDA. Skipped without a CUDA device.

#include <train/capture.h>
#include <train/optim.h>

#include <c10/core/Event.h>
#include <torch/torch.h>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <doctest/doctest.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "process_ranks.h"

namespace {

// A training step of `net` with `optimizer`; with sync_inside, a host sync
// that no capture can take.
template <typename Net>
train::CapturedStep::Step step_of(Net& net, torch::optim::Optimizer& optimizer, bool sync_inside) {
  return [&net, &optimizer, sync_inside](const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor loss = torch::mse_loss(net->forward(x), y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    if (sync_inside) (void)loss.item<float>();
    return loss;
  };
}

// Ten steps of a small network on cuda:0, their losses, and (in the last
// element) whether the steps were captured.
torch::Tensor train_steps(bool capture, bool sync_inside) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  net->to(gpu);
  train::optim::Adam optimizer(net->parameters(), train::optim::AdamOptions(1e-2));
  train::CapturedStep step(step_of(net, optimizer, sync_inside),
                           train::CaptureOptions().enabled(capture).warmup_steps(3));
  auto generator = at::detail::createCPUGenerator(11);
  auto losses = torch::zeros({11}, torch::kFloat64);
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({64, 16}, generator).to(gpu);
    auto y = torch::randn({64, 4}, generator).to(gpu);
    losses[i] = step(x, y).item<double>();
  }
  losses[10] = step.captured() ? 1.0 : 0.0;
  // The step counts the replays kept on the device reach the saved state.
  std::stringstream saved;
  torch::save(optimizer, saved);
  torch::optim::Adam loaded(net->parameters(), train::optim::AdamOptions(1e-2));
  torch::load(loaded, saved);
  for (const auto& [key, state] : loaded.state()) {
    (void)key;
    if (static_cast<torch::optim::AdamParamState&>(*state).step() != 10) losses[10] = -1.0;
  }
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
  CHECK(eager[10].item<double>() == 0.0);  // not captured, and every step counted
  CHECK(captured[10].item<double>() == 1.0);
  CHECK(fallback[10].item<double>() == 0.0);
  CHECK(torch::allclose(captured.slice(0, 0, 10), eager.slice(0, 0, 10), 1e-4, 1e-5));
  CHECK(torch::allclose(fallback.slice(0, 0, 10), eager.slice(0, 0, 10), 1e-4, 1e-5));
}

TEST_CASE("train::optim on CUDA: AdamW and SGD on every path end where torch::optim does") {
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
      std::vector<torch::Tensor> c, d;
      for (const auto& p : a) {
        c.push_back(p.detach().clone().requires_grad_());
        d.push_back(p.detach().clone().requires_grad_());
      }
      const auto sgd_options = torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true);
      train::optim::SGD sgd(c, sgd_options, kernels);
      torch::optim::SGD sgd_theirs(d, sgd_options);
      for (int step = 0; step < 5; ++step) {
        for (size_t i = 0; i < a.size(); ++i) {
          auto g = torch::randn(a[i].sizes(), gpu);
          a[i].mutable_grad() = g;
          b[i].mutable_grad() = g.clone();
        }
        for (size_t i = 0; i < c.size(); ++i) {
          auto g = torch::randn(c[i].sizes(), gpu);
          c[i].mutable_grad() = g;
          d[i].mutable_grad() = g.clone();
        }
        ours.step();
        theirs.step();
        sgd.step();
        sgd_theirs.step();
      }
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
        worst = std::max(worst, (c[i] - d[i]).abs().max().item<double>());
      }
      gap.push_back(worst);
    }
    return torch::tensor(gap, torch::kFloat64);
  })[0];
  CHECK(gaps[0].item<double>() < 1e-5);  // foreach
  CHECK(gaps[1].item<double>() < 1e-5);  // fused
}

TEST_CASE(
    "after a capture that failed, its pool is released, memory freed with another stream's uses "
    "is reused, and random numbers are drawn eagerly") {
  skip_unless_gpus(1);
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 1)
  skip("LibTorch " TORCH_VERSION
       " leaves a failed capture's allocator state as it is (docs/gpu.md)");
#endif
#ifdef USE_C10D_NCCL
  // Two captures that fail: one that a host sync invalidates, and one whose
  // step throws while the capture is valid (as train::optim and train::Metric
  // do under capture). Each step's input is made on a side stream and
  // record_stream'd to the step's, as the loader's copies are: were the
  // allocator still routing to the failed capture's pool, those blocks would
  // never be freed, and the memory reserved would grow by a megabyte a step.
  // They are random numbers made on the GPU: were the CUDA generator still in
  // capture mode, each would throw. And each step makes 32 MiB of scratch:
  // were the capture's pool not released, that much would stay reserved.
  auto results = process_ranks::run(1, [](int, const std::filesystem::path&) {
    const torch::Device gpu(torch::kCUDA, 0);
    torch::manual_seed(0);
    torch::nn::Linear net(16, 4);
    net->to(gpu);
    train::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
    auto inner = step_of(net, optimizer, /*sync_inside=*/false);
    train::CapturedStep* self = nullptr;
    auto failing = [&](bool sync) {
      return [&, sync](const torch::Tensor& x, const torch::Tensor& y) {
        (void)torch::empty({8 << 20}, x.options()).fill_(0);  // 32 MiB
        auto loss = inner(x, y);
        if (sync) {
          (void)loss.item<float>();  // a host sync: invalidates the capture
        } else if (self->capturing()) {
          throw std::runtime_error("refused under capture");
        }
        return loss;
      };
    };
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
    auto reserved = [] {
      c10::cuda::device_synchronize();
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
      return static_cast<double>(stats.reserved_bytes[0].current);  // 0: every pool's
    };
    const auto y = torch::zeros({64, 4}, gpu);
    std::vector<double> found;
    for (bool sync : {true, false}) {
      c10::cuda::CUDACachingAllocator::emptyCache();
      const double before = reserved();
      train::CapturedStep step(failing(sync), train::CaptureOptions().warmup_steps(2));
      self = &step;
      double after_failure = 0;
      for (int i = 0; i < 300; ++i) {
        torch::Tensor block;
        {
          c10::cuda::CUDAStreamGuard guard(side);
          block = torch::randn({256 * 1024}, gpu);  // 1 MiB
        }
        c10::Event made(c10::DeviceType::CUDA);
        made.record(side);
        made.block(c10::cuda::getCurrentCUDAStream(0));
        block.record_stream(c10::cuda::getCurrentCUDAStream(0));
        (void)step(block.narrow(0, 0, 64 * 16).view({64, 16}), y);
        if (i == 20) after_failure = reserved();
      }
      const double grown = reserved() - after_failure;
      c10::cuda::CUDACachingAllocator::emptyCache();
      found.insert(found.end(),
                   {step.captured() ? 1.0 : 0.0, step.eager_reason().empty() ? 0.0 : 1.0, grown,
                    reserved() - before});
    }
    return torch::tensor(found, torch::kFloat64);
  })[0];
  for (int64_t kind : {0, 1}) {
    CAPTURE(kind);                                       // 0: a host sync; 1: the step throws
    CHECK(results[4 * kind].item<double>() == 0.0);      // not captured
    CHECK(results[4 * kind + 1].item<double>() == 1.0);  // and said why
    INFO("reserved bytes grown over 280 steps: " << results[4 * kind + 2].item<double>());
    INFO("reserved bytes kept after the steps: " << results[4 * kind + 3].item<double>());
    CHECK(results[4 * kind + 2].item<double>() < 64.0 * 1024 * 1024);
    CHECK(results[4 * kind + 3].item<double>() < 16.0 * 1024 * 1024);
  }
#endif
}
