// Mixed precision on a GPU: float16 autocast on CUDA and GradScaler's fused
// unscale (the kernel CPU runs do not use). Skipped without a CUDA device.

#include <train/amp.h>

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <limits>

#include "core/catch_up.h"
#include "gpu_skip.h"
#include "process_ranks.h"

TEST_CASE(
    "float16 autocast and GradScaler on CUDA: half matmuls, unscaled gradients, a skipped inf") {
  skip_unless_gpus(1);
  // In a child, as every CUDA case here.
  auto checks = process_ranks::run(1, [](int, const std::filesystem::path&) {
    const torch::Device gpu(torch::kCUDA, 0);
    auto a = torch::randn({8, 8}, gpu);
    int64_t half = 0;
    {
      train::Autocast autocast(torch::kCUDA);
      half = torch::mm(a, a).scalar_type() == torch::kHalf;
    }
    auto w = torch::ones({3}, torch::TensorOptions().device(gpu).requires_grad(true));
    torch::optim::SGD optimizer({w}, torch::optim::SGDOptions(0.1));
    train::GradScaler scaler(train::GradScalerOptions().init_scale(1024).growth_interval(1));
    scaler.scale((w * torch::tensor({1.0f, 2.0f, 3.0f}, gpu)).sum()).backward();
    const int64_t stepped = scaler.step(optimizer);
    const int64_t unscaled = w.grad()[2].item<float>() == 3.0f;
    scaler.update();  // grows to 2048
    optimizer.zero_grad();
    const float inf = std::numeric_limits<float>::infinity();
    scaler.scale((w * torch::tensor({inf, 1.0f, 1.0f}, gpu)).sum()).backward();
    const int64_t skipped = !scaler.step(optimizer);
    scaler.update();  // backs off to 1024
    const int64_t backed_off = scaler.get_scale() == 1024;
    return torch::tensor({half, stepped, unscaled, skipped, backed_off});
  })[0];
  CHECK(checks[0].item<int64_t>() == 1);  // matmul in float16
  CHECK(checks[1].item<int64_t>() == 1);  // a good step stepped
  CHECK(checks[2].item<int64_t>() == 1);  // with its gradient unscaled
  CHECK(checks[3].item<int64_t>() == 1);  // the inf step was skipped
  CHECK(checks[4].item<int64_t>() == 1);  // and the scale backed off
}

TEST_CASE("optimizer state sent to a replacement lands on its parameters' CUDA device") {
  skip_unless_gpus(1);
  auto checks = process_ranks::run(1, [](int, const std::filesystem::path&) {
    const torch::Device gpu(torch::kCUDA, 0);
    auto w = torch::ones({4}, torch::TensorOptions().device(gpu).requires_grad(true));
    torch::optim::Adam sent({w}, torch::optim::AdamOptions(0.1));
    w.mutable_grad() = torch::ones_like(w);
    sent.step();
    // What a survivor sends (train::Trainer's and a loop's catch-up), loaded
    // as a replacement loads it.
    const auto bytes = train::detail::saved_optimizer(sent);
    auto v = torch::ones({4}, torch::TensorOptions().device(gpu).requires_grad(true));
    torch::optim::Adam received({v}, torch::optim::AdamOptions(0.1));
    train::detail::load_optimizer(received, bytes, gpu);
    const auto& state =
        static_cast<torch::optim::AdamParamState&>(*received.state().begin()->second);
    return torch::tensor({static_cast<int64_t>(state.exp_avg().is_cuda()),
                          static_cast<int64_t>(state.exp_avg_sq().is_cuda())});
  })[0];
  CHECK(checks[0].item<int64_t>() == 1);
  CHECK(checks[1].item<int64_t>() == 1);
}
