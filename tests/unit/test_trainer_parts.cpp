// The Trainer's parts that need no run: averages of logged values across
// ranks (ranks as threads over Gloo), the naming of step and epoch values,
// ModelCheckpoint's top k, EarlyStopping's count, Metric's combination
// across ranks, and the precision names.

#include <train/callbacks.h>
#include <train/metric.h>
#include <train/trainer.h>

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include "thread_ranks.h"
#include "trainer/metric_log.h"
#include "trainer/trainer_fit.h"

namespace {

using train::detail::MetricLog;

void add(MetricLog& log, const std::string& name, double value, double weight) {
  log.add(name, nullptr, value, weight, /*on_step=*/false, /*on_epoch=*/true, false, true);
}

}  // namespace

TEST_CASE("trainer logs: epoch means are weighted by batch size across ranks, in one average") {
  run_ranks(2, [](int rank, Group group) {
    MetricLog log;
    // Rank 0: batches of 4 and 1 with values 1 and 6; rank 1: one batch of 5 with value 2.
    if (rank == 0) {
      auto one = torch::tensor(1.0);
      log.add("loss", &one, 0, 4, false, true, false, true);
      add(log, "acc", 0.5, 4);
      log.add("loss", nullptr, 6.0, 1, false, true, false, true);
      add(log, "acc", 1.0, 1);
    } else {
      log.add("loss", nullptr, 2.0, 5, false, true, false, true);
      add(log, "acc", 0.0, 5);
    }
    auto values = log.values(group.get(), torch::kCPU, MetricLog::Which::kEpoch);
    // (1*4 + 6*1 + 2*5) / 10, not the mean of the ranks' means (2 and 2).
    CHECK(values.at("loss") == doctest::Approx(2.0));
    CHECK(values.at("acc") == doctest::Approx((0.5 * 4 + 1.0) / 10));
  });
}

