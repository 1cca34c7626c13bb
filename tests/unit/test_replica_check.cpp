#include <train/model.h>

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ddp/reducer.h"
#include "ddp/replica_check.h"
#include "doctest_torch.h"
#include "thread_ranks.h"

// That every rank holds the same model: the same parameters at prepare_model
// (replicate), the same values at each report (check_divergence). Ranks are
// threads (thread_ranks.h); each records what it threw, and the checks run once
// every rank has been joined.

namespace {

constexpr int64_t kIn = 4;
constexpr int64_t kOut = 3;

// Names "0.weight", "0.bias", "2.weight", "2.bias"; random weights, different
// on every rank until replicate broadcasts rank 0's.
torch::nn::Sequential make_mlp(int64_t hidden = 5, bool last_bias = true) {
  return torch::nn::Sequential(
      torch::nn::Linear(kIn, hidden), torch::nn::Tanh(),
      torch::nn::Linear(torch::nn::LinearOptions(hidden, kOut).bias(last_bias)));
}

// A different batch for every rank and step.
torch::Tensor input(int rank, int step) {
  auto ramp = torch::arange(6 * kIn, torch::kFloat) * (0.3 * (rank + 1)) + step;
  return torch::cos(ramp).reshape({6, kIn});
}

void train_steps(torch::nn::Sequential& model, int rank, int steps) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    model->forward(input(rank, step)).pow(2).mean().backward();
    optimizer.step();
  }
}

// Runs `rank_body` on `world` ranks and returns what each threw ("" for none).
std::vector<std::string> errors_of(int world,
                                   const std::function<void(int rank, Group group)>& rank_body) {
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int rank, Group group) {
    try {
      rank_body(rank, std::move(group));
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  return errors;
}

train::detail::ModelEntry parameter(const std::string& name, const std::string& shape) {
  return {"parameter '" + name + "'",
          {{"shape", shape}, {"dtype", "Float"}, {"requires_grad", "true"}}};
}

}  // namespace

TEST_CASE("a model's description lists its options, parameters and buffers, and reads back") {
  auto model = torch::nn::Sequential(torch::nn::Linear(kIn, 2), torch::nn::BatchNorm1d(2));
  model[0]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
  auto entries = train::detail::describe_model(
      *model, train::ModelOptions().bucket_cap_mb(0.5).compression(train::Compression::kFP16));
  auto text = train::detail::encode_entries(entries);
  CHECK((train::detail::decode_entries(text) == entries));  // not printable
  CHECK(text.find("ModelOptions' bucket_cap_mb\t=0.5\n") != std::string::npos);
  CHECK(text.find("ModelOptions' compression\t=fp16\n") != std::string::npos);
  CHECK(text.find("parameter '0.weight'\tshape=[2, 4]\tdtype=Float\trequires_grad=true\n") !=
        std::string::npos);
  CHECK(text.find("parameter '0.bias'\tshape=[2]\tdtype=Float\trequires_grad=false\n") !=
        std::string::npos);
  CHECK(text.find("buffer '1.num_batches_tracked'\tshape=[]\tdtype=Long\n") != std::string::npos);
}

TEST_CASE("the first difference between two ranks' models names what differs and where") {
  using train::detail::first_difference;
  const std::vector<train::detail::ModelEntry> rank0{parameter("a", "[2]"), parameter("b", "[3]")};
  CHECK(first_difference(rank0, rank0, 1).empty());
  CHECK(first_difference(rank0, {parameter("a", "[2]"), parameter("b", "[4]")}, 1) ==
        "parameter 'b' has shape [3] on rank 0 and [4] on rank 1");
  CHECK(first_difference(rank0, {parameter("a", "[2]")}, 2) == "rank 2 has no parameter 'b'");
  CHECK(first_difference(rank0, {parameter("b", "[3]")}, 1) == "rank 1 has no parameter 'a'");
  CHECK(first_difference(rank0, {parameter("a", "[2]"), parameter("c", "[3]")}, 1) ==
        "rank 1 has no parameter 'b'");
  CHECK(first_difference({parameter("a", "[2]")}, rank0, 3) ==
        "rank 3 has parameter 'b', which rank 0 has not");
  CHECK(first_difference(rank0, {parameter("b", "[3]"), parameter("a", "[2]")}, 1) ==
        "the order differs: rank 0 has parameter 'a' where rank 1 has parameter 'b'");
  const std::vector<train::detail::ModelEntry> on{
      {"ModelOptions' broadcast_buffers", {{"", "true"}}}};
  const std::vector<train::detail::ModelEntry> off{
      {"ModelOptions' broadcast_buffers", {{"", "false"}}}};
  CHECK(first_difference(on, off, 1) ==
        "ModelOptions' broadcast_buffers is true on rank 0 and false on rank 1");
}

