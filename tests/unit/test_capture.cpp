// train::CapturedStep where no CUDA graph can be captured: every step runs
// eagerly, computes what the step function computes, and says why.

#include <train/capture.h>
#include <train/optim.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "doctest_torch.h"

TEST_CASE("CapturedStep on the CPU runs every step eagerly, as the step function alone would") {
  auto run = [](bool captured_step) {
    torch::manual_seed(3);
    torch::nn::Linear net(4, 2);
    train::optim::Adam optimizer(net->parameters(), train::optim::AdamOptions(0.05));
    auto step = [&](const torch::Tensor& x, const torch::Tensor& y) {
      auto loss = torch::mse_loss(net->forward(x), y);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      return loss;
    };
    train::CapturedStep captured(step, train::CaptureOptions().warmup_steps(2));
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) {
      auto x = torch::full({8, 4}, 0.1 * i);
      auto y = torch::ones({8, 2});
      losses.push_back((captured_step ? captured(x, y) : step(x, y)).item<double>());
    }
    if (captured_step) {
      CHECK_FALSE(captured.captured());
      CHECK(captured.eager_reason().find("the batch is on cpu") != std::string::npos);
    }
    return losses;
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("CapturedStep: off says so, a bad warm-up or an empty step is refused, throws pass") {
  auto x = torch::zeros({2, 2});
  train::CapturedStep off([](const torch::Tensor& a, const torch::Tensor&) { return a.sum(); },
                          train::CaptureOptions().enabled(false));
  CHECK(off(x, x).item<double>() == 0);
  CHECK(off.eager_reason() == "capture is off (CaptureOptions::enabled)");
  CHECK_THROWS_AS(
      train::CapturedStep([](const torch::Tensor& a, const torch::Tensor&) { return a; },
                          train::CaptureOptions().warmup_steps(0)),
      std::invalid_argument);
  CHECK_THROWS_AS(train::CapturedStep(nullptr), std::invalid_argument);
  train::CapturedStep throwing([](const torch::Tensor&, const torch::Tensor&) -> torch::Tensor {
    throw std::runtime_error("from the step");
  });
  CHECK_THROWS_WITH(throwing(x, x), "from the step");
}