TEST_CASE("trainer logs: ranks that log different names all fail, naming each list") {
  std::string error;
  try {
    run_ranks(3, [](int rank, Group group) {
      MetricLog log;
      add(log, "loss", 1, 1);
      if (rank == 2) add(log, "extra", 1, 1);
      log.values(group.get(), torch::kCPU, MetricLog::Which::kEpoch);
    });
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  // Every rank threw (none hangs), with the same message.
  for (const char* rank : {"rank 0: ", "rank 1: ", "rank 2: "}) {
    CHECK(error.find(rank) != std::string::npos);
  }
  INFO(error);
  CHECK(error.find("rank 0 logged [loss], rank 2 [extra, loss]") != std::string::npos);
}

TEST_CASE(
    "trainer logs: step and epoch values keep their names apart, and unsynced values stay local") {
  run_ranks(2, [](int rank, Group group) {
    MetricLog log;
    auto loss = torch::tensor(static_cast<double>(rank + 1));
    log.add("loss", &loss, 0, 2, /*on_step=*/true, /*on_epoch=*/true, /*prog_bar=*/true, true);
    log.add("local", nullptr, rank * 10.0, 1, true, false, false, /*sync_dist=*/false);
    auto step = log.values(group.get(), torch::kCPU, MetricLog::Which::kStep);
    CHECK(step.at("loss_step") == doctest::Approx(1.5));
    CHECK(step.at("local") == doctest::Approx(rank * 10.0));
    auto epoch = log.values(group.get(), torch::kCPU, MetricLog::Which::kEpoch);
    CHECK(epoch.size() == 1);
    CHECK(epoch.at("loss_epoch") == doctest::Approx(1.5));
    CHECK(log.is_prog_bar("loss_step"));
    CHECK_FALSE(log.is_prog_bar("local"));
  });
}

TEST_CASE("trainer logs: a resumed epoch's sums go on from the saved ones") {
  MetricLog before;
  auto value = torch::tensor(0.25);
  before.add("loss", &value, 0, 4, true, true, false, true);
  before.add("val/acc", nullptr, 0.5, 2, false, true, false, true);
  torch::serialize::OutputArchive out;
  before.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  MetricLog after;
  after.load(in);
  after.add("loss", &value, 0, 4, true, true, false, true);
  after.add("val/acc", nullptr, 1.0, 2, false, true, false, true);
  auto values = after.values(nullptr, torch::kCPU, MetricLog::Which::kEpoch);
  CHECK(values.at("loss_epoch") == doctest::Approx(0.25));
  CHECK(values.at("val/acc") == doctest::Approx(0.75));

  // Resumed at the epoch's last batch: nothing is logged again, the sums stand.
  MetricLog untouched;
  torch::serialize::InputArchive again;
  bytes.seekg(0);
  again.load_from(bytes);
  untouched.load(again);
  auto both = untouched.values(nullptr, torch::kCPU, MetricLog::Which::kBoth);
  CHECK(both.at("loss_epoch") == doctest::Approx(0.25));
  CHECK(both.at("val/acc") == doctest::Approx(0.5));
  CHECK(both.count("loss_step") == 0);  // no step since the resume
}

TEST_CASE("model checkpoint: the top k by the monitored value, and the latest without one") {
  train::ModelCheckpoint best(
      train::ModelCheckpointOptions().monitor("val_loss").mode(train::Mode::kMin).save_top_k(2));
  CHECK(best.consider(1, 5.0));
  CHECK(best.consider(2, 3.0));
  CHECK_FALSE(best.consider(3, 6.0));  // worse than both kept
  CHECK(best.consider(4, 4.0));        // beats 5
  CHECK(std::isnan(train::ModelCheckpoint().best_model_score()));
  CHECK(best.best_model_score() == 3.0);
  CHECK((best.best_k_models() == std::vector<std::pair<int64_t, double>>{{2, 3.0}, {4, 4.0}}));

  train::ModelCheckpoint latest(train::ModelCheckpointOptions().save_top_k(2));
  for (int64_t step : {1, 2, 3}) CHECK(latest.consider(step, std::nan("")));
  CHECK(latest.best_k_models().front().first == 3);
  CHECK(latest.best_k_models().size() == 2);

  CHECK_FALSE(best.consider(5, std::nan("")));  // a diverged value never displaces a kept one
  train::ModelCheckpoint none(train::ModelCheckpointOptions().monitor("x").save_top_k(0));
  CHECK_FALSE(none.consider(1, 1.0));
  CHECK_THROWS_AS(train::ModelCheckpoint(train::ModelCheckpointOptions().save_top_k(-2)),
                  std::invalid_argument);
}

TEST_CASE("early stopping: patience counts checks without an improvement larger than min_delta") {
  train::EarlyStopping stop(train::EarlyStoppingOptions()
                                .monitor("acc")
                                .mode(train::Mode::kMax)
                                .patience(2)
                                .min_delta(0.01));
  CHECK_FALSE(stop.update(0.5));
  CHECK_FALSE(stop.update(0.505));  // within min_delta: no improvement
  CHECK(stop.wait_count() == 1);
  CHECK_FALSE(stop.update(0.6));  // improvement resets the count
  CHECK(stop.wait_count() == 0);
  CHECK_FALSE(stop.update(0.55));
  CHECK(stop.update(0.59));
  CHECK(stop.best_score() == 0.6);
  train::EarlyStopping finite(train::EarlyStoppingOptions().monitor("loss").patience(5));
  CHECK_FALSE(finite.update(1.0));
  CHECK(finite.update(std::nan("")));  // NaN stops at once, as Lightning's check_finite
  CHECK_THROWS_AS(train::EarlyStopping(train::EarlyStoppingOptions()), std::invalid_argument);
  CHECK_THROWS_AS(train::EarlyStopping(train::EarlyStoppingOptions().monitor("x").patience(-1)),
                  std::invalid_argument);
}

namespace {

// Every state kind at once: the sum, max and min of the values and all of them.
class Everything : public train::Metric {
 public:
  Everything() {
    add_state("sum", torch::zeros({2}), train::Reduction::kSum);
    add_state("max", torch::full({}, -1e9), train::Reduction::kMax);
    add_state("min", torch::full({}, 1e9), train::Reduction::kMin);
    add_state("all", torch::zeros({0}), train::Reduction::kCat);
  }
  void update(const torch::Tensor& values) {
    state("sum") = state("sum") + torch::stack({values.sum(), torch::tensor(1.0 * values.numel())});
    state("max") = torch::maximum(state("max"), values.max());
    state("min") = torch::minimum(state("min"), values.min());
    append("all", values);
  }

 protected:
  torch::Tensor compute_value() override {
    return torch::cat({state("sum"), state("max").reshape({1}), state("min").reshape({1}),
                       std::get<0>(state("all").sort())});
  }
};

}  // namespace

TEST_CASE("metric: states combine across ranks once, at compute, and stay local afterwards") {
  run_ranks(2, [](int rank, Group group) {
    Everything metric;
    metric.set_process_group(group);
    // Rank 0 saw 1, 2, 3; rank 1 saw 10 (a different number of values to gather).
    metric.update(rank == 0 ? torch::tensor({1.0f, 2.0f, 3.0f}) : torch::tensor({10.0f}));
    auto value = metric.compute();
    CHECK(
        (torch::equal(value, torch::tensor({16.0f, 4.0f, 10.0f, 1.0f, 1.0f, 2.0f, 3.0f, 10.0f}))));
    metric.reset();
    metric.update(torch::tensor({5.0f}));
    CHECK((torch::equal(metric.compute(), torch::tensor({10.0f, 2.0f, 5.0f, 5.0f, 5.0f, 5.0f}))));

    train::Accuracy accuracy;
    accuracy.set_process_group(group);
    // Rank 0: 2 of 2 right; rank 1: 1 of 3.
    auto scores = rank == 0 ? torch::tensor({{0.9, 0.1}, {0.2, 0.8}})
                            : torch::tensor({{0.9, 0.1}, {0.9, 0.1}, {0.9, 0.1}});
    auto target = rank == 0 ? torch::tensor({0, 1}) : torch::tensor({0, 1, 1});
    accuracy.update(scores, target);
    CHECK(accuracy.compute().item<double>() == doctest::Approx(3.0 / 5));
  });
}

TEST_CASE("metric: ranks holding different states fail with the layouts") {
  CHECK_THROWS_WITH_AS(run_ranks(2,
                                 [](int rank, Group group) {
                                   train::Metric* metric = nullptr;
                                   train::Accuracy accuracy;
                                   train::MeanMetric mean;
                                   metric = rank == 0 ? static_cast<train::Metric*>(&accuracy)
                                                      : static_cast<train::Metric*>(&mean);
                                   metric->set_process_group(group);
                                   metric->compute();
                                 }),
                       doctest::Contains("states differ from rank 0's"), std::runtime_error);
}

TEST_CASE("trainer options: precision names and values out of range") {
  CHECK(train::precision_from_string("bf16") == train::Precision::kBF16Mixed);
  CHECK(train::precision_from_string("16-mixed") == train::Precision::kFP16Mixed);
  CHECK(train::precision_from_string("32") == train::Precision::k32);
  CHECK_THROWS_WITH_AS(train::precision_from_string("8"), doctest::Contains("bf16-mixed"),
                       std::invalid_argument);
  CHECK_THROWS_AS(train::Trainer(train::TrainerOptions().accumulate_grad_batches(0)),
                  std::invalid_argument);
  CHECK_THROWS_AS(train::Trainer(train::TrainerOptions(), {nullptr}), std::invalid_argument);
  CHECK_THROWS_AS(
      train::Trainer(train::TrainerOptions(), {std::make_shared<train::ReportCallback>(),
                                               std::make_shared<train::ReportCallback>()}),
      std::invalid_argument);
  // Two checkpoint callbacks with different monitors have different keys.
  CHECK_NOTHROW(train::Trainer(
      train::TrainerOptions(),
      {std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions().monitor("a")),
       std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions().monitor("b"))}));
}

TEST_CASE(
    "trainer clipping: the norm clipped on the device is LibTorch's clip_grad_norm_, bit for bit") {
  torch::manual_seed(3);
  for (double max_norm : {0.05, 1e6}) {  // clipped, and left alone
    CAPTURE(max_norm);
    std::vector<torch::Tensor> mine, libtorch;
    for (auto shape : {std::vector<int64_t>{7, 5}, {5}, {3, 2, 2}}) {
      auto p = torch::randn(shape).requires_grad_(true);
      p.mutable_grad() = torch::randn(shape);
      auto q = p.detach().clone().requires_grad_(true);
      q.mutable_grad() = p.grad().clone();
      mine.push_back(p);
      libtorch.push_back(q);
    }
    auto no_grad = torch::randn({2}).requires_grad_(true);  // skipped by both
    mine.push_back(no_grad);
    libtorch.push_back(no_grad);
    train::detail::clip_grad_norm(mine, max_norm);
    torch::nn::utils::clip_grad_norm_(libtorch, max_norm);
    for (size_t i = 0; i + 1 < mine.size(); ++i)
      CHECK(torch::equal(mine[i].grad(), libtorch[i].grad()));
  }
}
