// The loader on a GPU: a resident dataset's batches, gathered by loader
// threads on the device's default stream, reach a loop that runs on another
// stream whole. Skipped without a CUDA device.

#include <train/data.h>

#include <torch/torch.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <doctest/doctest.h>

#include "gpu_skip.h"
#include "process_ranks.h"

TEST_CASE(
    "a resident dataset's batches gathered by loader threads reach a loop on another stream") {
  skip_unless_gpus(1);
#ifdef USE_C10D_NCCL
  // The default stream is kept busy with large products before each batch,
  // so that the loader threads' gathers queue behind them; the loop reads
  // each batch on a side stream, where without a wait it would read a gather
  // not yet done.
  auto results = process_ranks::run(1, [](int, const std::filesystem::path&) {
    const torch::Device gpu(torch::kCUDA, 0);
    torch::manual_seed(0);
    const int64_t samples = 4096;
    auto data = torch::randn({samples, 1024});
    auto target = torch::arange(samples);
    train::DataLoader<train::TensorDataset> loader(
        train::TensorDataset(data, target).to(gpu),
        train::DistributedSampler(samples,
                                  train::Context(0, 0, 0, 1, 1, gpu, "resident", "/nonexistent"),
                                  /*shuffle=*/true, /*allow_duplicates=*/true),
        train::LoaderOptions().batch_size(64).workers(2).progress(false), gpu);
    const auto busy = torch::randn({2048, 2048}, gpu);
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
    const auto expected_sums = data.sum(1);
    int64_t batches = 0, wrong = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(static_cast<size_t>(epoch));
      c10::cuda::CUDAStreamGuard on_side(side);
      for (auto& batch : loader) {
        {
          c10::cuda::CUDAStreamGuard on_default(c10::cuda::getDefaultCUDAStream(0));
          for (int i = 0; i < 4; ++i) (void)torch::mm(busy, busy);
        }
        auto sums = batch.data.sum(1).cpu();  // on the side stream
        auto wanted = expected_sums.index_select(0, batch.target.cpu());
        if (!torch::allclose(sums, wanted, 1e-4, 1e-3)) ++wrong;
        ++batches;
      }
    }
    return torch::tensor({static_cast<double>(batches), static_cast<double>(wrong)},
                         torch::kFloat64);
  })[0];
  CHECK(results[0].item<double>() == 128.0);  // 2 epochs of 64 batches
  CHECK(results[1].item<double>() == 0.0);
#endif
}
