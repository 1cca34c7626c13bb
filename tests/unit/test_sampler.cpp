#include <train/data.h>

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

// train::DistributedSampler on its own: rank contexts made by hand, no workers.

namespace {

train::Context rank_of(int rank, int world) {
  return train::Context(rank, rank, 0, world, world, torch::kCPU, "sampler", "/nonexistent");
}

std::vector<size_t> drain(train::DistributedSampler& sampler, size_t batch = 4) {
  std::vector<size_t> all;
  while (auto indices = sampler.next(batch))
    all.insert(all.end(), indices->begin(), indices->end());
  return all;
}

}  // namespace

TEST_CASE("sampler: shuffled, every rank strides one permutation of the whole dataset") {
  // 11 samples on 3 ranks, padded to 12 by repeating the permutation's first.
  auto permutation = torch::randperm(11, at::detail::createCPUGenerator(5 + 2), torch::kLong);
  std::multiset<size_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    train::DistributedSampler sampler(11, rank_of(rank, 3), /*shuffle=*/true,
                                      /*allow_duplicates=*/true, /*seed=*/5);
    sampler.set_epoch(2);
    sampler.reset();
    auto mine = drain(sampler);
    REQUIRE(mine.size() == 4);
    for (size_t k = 0; k < mine.size(); ++k) {
      CHECK(mine[k] == static_cast<size_t>(permutation[(rank + 3 * k) % 11].item<int64_t>()));
    }
    seen.insert(mine.begin(), mine.end());
  }
  CHECK(std::set<size_t>(seen.begin(), seen.end()).size() == 11);
  CHECK(seen.count(static_cast<size_t>(permutation[0].item<int64_t>())) == 2);
}

TEST_CASE("sampler: in order, each rank reads a block, and without duplicates the rest is cut") {
  train::DistributedSampler first(10, rank_of(0, 3), false, false);
  train::DistributedSampler last(10, rank_of(2, 3), false, false);
  CHECK(drain(first) == std::vector<size_t>{0, 1, 2});
  CHECK(drain(last) == std::vector<size_t>{6, 7, 8});
  CHECK(last.local_size() == 3);
  train::DistributedSampler padded(10, rank_of(2, 3), false, true);
  CHECK(drain(padded) == std::vector<size_t>{8, 9, 0, 1});
  train::DistributedSampler empty(0, rank_of(1, 3), true, true);
  CHECK(drain(empty).empty());
}

TEST_CASE("sampler: a saved position survives load and the loader's reset at the epoch's start") {
  train::DistributedSampler sampler(100, rank_of(1, 2), true, true);
  sampler.set_epoch(3);
  sampler.reset();
  const auto whole = drain(sampler);
  sampler.reset();
  (void)sampler.next(8);
  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  train::DistributedSampler restored(100, rank_of(1, 2), true, true);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  restored.load(in);
  restored.reset();  // what the loader does as the epoch begins
  CHECK(drain(restored) == std::vector<size_t>(whole.begin() + 8, whole.end()));
  restored.reset();  // the next epoch starts from the first
  CHECK(drain(restored) == whole);
}

namespace {

// A per-sample dataset over the same tensors as a TensorDataset: what the
// loader made before TensorDataset existed.
struct PerSample : torch::data::datasets::Dataset<PerSample> {
  PerSample(torch::Tensor data, torch::Tensor target)
      : data(std::move(data)), target(std::move(target)) {}
  torch::Tensor data, target;
  torch::data::Example<> get(size_t i) override {
    return {data[static_cast<int64_t>(i)], target[static_cast<int64_t>(i)]};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(data.size(0)); }
};

}  // namespace

