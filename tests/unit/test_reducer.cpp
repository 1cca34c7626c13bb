#include <train/model.h>

#include <torch/torch.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/reducer.h"
#include "doctest_torch.h"
#include "temp_dir.h"
#include "thread_ranks.h"

// The Reducer in one process, ranks as threads (thread_ranks.h). The expected
// gradients are computed by the same nets without a Reducer, then averaged by
// hand. Ranks only record what they see; the checks run on the test's thread
// once every rank has been joined.

namespace {

using ByName = std::map<std::string, torch::Tensor>;

constexpr int64_t kWidth = 4;  // square layers, so that they can run in either order
constexpr int64_t kBatch = 5;
constexpr double kTinyCapMb = 1e-6;  // about one byte: a bucket per parameter

// How one rank runs the net: which layer first, and whether `extra` takes part.
struct Pass {
  bool fc2_first = false;
  bool use_extra = false;
};

enum class Layers { kTwo, kWithExtra };

struct NetImpl : torch::nn::Module {
  explicit NetImpl(Layers layers) {
    fc1 = register_module("fc1", torch::nn::Linear(kWidth, kWidth));
    fc2 = register_module("fc2", torch::nn::Linear(kWidth, kWidth));
    if (layers == Layers::kWithExtra) {
      extra = register_module("extra", torch::nn::Linear(kWidth, kWidth));
    }
    // The same weights on every rank, whatever the random generator did.
    torch::NoGradGuard no_grad;
    double phase = 0;
    for (auto& p : parameters()) {
      auto ramp = torch::arange(p.numel(), torch::kFloat) * 0.7 + phase;
      p.copy_(torch::sin(ramp).reshape(p.sizes()) * 0.5);
      phase += 1;
    }
  }

  torch::Tensor loss(const torch::Tensor& x, Pass pass = {}) {
    auto y = pass.fc2_first ? fc1(torch::tanh(fc2(x))) : fc2(torch::tanh(fc1(x)));
    if (pass.use_extra) y = y + extra(x);
    return y.pow(2).mean();
  }

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Linear extra{nullptr};
};
TORCH_MODULE(Net);

// A different batch for every rank and step.
torch::Tensor input(int rank, int step = 0) {
  auto ramp = torch::arange(kBatch * kWidth, torch::kFloat) * (0.3 * (rank + 1)) + step;
  return torch::cos(ramp).reshape({kBatch, kWidth});
}

// Each parameter's .grad by name; a missing one counts as zero.
ByName grads_of(const torch::nn::Module& net) {
  ByName grads;
  for (const auto& p : net.named_parameters()) {
    const auto& grad = p.value().grad();
    grads[p.key()] = grad.defined() ? grad.clone() : torch::zeros_like(p.value());
  }
  return grads;
}

ByName weights_of(const torch::nn::Module& net) {
  ByName weights;
  for (const auto& p : net.named_parameters()) weights[p.key()] = p.value().detach().clone();
  return weights;
}

// The gradients one rank gets on its own, starting from `weights`: backward
// once per input, accumulating.
ByName local_grads(const Net& weights, const std::vector<torch::Tensor>& inputs, Pass pass = {}) {
  Net net(weights->extra ? Layers::kWithExtra : Layers::kTwo);
  {
    torch::NoGradGuard no_grad;
    auto from = weights->named_parameters();
    for (auto& p : net->named_parameters()) p.value().copy_(from[p.key()]);
  }
  for (const auto& x : inputs) net->loss(x, pass).backward();
  return grads_of(*net);
}

ByName mean(const std::vector<ByName>& per_rank) {
  ByName sum;
  for (const auto& grads : per_rank) {
    for (const auto& [name, grad] : grads) {
      auto found = sum.find(name);
      if (found == sum.end()) {
        sum.emplace(name, grad.clone());
      } else {
        found->second.add_(grad);
      }
    }
  }
  for (auto& [name, grad] : sum) grad.div_(static_cast<double>(per_rank.size()));
  return sum;
}

void check_close(const ByName& actual, const ByName& expected) {
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, grad] : expected) {
    CAPTURE(name);
    REQUIRE(actual.count(name) == 1);
    CHECK(torch::allclose(actual.at(name), grad, 1e-5, 1e-6));
  }
}