TEST_CASE("prepare_model fails on every rank when the ranks built different models") {
  // Rank 1 differs; ranks 0 and 2 agree. Every rank must throw the same error
  // rather than wait in a broadcast that pairs unrelated tensors.
  const int world = 3;
  std::string expected;
  std::function<torch::nn::Sequential(int)> build = [](int) { return make_mlp(); };
  train::ModelOptions rank1_options;
  SUBCASE("a shape") {
    build = [](int rank) { return make_mlp(rank == 1 ? 6 : 5); };
    expected =
        "rank 1's model differs from rank 0's: parameter '0.weight' has shape [5, 4] on "
        "rank 0 and [6, 4] on rank 1";
  }
  SUBCASE("a missing parameter") {
    build = [](int rank) { return make_mlp(5, /*last_bias=*/rank != 1); };
    expected = "rank 1's model differs from rank 0's: rank 1 has no parameter '2.bias'";
  }
  SUBCASE("the options") {
    rank1_options.find_unused_parameters(true);
    expected =
        "rank 1's model differs from rank 0's: ModelOptions' find_unused_parameters is "
        "false on rank 0 and true on rank 1";
  }
  auto errors = errors_of(world, [&](int rank, Group group) {
    auto model = build(rank);
    train::detail::replicate(model.ptr(), group, torch::kCPU,
                             rank == 1 ? rank1_options : train::ModelOptions());
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].find("prepare_model: " + expected) != std::string::npos);
    CHECK(errors[rank].find("(ranks that differ from rank 0: 1)") != std::string::npos);
  }
}

TEST_CASE("replicas that trained in step pass the divergence check") {
  const int world = 3;
  auto errors = errors_of(world, [&](int rank, Group group) {
    torch::manual_seed(rank);  // different initial weights: replicate makes them equal
    auto model = make_mlp();
    auto prepared = train::detail::replicate(model.ptr(), group, torch::kCPU, {});
    train_steps(model, rank, 3);
    train::detail::check_divergence({prepared}, *group, "train::report");
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank] == "");
  }
}

TEST_CASE("a parameter changed on one rank fails the divergence check on every rank") {
  const int world = 3;
  bool check = true;
  SUBCASE("checked") {}
  SUBCASE("with check_divergence(false)") { check = false; }
  auto errors = errors_of(world, [&](int rank, Group group) {
    auto model = make_mlp();
    auto prepared = train::detail::replicate(model.ptr(), group, torch::kCPU,
                                             train::ModelOptions().check_divergence(check));
    train_steps(model, rank, 2);
    if (rank == 1) {  // one bit of one element: the smallest divergence there is
      torch::NoGradGuard no_grad;
      auto bias = model[2]->as<torch::nn::Linear>()->bias;
      const float value = bias[1].item<float>();
      bias[1] = std::nextafter(value, std::numeric_limits<float>::infinity());
    }
    train::detail::check_divergence({prepared}, *group, "train::report");
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    if (!check) {
      CHECK(errors[rank] == "");
      continue;
    }
    CHECK(errors[rank].find("train::report: the replicas have diverged: parameter '2.bias' of "
                            "the prepared model holds other values on rank 1 than on rank 0") !=
          std::string::npos);
    CHECK(errors[rank].find("check_divergence(false)") != std::string::npos);
  }
}

TEST_CASE("the divergence check names the model and every rank that differs") {
  const int world = 3;
  auto errors = errors_of(world, [&](int rank, Group group) {
    auto first = make_mlp();
    auto second = make_mlp();
    std::vector<train::detail::PreparedModel> prepared{
        train::detail::replicate(first.ptr(), group, torch::kCPU, {}),
        train::detail::replicate(second.ptr(), group, torch::kCPU, {})};
    if (rank != 0) {
      torch::NoGradGuard no_grad;
      second[0]->as<torch::nn::Linear>()->weight[0][0].add_(rank);
    }
    train::detail::check_divergence(prepared, *group, "train::report");
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].find("parameter '0.weight' of prepared model 2 of 2 (in prepare_model "
                            "order) holds other values on ranks 1, 2 than on rank 0") !=
          std::string::npos);
  }
}

TEST_CASE("a bit hash is the same for equal tensors and changes with any bit or order") {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt8}) {
    CAPTURE(dtype);
    auto t = (torch::arange(1000, torch::kFloat) / 7).sin().mul(100).to(dtype);
    const auto hash = train::detail::bit_hash(t);
    CHECK(train::detail::bit_hash(t.clone()) == hash);
    // The same values in another layout hash the same.
    CHECK(train::detail::bit_hash(t.reshape({25, 40}).t().contiguous().t()) == hash);
    auto changed = t.clone();
    changed[500] = changed[499];
    CHECK(train::detail::bit_hash(changed) != hash);
    // Two elements swapped: what a sum of the elements' bits could not see.
    auto swapped = t.clone();
    swapped[10] = t[20];
    swapped[20] = t[10];
    CHECK(train::detail::bit_hash(swapped) != hash);
  }
  // Changes that cancel in a sum of 32-bit words: one word up by 1, another down by 1.
  auto ints = torch::arange(64, torch::kInt);
  auto cancelled = ints.clone();
  cancelled[3] += 1;
  cancelled[40] -= 1;
  CHECK(train::detail::bit_hash(cancelled) != train::detail::bit_hash(ints));
  CHECK(train::detail::bit_hash(torch::tensor(1.5)) != train::detail::bit_hash(torch::tensor(2.5)));
}

TEST_CASE("two elements of a parameter swapped on one rank fail the divergence check") {
  const int world = 2;
  auto errors = errors_of(world, [&](int rank, Group group) {
    auto model = make_mlp();
    auto prepared = train::detail::replicate(model.ptr(), group, torch::kCPU, {});
    if (rank == 1) {
      torch::NoGradGuard no_grad;
      auto weight = model[0]->as<torch::nn::Linear>()->weight;
      auto first = weight[0][0].clone();
      weight[0][0] = weight[0][1];
      weight[0][1] = first;
    }
    train::detail::check_divergence({prepared}, *group, "train::report");
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].find("parameter '0.weight' of the prepared model holds other values on "
                            "rank 1 than on rank 0") != std::string::npos);
  }
}