TEST_CASE(
    "TensorDataset: the loader gathers the batches a per-sample dataset gives, by the same "
    "indices") {
  auto data = torch::randn({103, 2, 3});
  auto target = torch::arange(103);
  for (size_t workers : {0, 2}) {
    for (int rank = 0; rank < 3; ++rank) {
      CAPTURE(workers);
      CAPTURE(rank);
      const auto options = train::LoaderOptions().batch_size(8).workers(workers).progress(false);
      auto sampler = [&] {
        return train::DistributedSampler(103, rank_of(rank, 3), true, true, 5);
      };
      train::DataLoader<train::TensorDataset> gathered(train::TensorDataset(data, target),
                                                       sampler(), options, torch::kCPU);
      train::DataLoader<PerSample> stacked(PerSample(data, target), sampler(), options,
                                           torch::kCPU);
      CHECK(gathered.workers() == workers);
      for (size_t epoch : {0, 1}) {
        gathered.set_epoch(epoch);
        stacked.set_epoch(epoch);
        std::vector<torch::data::Example<>> expected;
        for (auto& batch : stacked) expected.push_back(batch);
        size_t i = 0;
        for (auto& batch : gathered) {
          REQUIRE(i < expected.size());
          CHECK(torch::equal(batch.data, expected[i].data));
          CHECK(torch::equal(batch.target, expected[i].target));
          ++i;
        }
        CHECK(i == expected.size());
        CHECK(i == gathered.size());
      }
    }
  }
}

TEST_CASE("TensorDataset: mismatched tensors and an index past the end are refused") {
  CHECK_THROWS_AS(train::TensorDataset(torch::zeros({3, 2}), torch::zeros({4})),
                  std::invalid_argument);
  CHECK_THROWS_AS(train::TensorDataset(torch::zeros({}), torch::zeros({})), std::invalid_argument);
  CHECK_THROWS_AS(train::TensorDataset(torch::Tensor(), torch::zeros({3})), std::invalid_argument);
  train::TensorDataset dataset(torch::zeros({3, 2}), torch::zeros({3}));
  const std::vector<size_t> past{1, 3};
  CHECK_THROWS_AS(dataset.get_batch(past), std::out_of_range);
  const std::vector<size_t> fine{2, 0};
  CHECK(dataset.get_batch(fine).data.sizes() == torch::IntArrayRef{2, 2});
}

TEST_CASE("loader threads: none by default on the CPU") {
  train::DataLoader<train::TensorDataset> loader(
      train::TensorDataset(torch::zeros({4, 1}), torch::zeros({4})),
      train::DistributedSampler(4, rank_of(0, 1), false, true), train::LoaderOptions(),
      torch::kCPU);
  CHECK(loader.workers() == 0);
}

TEST_CASE("max_batches ends each epoch after that many batches, the first ones, and counts them") {
  auto data = torch::arange(40).reshape({40, 1});
  auto target = torch::arange(40);
  for (size_t workers : {0, 2}) {
    CAPTURE(workers);
    const auto options = train::LoaderOptions().batch_size(4).workers(workers).progress(false);
    auto sampler = [&] { return train::DistributedSampler(40, rank_of(1, 2), true, true, 3); };
    train::DataLoader<train::TensorDataset> all(train::TensorDataset(data, target), sampler(),
                                                options, torch::kCPU);
    train::DataLoader<train::TensorDataset> some(train::TensorDataset(data, target), sampler(),
                                                 train::LoaderOptions(options).max_batches(3),
                                                 torch::kCPU);
    CHECK(all.size() == 5);
    CHECK(some.size() == 3);
    for (size_t epoch : {0, 1}) {  // each epoch starts again, in its own order
      all.set_epoch(epoch);
      some.set_epoch(epoch);
      std::vector<torch::Tensor> expected;
      for (auto& batch : all) expected.push_back(batch.data);
      size_t i = 0;
      for (auto& batch : some) {
        REQUIRE(i < 3);
        CHECK(torch::equal(batch.data, expected[i++]));
      }
      CHECK(i == 3);
    }
  }
  // More than there are: all of them.
  train::DataLoader<train::TensorDataset> more(
      train::TensorDataset(data, target), train::DistributedSampler(40, rank_of(0, 1), false, true),
      train::LoaderOptions().batch_size(16).max_batches(10).progress(false), torch::kCPU);
  CHECK(more.size() == 3);
  size_t batches = 0;
  for (auto& batch : more) batches += batch.data.size(0) > 0;
  CHECK(batches == 3);
}