std::shared_ptr<train::detail::Reducer> attach(Net& net, Group group,
                                               const train::ModelOptions& options = {}) {
  auto reducer = std::make_shared<train::detail::Reducer>(*net, std::move(group), options);
  reducer->install_hooks();
  return reducer;
}

// Data-parallel SGD by hand: one replica, stepped with the mean of the ranks'
// gradients. `synced[rank][step]` is what each rank saw after each backward.
void check_data_parallel_sgd(const std::vector<std::vector<ByName>>& synced,
                             const std::vector<ByName>& final_weights, double lr) {
  const auto world = static_cast<int>(synced.size());
  const auto steps = static_cast<int>(synced.front().size());
  Net replica(Layers::kTwo);
  for (int step = 0; step < steps; ++step) {
    std::vector<ByName> local;
    for (int rank = 0; rank < world; ++rank) {
      local.push_back(local_grads(replica, {input(rank, step)}));
    }
    auto expected = mean(local);
    for (int rank = 0; rank < world; ++rank) {
      CAPTURE(rank);
      CAPTURE(step);
      check_close(synced[rank][step], expected);
    }
    torch::NoGradGuard no_grad;
    for (auto& p : replica->named_parameters()) p.value().sub_(expected.at(p.key()) * lr);
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(final_weights[rank], weights_of(*replica));
  }
}

}  // namespace

TEST_CASE("after backward every rank holds the average of the ranks' gradients") {
  const int world = 3;
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group);
    net->loss(input(rank)).backward();
    synced[rank] = grads_of(*net);
  });

  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank)}));
  }
  REQUIRE_FALSE(torch::allclose(local[0].at("fc1.weight"), local[1].at("fc1.weight")));
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(synced[rank], mean(local));
  }
}

TEST_CASE("a channels_last weight's averaged gradient is laid out as the weight is") {
  const int world = 2;
  // The same weights on every rank, drawn from no generator (the ranks are threads).
  auto make = [] {
    auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3));
    torch::NoGradGuard no_grad;
    auto ramp = torch::arange(conv->weight.numel(), torch::kFloat) * 0.37;
    conv->weight.set_data(torch::sin(ramp)
                              .reshape(conv->weight.sizes())
                              .contiguous(torch::MemoryFormat::ChannelsLast));
    conv->bias.fill_(0.1);
    return conv;
  };
  auto batch = [](int rank) {
    auto ramp = torch::arange(2 * 3 * 6 * 6, torch::kFloat) * (0.1 * (rank + 1));
    return torch::sin(ramp).reshape({2, 3, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast);
  };
  std::vector<torch::Tensor> synced(world);
  std::vector<char> alike(world, 0);  // not vector<bool>: the ranks write at once
  run_ranks(world, [&](int rank, Group group) {
    auto conv = make();
    auto reducer =
        std::make_shared<train::detail::Reducer>(*conv, std::move(group), train::ModelOptions{});
    reducer->install_hooks();
    conv(batch(rank)).pow(2).mean().backward();
    const auto& grad = conv->weight.grad();
    alike[rank] = grad.strides() == conv->weight.strides();
    synced[rank] = grad.clone();
  });
  auto expected = torch::zeros_like(make()->weight);
  for (int rank = 0; rank < world; ++rank) {
    auto conv = make();
    conv(batch(rank)).pow(2).mean().backward();
    expected += conv->weight.grad() / world;
  }
  REQUIRE_FALSE(make()->weight.is_contiguous());
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(alike[rank]);
    CHECK(torch::allclose(synced[rank], expected, 1e-5, 1e-6));
  }
}

TEST_CASE("accumulators made again (as before a capture) still average, a graph's own kept") {
  const int world = 2;
  std::vector<ByName> synced(world), synced_kept(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group);
    reducer->renew_accumulators();  // none held elsewhere: each made again, hooked
    net->loss(input(rank)).backward();
    synced[rank] = grads_of(*net);
    net->zero_grad();
    // A live graph holds the accumulators: they are kept, with one hook each.
    auto held = net->loss(input(rank, 1));
    reducer->renew_accumulators();
    held.backward();
    synced_kept[rank] = grads_of(*net);
  });
  std::vector<ByName> local, local_kept;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank)}));
    local_kept.push_back(local_grads(Net(Layers::kTwo), {input(rank, 1)}));
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(synced[rank], mean(local));
    check_close(synced_kept[rank], mean(local_kept));
  }
}

