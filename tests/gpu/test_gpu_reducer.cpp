// The Reducer on CUDA tensors, ranks as processes (process_ranks.h). One GPU
// cannot hold two NCCL ranks, but Gloo takes CUDA tensors: two ranks on one
// device over Gloo put the reducer's streams under test. NCCL is tested with
// one rank, where it still runs every collective.

#include <train/model.h>
#include <train/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <memory>
#include <vector>

#include "ddp/reducer.h"
#include "doctest_torch.h"
#include "gpu_skip.h"
#include "process_ranks.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);
constexpr int kSteps = 6;
constexpr double kLr = 0.1;
constexpr int64_t kGlobalBatch = 16;

torch::nn::Sequential make_mlp() {
  torch::manual_seed(7);  // the same weights on every rank and in the reference
  return torch::nn::Sequential(torch::nn::Linear(8, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 4));
}

// Step `step`'s global batch, drawn on the CPU so every rank draws the same.
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  auto generator = at::detail::createCPUGenerator(1000 + step);
  auto x = torch::randn({kGlobalBatch, 8}, generator);
  auto y = torch::randn({kGlobalBatch, 4}, generator);
  return {x, y};
}

torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().flatten().cpu());
  return torch::cat(parts);
}

// A stream from CUDA's pool, not the default one: the reducer must order its
// collectives after gradients produced there and .grad after the collectives.
c10::Stream side_stream() {
  return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStreamFromGlobalPool(kGpu);
}

// SGD on `world` ranks, each on its slice of the global batch, forward and
// backward on a side stream; the final parameters of each rank. With
// `split_streams`, every other parameter's gradient accumulator is made on
// another stream (autograd runs an accumulator on the stream it was made on),
// so one bucket holds gradients from two streams.
std::vector<torch::Tensor> train_data_parallel(int world, const train::ModelOptions& options,
                                               bool split_streams = false) {
  return process_ranks::run(world, [&](int rank, const std::filesystem::path& dir) {
    auto group = process_ranks::gloo_group(rank, world, dir);
    auto model = make_mlp();
    model->to(kGpu);
    std::vector<train::compat::NodePtr> accumulators;  // autograd keeps them weakly
    if (split_streams) {
      c10::StreamGuard elsewhere(side_stream());
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); i += 2) {
        accumulators.push_back(torch::autograd::impl::grad_accumulator(params[i]));
      }
    }
    auto prepared = train::detail::replicate(model.ptr(), group, kGpu, options);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr));
    const int64_t per_rank = kGlobalBatch / world;
    c10::StreamGuard on_side(side_stream());
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(step);
      x = x.narrow(0, per_rank * rank, per_rank).to(kGpu, /*non_blocking=*/true);
      y = y.narrow(0, per_rank * rank, per_rank).to(kGpu, /*non_blocking=*/true);
      optimizer.zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      optimizer.step();
    }
    return flat_parameters(*model);
  });
}

// The same steps in one process on the whole batch (a child, as the ranks are).
torch::Tensor train_alone() {
  return process_ranks::run(1, [](int, const std::filesystem::path&) {
    auto model = make_mlp();
    model->to(kGpu);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr));
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(step);
      optimizer.zero_grad();
      torch::mse_loss(model->forward(x.to(kGpu)), y.to(kGpu)).backward();
      optimizer.step();
    }
    return flat_parameters(*model);
  })[0];
}

double largest_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE(
    "2 ranks sharing one GPU over Gloo, on side streams, end where 1 rank on the whole "
    "batch does") {
  skip_unless_gpus(1);
  const auto alone = train_alone();
  // A bucket per parameter: collectives launch mid-backward, from the hooks.
  auto finals =
      train_data_parallel(2, train::ModelOptions().bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6));
  CHECK(largest_gap(finals[0], finals[1]) == 0.0);  // the replicas stay identical
  CHECK(largest_gap(finals[0], alone) < 1e-5);
  // One bucket for everything: the collective launches from the last hook.
  finals = train_data_parallel(2, train::ModelOptions());
  CHECK(largest_gap(finals[0], finals[1]) == 0.0);
  CHECK(largest_gap(finals[0], alone) < 1e-5);
}