TEST_CASE(
    "epochs(): each epoch set before its batches, as set_epoch in a loop, and batches_done "
    "counts") {
  auto data = torch::arange(24).reshape({24, 1});
  auto target = torch::arange(24);
  const auto options = train::LoaderOptions().batch_size(4).progress(false);
  auto loader = [&] {
    return train::DataLoader<train::TensorDataset>(
        train::TensorDataset(data, target),
        train::DistributedSampler(24, rank_of(0, 2), true, true, 7), options, torch::kCPU);
  };
  auto by_hand = loader();
  auto by_epochs = loader();
  std::vector<size_t> seen;
  for (size_t epoch : by_epochs.epochs(1, 4)) {
    seen.push_back(epoch);
    by_hand.set_epoch(epoch);
    std::vector<torch::Tensor> expected;
    for (auto& batch : by_hand) expected.push_back(batch.data);
    REQUIRE(expected.size() == 3);
    size_t i = 0;
    for (auto& batch : by_epochs) {
      CHECK(by_epochs.batches_done() == i);  // the index of the batch being trained
      REQUIRE(i < expected.size());
      CHECK(torch::equal(batch.data, expected[i++]));
    }
    CHECK(by_epochs.batches_done() == 3);
  }
  CHECK(seen == std::vector<size_t>{1, 2, 3});
  // Resumed part-way, the count starts at the batches skipped.
  by_hand.set_epoch(5);
  CHECK(by_hand.resume(2));
  size_t batches = 0;
  for (auto& batch : by_hand) batches += batch.data.size(0) > 0;
  CHECK(batches == 1);
  CHECK(by_hand.batches_done() == 3);
  // An empty range runs no epoch.
  size_t none = 0;
  for (size_t epoch : by_epochs.epochs(2, 2)) none += epoch + 1;
  CHECK(none == 0);
}

TEST_CASE("a loader of batch size 0 is refused") {
  CHECK_THROWS_AS(train::DataLoader<train::TensorDataset>(
                      train::TensorDataset(torch::zeros({4, 1}), torch::zeros({4})),
                      train::DistributedSampler(4, rank_of(0, 1), false, true),
                      train::LoaderOptions().batch_size(0), torch::kCPU),
                  std::invalid_argument);
}

TEST_CASE("TensorDataset: tensors that require grad give batches without autograd history") {
  auto data = torch::randn({12, 3}, torch::requires_grad());
  auto target = torch::arange(12);
  for (size_t workers : {0, 2}) {
    CAPTURE(workers);
    train::DataLoader<train::TensorDataset> loader(
        train::TensorDataset(data, target),
        train::DistributedSampler(12, rank_of(0, 1), false, true),
        train::LoaderOptions().batch_size(5).workers(workers).progress(false), torch::kCPU);
    int64_t rows = 0;
    for (auto& batch : loader) {
      CHECK_FALSE(batch.data.requires_grad());
      CHECK(torch::equal(batch.data, data.detach().index_select(0, batch.target)));
      rows += batch.data.size(0);
    }
    CHECK(rows == 12);
  }
}

TEST_CASE(
    "TensorDataset::to: a max_fraction not in 0 to 1 is refused, and a device it cannot read") {
  train::TensorDataset dataset(torch::zeros({3, 2}), torch::zeros({3}));
  for (double fraction : {0.0, -1.0, 1.5, std::nan("")}) {
    CAPTURE(fraction);
    CHECK_THROWS_AS(dataset.to(torch::kCPU, fraction), std::invalid_argument);
  }
  CHECK(dataset.to(torch::kCPU, 1.0).size() == 3);
  if (!torch::cuda::is_available()) {
    // CPU-only LibTorch, or no GPU: said as a std::runtime_error, not LibTorch's c10::Error.
    CHECK_THROWS_AS(dataset.to(torch::Device(torch::kCUDA, 0)), std::runtime_error);
  }
}