TEST_CASE("accumulators made again skip a parameter frozen after prepare_model") {
  const int world = 2;
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group, train::ModelOptions().find_unused_parameters(true));
    net->fc1->bias.set_requires_grad(false);  // frozen: no accumulator to make
    reducer->renew_accumulators();
    net->loss(input(rank)).backward();
    synced[rank] = grads_of(*net);
  });
  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank)}));
  }
  const auto expected = mean(local);
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    for (const char* name : {"fc1.weight", "fc2.weight", "fc2.bias"}) {
      CAPTURE(name);
      CHECK(torch::allclose(synced[rank].at(name), expected.at(name), 1e-5, 1e-6));
    }
  }
}

TEST_CASE("a backward that threw part-way, abandoned, leaves the next backward to average") {
  const int world = 2;
  std::vector<int> threw(world);
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group);
    // fc2's gradients come, then the hook between the layers throws: fc1's never do.
    auto hidden = torch::tanh(net->fc1(input(rank)));
    hidden.register_hook([](const torch::Tensor&) -> torch::Tensor {
      throw std::runtime_error("a backward that fails part-way");
    });
    try {
      net->fc2(hidden).pow(2).mean().backward();
    } catch (const std::exception&) {
      threw[rank] = 1;
    }
    reducer->abandon();
    net->zero_grad();
    net->loss(input(rank, 1)).backward();
    synced[rank] = grads_of(*net);
  });
  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank, 1)}));
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(threw[rank]);
    check_close(synced[rank], mean(local));
  }
}

TEST_CASE("gradients ready in a different order on each rank: small buckets still average") {
  // Rank 1 runs the layers the other way round, so its gradients become ready in
  // another order; buckets must still be allreduced in the same order everywhere.
  const int world = 2;
  auto pass_of = [](int rank) { return Pass{/*fc2_first=*/rank == 1, /*use_extra=*/false}; };
  std::vector<ByName> synced(world);
  std::vector<size_t> buckets(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto options = train::ModelOptions().bucket_cap_mb(kTinyCapMb).first_bucket_cap_mb(kTinyCapMb);
    auto reducer = attach(net, group, options);
    buckets[rank] = reducer->num_buckets();
    net->loss(input(rank), pass_of(rank)).backward();
    synced[rank] = grads_of(*net);
  });

  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank)}, pass_of(rank)));
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(buckets[rank] == 4);
    check_close(synced[rank], mean(local));
  }
}

TEST_CASE("a parameter without a gradient fails backward with its name") {
  const int world = 2;
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kWithExtra);
    auto reducer = attach(net, group);
    try {
      net->loss(input(rank)).backward();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].find("extra.weight") != std::string::npos);
    CHECK(errors[rank].find("extra.bias") != std::string::npos);
    CHECK(errors[rank].find("find_unused_parameters(true)") != std::string::npos);
    CHECK(errors[rank].find("fc1") == std::string::npos);
  }
}

TEST_CASE("with find_unused_parameters a missing gradient counts as zero") {
  // Only rank 0 uses `extra`: every rank gets half of rank 0's gradient for it.
  const int world = 2;
  auto pass_of = [](int rank) { return Pass{/*fc2_first=*/false, /*use_extra=*/rank == 0}; };
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kWithExtra);
    auto reducer = attach(net, group, train::ModelOptions().find_unused_parameters(true));
    net->loss(input(rank), pass_of(rank)).backward();
    synced[rank] = grads_of(*net);
  });

  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kWithExtra), {input(rank)}, pass_of(rank)));
  }
  REQUIRE(local[1].at("extra.weight").abs().sum().item<float>() == 0);
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(synced[rank], mean(local));
  }
}