TEST_CASE("gradients from two streams in one bucket are waited on before its collective") {
  skip_unless_gpus(1);
  const auto alone = train_alone();
  auto finals = train_data_parallel(2, train::ModelOptions(), /*split_streams=*/true);
  CHECK(largest_gap(finals[0], finals[1]) == 0.0);
  CHECK(largest_gap(finals[0], alone) < 1e-5);
}

TEST_CASE("fp16 and bf16 compression over Gloo with CUDA tensors train as uncompressed does") {
  skip_unless_gpus(1);
  const auto alone = train_alone();
  for (auto compression : {train::Compression::kFP16, train::Compression::kBF16}) {
    CAPTURE(static_cast<int>(compression));
    auto finals = train_data_parallel(2, train::ModelOptions().compression(compression));
    CHECK(largest_gap(finals[0], finals[1]) == 0.0);
    // Half precision's rounding of each averaged gradient, six steps of SGD.
    CHECK(largest_gap(finals[0], alone) < 5e-3);
    CHECK(largest_gap(finals[0], alone) > 0.0);  // the option took effect
  }
}

TEST_CASE("fp16 and bf16 compression on NCCL round each gradient through the half type") {
  skip_unless_gpus(1);
#ifdef USE_C10D_NCCL
  const std::vector<std::pair<train::Compression, torch::ScalarType>> kinds{
      {train::Compression::kFP16, torch::kHalf}, {train::Compression::kBF16, torch::kBFloat16}};
  // In a child, as every CUDA case here: per kind and parameter, whether its
  // gradient went as the half type, and whether it is close to uncompressed.
  auto checks = process_ranks::run(1, [&](int, const std::filesystem::path&) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    c10::cuda::set_device(0);
    auto group = train::compat::make_nccl_group(
        store, 0, 1, kGpu, c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"),
        process_ranks::kCollectiveTimeout);
    std::vector<torch::Tensor> rows;
    for (auto [compression, type] : kinds) {
      auto model = make_mlp();
      model->to(kGpu);
      auto reference = make_mlp();
      reference->to(kGpu);
      // The Reducer itself: prepare_model attaches none to a group of one.
      auto reducer = std::make_shared<train::detail::Reducer>(
          *model, group, train::ModelOptions().compression(compression));
      reducer->install_hooks();
      auto [x, y] = batch(0);
      c10::StreamGuard on_side(side_stream());
      torch::mse_loss(model->forward(x.to(kGpu)), y.to(kGpu)).backward();
      torch::mse_loss(reference->forward(x.to(kGpu)), y.to(kGpu)).backward();
      auto params = model->parameters();
      auto expected = reference->parameters();
      const double tolerance = type == torch::kHalf ? 1e-3 : 1e-2;  // 11 and 8 bits
      for (size_t i = 0; i < params.size(); ++i) {
        auto grad = params[i].grad().cpu();
        rows.push_back(torch::tensor(
            {static_cast<int64_t>(torch::equal(grad, grad.to(type).to(torch::kFloat))),
             static_cast<int64_t>(
                 torch::allclose(grad, expected[i].grad().cpu(), tolerance, 1e-6))}));
      }
    }
    return torch::stack(rows);
  })[0];
  const int64_t per_kind = checks.size(0) / static_cast<int64_t>(kinds.size());
  for (int64_t row = 0; row < checks.size(0); ++row) {
    CAPTURE(static_cast<int>(kinds[row / per_kind].first));
    CAPTURE(row % per_kind);                     // the parameter
    CHECK(checks[row][0].item<int64_t>() == 1);  // it went as the half type
    CHECK(checks[row][1].item<int64_t>() == 1);  // close to the uncompressed gradient
  }
#else
  skip("this LibTorch has no NCCL");
#endif
}