TEST_CASE("a second begin() while an earlier iterator is in use leaves that one reading") {
  auto data = torch::arange(64).reshape({64, 1});
  for (size_t workers : {0, 2}) {
    CAPTURE(workers);
    train::DataLoader<train::TensorDataset> loader(
        train::TensorDataset(data, torch::arange(64)),
        train::DistributedSampler(64, rank_of(0, 1), false, true),
        train::LoaderOptions().batch_size(4).workers(workers).progress(false), torch::kCPU);
    auto first = loader.begin();
    CHECK((*first).data.size(0) == 4);
    size_t inner = 0;
    for (auto& batch : loader) {  // a nested pass: another inner loader
      inner += batch.data.size(0) > 0;
      if (inner == 2) break;
    }
    // The first pass's loader is still there to read from (the sampler's
    // position is shared, so which batches come is not said).
    ++first;
    CHECK((*first).data.size(0) == 4);
    CHECK(inner == 2);
  }
}

TEST_CASE("resume() for an epoch that another set_epoch replaced skips nothing there") {
  auto data = torch::arange(40).reshape({40, 1});
  train::DataLoader<train::TensorDataset> loader(
      train::TensorDataset(data, torch::arange(40)),
      train::DistributedSampler(40, rank_of(0, 1), true, true, 3),
      train::LoaderOptions().batch_size(4).max_batches(5).progress(false), torch::kCPU);
  train::DataLoader<train::TensorDataset> fresh(
      train::TensorDataset(data, torch::arange(40)),
      train::DistributedSampler(40, rank_of(0, 1), true, true, 3),
      train::LoaderOptions().batch_size(4).max_batches(5).progress(false), torch::kCPU);
  loader.set_epoch(2);
  CHECK(loader.resume(3));
  loader.set_epoch(3);
  fresh.set_epoch(3);
  std::vector<torch::Tensor> expected;
  for (auto& batch : fresh) expected.push_back(batch.data);
  REQUIRE(expected.size() == 5);
  size_t i = 0;
  for (auto& batch : loader) {
    CHECK(loader.batches_done() == i);
    REQUIRE(i < expected.size());
    CHECK(torch::equal(batch.data, expected[i++]));
  }
  CHECK(i == 5);
}

TEST_CASE(
    "a sampler saved while loader threads read ahead holds what the train function was handed") {
  // 64 samples on rank 1 of 2: 32 of its own, in batches of 4.
  auto data = torch::arange(64).reshape({64, 1});
  auto target = torch::arange(64);
  for (size_t workers : {0, 2}) {
    CAPTURE(workers);
    const auto options = train::LoaderOptions().batch_size(4).workers(workers).progress(false);
    train::DistributedSampler sampler(64, rank_of(1, 2), true, true, 3);
    train::DataLoader<train::TensorDataset> loader(train::TensorDataset(data, target), sampler,
                                                   options, torch::kCPU);
    loader.set_epoch(2);
    std::vector<int64_t> handed;
    std::stringstream bytes;
    for (auto& batch : loader) {
      for (int64_t i = 0; i < batch.data.size(0); ++i)
        handed.push_back(batch.data[i][0].item<int64_t>());
      if (handed.size() == 12) {  // 3 batches: save here, in the loop, as a checkpoint does
        torch::serialize::OutputArchive out;
        sampler.save(out);
        out.save_to(bytes);
      }
    }
    REQUIRE(handed.size() == 32);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    torch::Tensor position;
    in.read("sample_index_", position, /*is_buffer=*/true);
    CHECK(position.item<int64_t>() == 12);
    // Loaded into a fresh loader's sampler: the epoch goes on at the 4th batch.
    train::DistributedSampler restored(64, rank_of(1, 2), true, true, 3);
    restored.load(in);
    train::DataLoader<train::TensorDataset> again(train::TensorDataset(data, target), restored,
                                                  options, torch::kCPU);
    again.set_epoch(2);
    std::vector<int64_t> rest;
    for (auto& batch : again) {
      for (int64_t i = 0; i < batch.data.size(0); ++i)
        rest.push_back(batch.data[i][0].item<int64_t>());
    }
    CHECK(rest == std::vector<int64_t>(handed.begin() + 12, handed.end()));
  }
}