TEST_CASE(
    "with find_unused_parameters a gradient accumulated under no_sync is averaged, not lost") {
  // `extra` gets gradient only in the pass under no_sync, on every rank; the
  // synchronising pass does not use it. One process would hold the sum of
  // the passes; every rank must hold the mean of those sums.
  const int world = 2;
  const Pass with_extra{false, true}, without_extra{false, false};
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kWithExtra);
    auto reducer = attach(net, group, train::ModelOptions().find_unused_parameters(true));
    reducer->set_sync(false);
    net->loss(input(rank, 0), with_extra).backward();
    reducer->set_sync(true);
    net->loss(input(rank, 1), without_extra).backward();
    synced[rank] = grads_of(*net);
  });

  std::vector<ByName> accumulated;
  for (int rank = 0; rank < world; ++rank) {
    Net net(Layers::kWithExtra);
    net->loss(input(rank, 0), with_extra).backward();
    net->loss(input(rank, 1), without_extra).backward();
    accumulated.push_back(grads_of(*net));
  }
  REQUIRE(mean(accumulated).at("extra.weight").abs().sum().item<float>() > 0);
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(synced[rank], mean(accumulated));
  }
}

TEST_CASE("a parameter no rank uses keeps its .grad exactly as one process would") {
  // Three ranks (a third does not round-trip through the average). Step A: no
  // rank uses `extra`: its .grad stays undefined, so Adam with weight decay
  // leaves it alone. Step B: rank 0 uses it. Step C, without zero_grad: no
  // rank uses it: its .grad keeps step B's value, bit for bit.
  const int world = 3;
  std::vector<int> undefined_after_a(world), unmoved_by_adam(world), others_moved(world),
      kept_after_c(world), defined_after_b(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kWithExtra);
    auto reducer = attach(net, group, train::ModelOptions().find_unused_parameters(true));
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1).weight_decay(0.1));
    const auto before = weights_of(*net);
    net->loss(input(rank, 0), Pass{false, false}).backward();
    undefined_after_a[rank] =
        !net->extra->weight.grad().defined() && !net->extra->bias.grad().defined();
    adam.step();
    const auto after = weights_of(*net);
    unmoved_by_adam[rank] = torch::equal(after.at("extra.weight"), before.at("extra.weight")) &&
                            torch::equal(after.at("extra.bias"), before.at("extra.bias"));
    others_moved[rank] = !torch::equal(after.at("fc1.weight"), before.at("fc1.weight"));

    net->loss(input(rank, 1), Pass{false, rank == 0}).backward();
    defined_after_b[rank] = net->extra->weight.grad().defined();
    const auto step_b = defined_after_b[rank] ? net->extra->weight.grad().clone() : torch::Tensor();
    net->loss(input(rank, 2), Pass{false, false}).backward();
    kept_after_c[rank] = step_b.defined() && torch::equal(net->extra->weight.grad(), step_b);
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(undefined_after_a[rank]);
    CHECK(unmoved_by_adam[rank]);
    CHECK(others_moved[rank]);
    CHECK(defined_after_b[rank]);
    CHECK(kept_after_c[rank]);
  }
}

TEST_CASE("no sync accumulates locally, and the next synced backward averages the sum") {
  const int world = 2;
  std::vector<ByName> unsynced(world);
  std::vector<ByName> synced(world);
  std::vector<int> previous(world, 0);  // not vector<bool>: ranks write it at once
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group);
    previous[rank] = reducer->set_sync(false);
    net->loss(input(rank, 0)).backward();
    unsynced[rank] = grads_of(*net);
    reducer->set_sync(true);
    net->loss(input(rank, 1)).backward();
    synced[rank] = grads_of(*net);
  });

  std::vector<ByName> accumulated;
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(previous[rank]);
    check_close(unsynced[rank], local_grads(Net(Layers::kTwo), {input(rank, 0)}));
    accumulated.push_back(local_grads(Net(Layers::kTwo), {input(rank, 0), input(rank, 1)}));
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    check_close(synced[rank], mean(accumulated));
  }
}

TEST_CASE("zero_grad and step between iterations: each iteration averages, replicas stay equal") {
  const int world = 2;
  const int steps = 3;
  const double lr = 0.1;
  // LibTorch 1.13's zero_grad zeroes .grad in place; 2.x's sets it to undefined by default.
  bool grads_to_undefined = false;
  SUBCASE("optimizer zero_grad") {}
  SUBCASE(".grad set to undefined") { grads_to_undefined = true; }
  std::vector<std::vector<ByName>> synced(world, std::vector<ByName>(steps));
  std::vector<ByName> final_weights(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto options = train::ModelOptions().bucket_cap_mb(kTinyCapMb).first_bucket_cap_mb(kTinyCapMb);
    auto reducer = attach(net, group, options);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(lr));
    for (int step = 0; step < steps; ++step) {
      if (grads_to_undefined) {
        for (auto& p : net->parameters()) p.mutable_grad().reset();
      } else {
        optimizer.zero_grad();
      }
      net->loss(input(rank, step)).backward();
      synced[rank][step] = grads_of(*net);
      optimizer.step();
    }
    final_weights[rank] = weights_of(*net);
  });

  check_data_parallel_sgd(synced, final_weights, lr);
}

TEST_CASE("parameters loaded with torch::load after prepare_model are still averaged") {
  // torch::load assigns parameters with Tensor::set_, which gives each one a new
  // gradient accumulator: the Reducer must follow, or the ranks train apart.
  const int world = 2;
  const int steps = 3;
  const double lr = 0.1;
  TempDir dir;
  std::vector<std::vector<ByName>> synced(world, std::vector<ByName>(steps));
  std::vector<ByName> final_weights(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto options = train::ModelOptions().bucket_cap_mb(kTinyCapMb).first_bucket_cap_mb(kTinyCapMb);
    auto reducer = attach(net, group, options);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(lr));
    const auto file = (dir.path / ("rank" + std::to_string(rank) + ".pt")).string();
    torch::save(net, file);
    net->loss(input(rank, -1)).backward();  // a step that the load then undoes
    optimizer.step();
    torch::load(net, file);
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      net->loss(input(rank, step)).backward();
      synced[rank][step] = grads_of(*net);
      optimizer.step();
    }
    final_weights[rank] = weights_of(*net);
  });
  check_data_parallel_sgd(synced, final_weights, lr);
}

TEST_CASE("a parameter reshaped after prepare_model fails the next backward with its name") {
  const int world = 2;
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    auto reducer = attach(net, group);
    {
      torch::NoGradGuard no_grad;
      net->fc1->bias.set_(torch::zeros({1}));  // still broadcasts in forward
    }
    try {
      net->loss(input(rank)).backward();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].find("'fc1.bias' became [1] Float") != std::string::npos);
    CHECK(errors[rank].find("[4] Float") != std::string::npos);
    CHECK(errors[rank].find("before prepare_model") != std::string::npos);
  }
}

TEST_CASE("fp16-compressed gradients average within fp16's precision, over Gloo") {
  const int world = 3;
  // The last of two backward passes, on new inputs: a wire buffer left from
  // the first would show.
  std::vector<ByName> local;
  for (int rank = 0; rank < world; ++rank) {
    local.push_back(local_grads(Net(Layers::kTwo), {input(rank, 1)}));
  }
  const auto expected = mean(local);
  const double rtol = 2e-3;  // fp16 keeps 11 bits
  std::vector<ByName> synced(world);
  run_ranks(world, [&](int rank, Group group) {
    Net net(Layers::kTwo);
    // A bucket per parameter: several wire buffers, launched in order.
    auto reducer = attach(net, group,
                          train::ModelOptions()
                              .bucket_cap_mb(kTinyCapMb)
                              .first_bucket_cap_mb(kTinyCapMb)
                              .compression(train::Compression::kFP16));
    CHECK(reducer->num_buckets() > 1);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : net->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      net->loss(input(rank, step)).backward();
    }
    synced[rank] = grads_of(*net);
  });
  bool inexact = false;
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    for (const auto& [name, grad] : expected) {
      CAPTURE(name);
      const auto& got = synced[rank].at(name);
      CHECK((got.scalar_type() == torch::kFloat));  // cast back into the float32 gradients
      CHECK(torch::allclose(got, grad, rtol, 1e-4));
      inexact = inexact || !torch::equal(got, grad);
      CHECK(torch::equal(got, synced[0].at(name)));  // every rank the same
    }
  }
  CHECK(inexact);  // it did travel in fewer bits
}

TEST_CASE(
    "fp16 or bf16 compression with an unused parameter: it counts as zero, the rest average") {
  for (auto compression : {train::Compression::kFP16, train::Compression::kBF16}) {
    CAPTURE(static_cast<int>(compression));
    const int world = 2;
    std::vector<ByName> local;
    for (int rank = 0; rank < world; ++rank) {
      local.push_back(local_grads(Net(Layers::kWithExtra), {input(rank)}));
    }
    const auto expected = mean(local);  // extra's gradient is zero on every rank
    std::vector<ByName> synced(world);
    run_ranks(world, [&](int rank, Group group) {
      Net net(Layers::kWithExtra);
      auto reducer = attach(net, group,
                            train::ModelOptions()
                                .find_unused_parameters(true)
                                .bucket_cap_mb(kTinyCapMb)
                                .first_bucket_cap_mb(kTinyCapMb)
                                .compression(compression));
      net->loss(input(rank)).backward();
      synced[rank] = grads_of(*net);
    });
    const double rtol = compression == train::Compression::kFP16 ? 2e-3 : 1e-2;
    for (int rank = 0; rank < world; ++rank) {
      CAPTURE(rank);
      for (const auto& [name, grad] : expected) {
        CAPTURE(name);
        CHECK(torch::allclose(synced[rank].at(name), grad, rtol,
                              rtol * grad.abs().max().item<double>() + 1e-4));
      }
      CHECK(torch::equal(synced[rank].at("extra.weight"), torch::zeros({kWidth, kWidth})));
    }
  }
}

TEST_CASE(
    "bf16-compressed gradients average within bf16's precision, over Gloo, every rank alike") {
  // Gloo has no bfloat16 allreduce: the buckets go as an alltoall and an
  // allgather, each padded to a multiple of the world size (3 divides no
  // parameter's size here; 2 divides some).
  for (int world : {2, 3}) {
    CAPTURE(world);
    std::vector<ByName> local;
    for (int rank = 0; rank < world; ++rank) {
      local.push_back(local_grads(Net(Layers::kTwo), {input(rank, 1)}));
    }
    const auto expected = mean(local);
    // A bucket per parameter, and one for all.
    const std::vector<double> caps{kTinyCapMb, 25.0};
    std::vector<std::vector<ByName>> synced(caps.size(), std::vector<ByName>(world));
    run_ranks(world, [&](int rank, Group group) {
      for (size_t c = 0; c < caps.size(); ++c) {
        Net net(Layers::kTwo);
        auto reducer = attach(
            net, group,
            train::ModelOptions().bucket_cap_mb(caps[c]).first_bucket_cap_mb(caps[c]).compression(
                train::Compression::kBF16));
        CHECK((reducer->num_buckets() > 1) == (c == 0));
        for (int step = 0; step < 2; ++step) {
          for (auto& p : net->parameters()) {
            if (p.grad().defined()) p.mutable_grad().zero_();
          }
          net->loss(input(rank, step)).backward();
        }
        synced[c][rank] = grads_of(*net);
      }
    });
    bool inexact = false;
    for (size_t c = 0; c < caps.size(); ++c)
      for (int rank = 0; rank < world; ++rank) {
        CAPTURE(c);
        CAPTURE(rank);
        for (const auto& [name, grad] : expected) {
          CAPTURE(name);
          const auto& got = synced[c][rank].at(name);
          CHECK((got.scalar_type() == torch::kFloat));
          // bf16 keeps 8 bits: each rank's part rounded once, the sum once.
          const double atol = 1e-2 * grad.abs().max().item<double>();
          CHECK(torch::allclose(got, grad, 1e-2, atol));
          inexact = inexact || !torch::equal(got, grad);
          CHECK(torch::equal(got, synced[c][0].at(name)));  // the same bits on every rank
        }
      }
    CHECK(inexact);
  }
}
