// train::optim's SGD, Adam and AdamW against torch::optim's on the CPU: the
// same parameters after the same gradients on every kernel path, state saved
// by one loaded by the other, and the operators a step dispatches.

#include <train/amp.h>
#include <train/op_counter.h>
#include <train/optim.h>

#include <torch/torch.h>
#include <torch/version.h>

#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "doctest_torch.h"
#include "optim/tensor_lists.h"

namespace {

using train::optim::Kernels;

// Parameters of two dtypes and several shapes, one of them without a gradient
// every third step: their step counts then differ, and so do the lists a
// multi-tensor step makes.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 5; ++i) params.push_back(torch::randn({3 + i, 4}));
  params.push_back(torch::randn({6}, torch::kFloat64));
  params.push_back(torch::randn({2, 3}, torch::kFloat64));
  params.push_back(torch::randn({5}));
  for (auto& p : params) p.set_requires_grad(true);
  return params;
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone().set_requires_grad(true));
  return copies;
}

// The same gradients on both sets at step `step`.
void set_grads(std::vector<torch::Tensor>& params, int step) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 3 && step % 3 == 1) {
      params[i].mutable_grad() = torch::Tensor();
      continue;
    }
    params[i].mutable_grad() =
        torch::randn(params[i].sizes(), generator, params[i].options().requires_grad(false));
  }
}

void check_close(const std::vector<torch::Tensor>& ours, const std::vector<torch::Tensor>& theirs,
                 bool exact) {
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO("parameter " << i);
    if (exact) {
      CHECK(torch::equal(ours[i], theirs[i]));
    } else {
      CHECK(torch::allclose(ours[i], theirs[i], /*rtol=*/1e-5, /*atol=*/1e-6));
    }
  }
}

template <typename Ours, typename Theirs, typename Options>
void compare(const Options& options, Kernels kernels, int steps = 7) {
  auto a = make_params();
  auto b = clone_params(a);
  Ours ours(a, options, kernels);
  Theirs theirs(b, options);
  for (int step = 0; step < steps; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    ours.step();
    theirs.step();
  }
  // The per-tensor path is torch::optim's arithmetic in its order, and the
  // multi-tensor one reorders nothing on the CPU either: both are bit for bit
  // torch::optim's, and so is the automatic choice there (a one-line swap of
  // optimizers changes no result). A fused kernel computes in its own way.
  check_close(a, b, kernels != Kernels::kFused);
  if (kernels != Kernels::kPerTensor) CHECK(ours.last_path() != Kernels::kPerTensor);
  if (kernels == Kernels::kAuto) CHECK(ours.last_path() == Kernels::kForeach);
}

std::vector<Kernels> paths(const char* optimizer) {
  std::vector<Kernels> all{Kernels::kPerTensor, Kernels::kForeach, Kernels::kAuto};
  if (train::optim::has_fused_kernel(optimizer, torch::kCPU)) all.push_back(Kernels::kFused);
  return all;
}

}  // namespace

TEST_CASE("train::optim::SGD computes what torch::optim::SGD computes, on every path") {
  for (auto kernels : paths("sgd")) {
    CAPTURE(train::optim::to_string(kernels));
    compare<train::optim::SGD, torch::optim::SGD>(torch::optim::SGDOptions(0.1), kernels);
    compare<train::optim::SGD, torch::optim::SGD>(
        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01).dampening(0.1), kernels);
    compare<train::optim::SGD, torch::optim::SGD>(
        torch::optim::SGDOptions(0.05).momentum(0.8).nesterov(true), kernels);
  }
}

TEST_CASE("train::optim::Adam computes what torch::optim::Adam computes, on every path") {
  for (auto kernels : paths("adam")) {
    CAPTURE(train::optim::to_string(kernels));
    compare<train::optim::Adam, torch::optim::Adam>(torch::optim::AdamOptions(1e-2), kernels);
    compare<train::optim::Adam, torch::optim::Adam>(
        torch::optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(true).betas({0.8, 0.9}), kernels);
  }
}

TEST_CASE("train::optim::AdamW computes what torch::optim::AdamW computes, on every path") {
  for (auto kernels : paths("adamw")) {
    CAPTURE(train::optim::to_string(kernels));
    compare<train::optim::AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2), kernels);
    compare<train::optim::AdamW, torch::optim::AdamW>(
        torch::optim::AdamWOptions(1e-2).weight_decay(0.3).amsgrad(true).eps(1e-6), kernels);
  }
}

TEST_CASE("a state saved by train::optim loads into torch::optim, and the other way round") {
  auto a = make_params();
  auto b = clone_params(a);
  const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.01);
  train::optim::Adam ours(a, options, Kernels::kForeach);
  for (int step = 0; step < 4; ++step) {
    set_grads(a, step);
    ours.step();
  }
  // Saved by ours, continued by LibTorch's on a copy of the parameters.
  std::stringstream saved;
  torch::save(ours, saved);
  for (size_t i = 0; i < a.size(); ++i) {
    torch::NoGradGuard no_grad;
    b[i].copy_(a[i]);
  }
  torch::optim::Adam theirs(b, options);
  torch::load(theirs, saved);
  for (int step = 4; step < 8; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    ours.step();
    theirs.step();
  }
  check_close(a, b, false);

  // Saved by LibTorch's, continued by ours.
  std::stringstream back;
  torch::save(theirs, back);
  auto c = clone_params(b);
  train::optim::Adam again(c, options);
  torch::load(again, back);
  for (int step = 8; step < 11; ++step) {
    set_grads(b, step);
    set_grads(c, step);
    theirs.step();
    again.step();
  }
  check_close(c, b, false);

  // SGD's momentum buffers cross over too.
  auto d = make_params();
  auto e = clone_params(d);
  const auto sgd_options = torch::optim::SGDOptions(0.1).momentum(0.9);
  train::optim::SGD sgd(d, sgd_options);
  set_grads(d, 0);
  sgd.step();
  std::stringstream sgd_saved;
  torch::save(sgd, sgd_saved);
  for (size_t i = 0; i < d.size(); ++i) {
    torch::NoGradGuard no_grad;
    e[i].copy_(d[i]);
  }
  torch::optim::SGD sgd_theirs(e, sgd_options);
  torch::load(sgd_theirs, sgd_saved);
  set_grads(d, 2);
  set_grads(e, 2);
  sgd.step();
  sgd_theirs.step();
  check_close(d, e, false);
}

TEST_CASE("param groups keep their own options, and an LR scheduler reaches them") {
  auto a = make_params();
  auto b = clone_params(a);
  auto groups = [](std::vector<torch::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>(p.begin(), p.begin() + 4));
    g.emplace_back(std::vector<torch::Tensor>(p.begin() + 4, p.end()),
                   std::make_unique<torch::optim::AdamWOptions>(0.5));
    return g;
  };
  train::optim::AdamW ours(groups(a), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW theirs(groups(b), torch::optim::AdamWOptions(1e-2));
  torch::optim::StepLR ours_lr(ours, 1, 0.5), theirs_lr(theirs, 1, 0.5);
  for (int step = 0; step < 5; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    ours.step();
    theirs.step();
    ours_lr.step();
    theirs_lr.step();
  }
  check_close(a, b, false);
}

TEST_CASE("sparse gradients: Adam refuses them as torch::optim does, SGD takes them as it does") {
  auto w = torch::ones({4}, torch::requires_grad());
  w.mutable_grad() = torch::ones({4}).to_sparse();
  train::optim::Adam adam({w});
  CHECK_THROWS_AS(adam.step(), c10::Error);
  auto v = torch::ones({4}, torch::requires_grad());
  v.mutable_grad() = torch::ones({4}).to_sparse();
  train::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  torch::optim::SGD theirs({v}, torch::optim::SGDOptions(0.1));
  sgd.step();
  theirs.step();
  CHECK(torch::equal(w, v));
}

namespace {

// A channels_last parameter with a contiguous gradient (as a reducer's
// gradient views are), and a contiguous one, in one list.
template <typename Ours, typename Theirs, typename Options>
void compare_layouts(const Options& options, Kernels kernels) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> a{
      torch::randn({2, 3, 4, 5}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(),
      torch::randn({3, 4}).requires_grad_()};
  std::vector<torch::Tensor> b{a[0].detach().clone(torch::MemoryFormat::ChannelsLast),
                               a[1].detach().clone()};
  for (auto& p : b) p.set_requires_grad(true);
  Ours ours(a, options, kernels);
  Theirs theirs(b, options);
  for (int step = 0; step < 4; ++step) {
    auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(2000 + step));
    for (size_t i = 0; i < a.size(); ++i) {
      auto grad = torch::randn(a[i].sizes(), generator);  // contiguous
      a[i].mutable_grad() = grad;
      b[i].mutable_grad() = grad.clone();
    }
    ours.step();
    theirs.step();
  }
  check_close(a, b, false);
  // Laid out unlike its parameter, the gradient keeps the list off the fused kernel.
  CHECK(ours.last_path() == Kernels::kForeach);
}

}  // namespace

TEST_CASE(
    "a gradient laid out unlike its parameter takes no fused kernel, and steps as torch::optim "
    "does") {
  using train::optim::detail::laid_out_alike;
  auto p = torch::randn({2, 3, 4, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  CHECK(laid_out_alike(p, {torch::zeros_like(p), torch::Tensor()}));
  CHECK_FALSE(laid_out_alike(p, {torch::randn({2, 3, 4, 5})}));
  CHECK_FALSE(laid_out_alike(p, {torch::zeros_like(p, torch::kDouble)}));
  CHECK_FALSE(laid_out_alike(torch::randn({4, 6}).slice(1, 0, 6, 2), {}));  // not dense
  // A dimension of size 1 is never stepped over: its stride may differ (a
  // depthwise weight made channels_last keeps its strides; its gradient does not).
  auto depthwise = torch::empty_strided({8, 1, 3, 3}, {9, 9, 3, 1});
  CHECK(laid_out_alike(depthwise, {torch::empty_strided({8, 1, 3, 3}, {9, 1, 3, 1})}));
  for (auto kernels : {Kernels::kAuto, Kernels::kFused}) {
    CAPTURE(train::optim::to_string(kernels));
    compare_layouts<train::optim::SGD, torch::optim::SGD>(
        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01), kernels);
    compare_layouts<train::optim::Adam, torch::optim::Adam>(
        torch::optim::AdamOptions(1e-2).amsgrad(true), kernels);
    compare_layouts<train::optim::AdamW, torch::optim::AdamW>(
        torch::optim::AdamWOptions(1e-2).weight_decay(0.1), kernels);
  }
}

TEST_CASE("a GradScaler step the device cannot take leaves Adam's state as it was") {
  auto a = make_params();
  train::optim::Adam adam(a, torch::optim::AdamOptions(1e-2), Kernels::kForeach);
  set_grads(a, 0);
  const auto scale = torch::ones({}, torch::kFloat);
  const auto found_inf = torch::zeros({}, torch::kFloat);
  CHECK_FALSE(adam.step_unless_inf(scale, found_inf));
  CHECK(adam.state().empty());
  adam.step();
  CHECK(adam.state().size() == a.size());
  CHECK_FALSE(adam.step_unless_inf(scale, found_inf));
  CHECK(adam.state().size() == a.size());
}

TEST_CASE("SGD given a state without a momentum buffer starts its momentum there, on every path") {
  for (auto kernels : paths("sgd")) {
    CAPTURE(train::optim::to_string(kernels));
    auto a = make_params();
    auto b = clone_params(a);
    const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
    train::optim::SGD ours(a, options, kernels), fresh(b, options, kernels);
    using StateMap = std::decay_t<decltype(ours.state())>;
    for (const auto& p : a) {
      ours.state()[train::optim::detail::state_key<StateMap>(p)] =
          std::make_unique<torch::optim::SGDParamState>();
    }
    for (int step = 0; step < 4; ++step) {
      set_grads(a, step);
      set_grads(b, step);
      ours.step();
      fresh.step();
    }
    check_close(a, b, false);
    for (const auto& p : a) {
      const auto* s =
          train::optim::detail::find_state<torch::optim::SGDParamState>(ours.state(), p);
      REQUIRE(s != nullptr);
      CHECK(s->momentum_buffer().defined());
    }
  }
}

TEST_CASE("the fused kernels this LibTorch has on the CPU") {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // LibTorch 2.4 added CPU kernels for all three.
  CHECK(train::optim::has_fused_kernel("sgd", torch::kCPU));
  CHECK(train::optim::has_fused_kernel("adam", torch::kCPU));
  CHECK(train::optim::has_fused_kernel("adamw", torch::kCPU));
#else
  CHECK_FALSE(train::optim::has_fused_kernel("sgd", torch::kCPU));
  CHECK_FALSE(train::optim::has_fused_kernel("adam", torch::kCPU));
#endif
  CHECK_FALSE(train::optim::has_fused_kernel("rmsprop", torch::kCPU));
}

TEST_CASE("every save writes the step counts a fused Adam keeps on its device") {
  auto a = make_params();
  train::optim::Adam adam(a, torch::optim::AdamOptions(1e-2), Kernels::kFused);
  using StateMap = std::decay_t<decltype(adam.state())>;
  auto saved_steps = [&] {
    std::stringstream bytes;
    torch::save(adam, bytes);
    auto c = clone_params(a);
    torch::optim::Adam loaded(c, torch::optim::AdamOptions(1e-2));
    torch::load(loaded, bytes);
    const auto& state = loaded.state().at(train::optim::detail::state_key<StateMap>(c[0]));
    return static_cast<torch::optim::AdamParamState&>(*state).step();
  };
  for (int step = 0; step < 3; ++step) {
    set_grads(a, step);
    adam.step();
  }
  CHECK(saved_steps() == 3);
  for (int step = 3; step < 5; ++step) {
    set_grads(a, step);
    adam.step();
  }
  CHECK(saved_steps() == 5);
}

TEST_CASE("a multi-tensor step dispatches a few operators, a per-tensor step several per tensor") {
  // 40 parameters, as a small network has; ResNet-18 has 62.
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 40; ++i) params.push_back(torch::randn({8, 8}, torch::requires_grad()));
  auto count = [&](torch::optim::Optimizer& optimizer) {
    for (auto& p : params) p.mutable_grad() = torch::randn({8, 8});
    optimizer.step();  // the first step makes the state
    train::OpCounter ops;
    optimizer.step();
    return ops.count();
  };
  const auto options = torch::optim::AdamOptions(1e-3).weight_decay(0.01);
  train::optim::Adam per_tensor(params, options, Kernels::kPerTensor);
  train::optim::Adam foreach (params, options, Kernels::kForeach);
  train::optim::Adam automatic(params, options);
  torch::optim::Adam libtorch(params, options);
  const auto per_tensor_ops = count(per_tensor);
  const auto foreach_ops = count(foreach);
  const auto auto_ops = count(automatic);
  const auto libtorch_ops = count(libtorch);
  MESSAGE("operators per Adam step over 40 tensors: torch::optim "
          << libtorch_ops << ", per-tensor " << per_tensor_ops << ", foreach " << foreach_ops
          << ", auto (" << std::string(train::optim::to_string(automatic.last_path())) << ") "
          << auto_ops);
  CHECK(libtorch_ops >= 40 * 6);
  CHECK(per_tensor_ops >= 40 * 6);
  CHECK(foreach_ops <= 12);
  CHECK(auto_ops <= 12);

  train::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_libtorch(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK(count(sgd) <= 6);
  CHECK(count(sgd_libtorch) >= 40 * 3);
}

TEST_CASE("one OpCounter at a time, and it counts only top-level operators") {
  train::OpCounter ops;
  CHECK_THROWS_AS(train::OpCounter(), std::logic_error);
  auto x = torch::randn({16, 16});
  ops.reset();
  auto y = torch::nn::functional::linear(x, x);  // one call, several operators inside
  CHECK(ops.count() >= 1);
  CHECK(ops.count() <= 3);
  CHECK(ops.by_name().size() >= 1);
}

namespace {

// One float16-style training step through a GradScaler: the scaled loss of
// sum(p * x) for each parameter p, where x holds an inf at `bad_step`.
void scaled_step(train::GradScaler& scaler, torch::optim::Optimizer& optimizer,
                 std::vector<torch::Tensor>& params, int step, int bad_step, bool unscale_first) {
  optimizer.zero_grad();
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(500 + step));
  torch::Tensor loss = torch::zeros({}, torch::kFloat64);
  for (auto& p : params) {
    auto x = torch::randn(p.sizes(), generator, p.options().requires_grad(false));
    if (step == bad_step && p.scalar_type() == torch::kFloat) {
      x.view(-1)[0] = std::numeric_limits<float>::infinity();
    }
    loss = loss + (p * x).sum().to(torch::kFloat64);
  }
  scaler.scale(loss).backward();
  if (unscale_first) scaler.unscale_(optimizer);
  scaler.step(optimizer);
  scaler.update();
}

}  // namespace

TEST_CASE("GradScaler with train::optim: the steps, skips and scale of torch::optim's") {
  for (bool unscale_first : {false, true}) {
    CAPTURE(unscale_first);
    auto a = make_params();
    auto b = clone_params(a);
    const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.01);
    train::optim::Adam ours(a, options, Kernels::kFused);
    torch::optim::Adam theirs(b, options);
    const auto scaler_options = train::GradScalerOptions().init_scale(1024).growth_interval(2);
    train::GradScaler ours_scaler(scaler_options), theirs_scaler(scaler_options);
    for (int step = 0; step < 6; ++step) {
      scaled_step(ours_scaler, ours, a, step, /*bad_step=*/2, unscale_first);
      scaled_step(theirs_scaler, theirs, b, step, /*bad_step=*/2, unscale_first);
    }
    check_close(a, b, false);
    CHECK(ours_scaler.get_scale() == theirs_scaler.get_scale());
    CHECK(ours_scaler.growth_tracker() == theirs_scaler.growth_tracker());
    // The skipped step was not counted: the saved step counts agree.
    std::stringstream saved;
    torch::save(ours, saved);
    auto c = clone_params(a);
    torch::optim::Adam loaded(c, options);
    torch::load(loaded, saved);
    using StateMap = std::decay_t<decltype(loaded.state())>;
    for (const auto& p : c) {
      const auto& state = loaded.state().at(train::optim::detail::state_key<StateMap>(p));
      CHECK(static_cast<torch::optim::AdamParamState&>(*state).step() == 5);
    }
    if (ours_scaler.on_device()) CHECK(ours.last_path() == Kernels::kFused);
  }
}

TEST_CASE("GradScaler with train::optim on fused kernels: no host synchronisation in a step") {
  auto a = make_params();
  train::optim::Adam adam(a, torch::optim::AdamOptions(1e-2), Kernels::kFused);
  train::GradScaler scaler(train::GradScalerOptions().init_scale(256));
  scaled_step(scaler, adam, a, 0, -1, false);  // the first step places the scale
  if (!scaler.on_device() || !train::optim::has_fused_kernel("adam", torch::kCPU)) {
    MESSAGE("this LibTorch has no AMP kernels for the CPU: the scale stays on the host");
    return;
  }
  train::OpCounter ops;
  for (int step = 1; step < 4; ++step) scaled_step(scaler, adam, a, step, /*bad_step=*/2, false);
  const auto names = ops.by_name();
  CHECK(names.count("aten::item") == 0);
  CHECK(names.count("aten::_local_scalar_dense") == 0);
  CHECK(adam.last_path() == Kernels::kFused);
}

TEST_CASE("a fused Adam's load keeps the step counts of parameters the archive holds no state of") {
  if (!train::optim::has_fused_kernel("adam", torch::kCPU)) {
    MESSAGE("this LibTorch has no fused Adam for the CPU: the counts are the host's anyway");
  }
  auto a = make_params();
  train::optim::Adam adam(a, torch::optim::AdamOptions(1e-2), Kernels::kFused);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : a) p.mutable_grad() = torch::ones_like(p);
    adam.step();
  }
  // An archive with the state of the first parameter alone: an Adam whose
  // other parameters never had a gradient.
  auto c = clone_params(a);
  torch::optim::Adam other(c, torch::optim::AdamOptions(1e-2));
  c[0].mutable_grad() = torch::ones_like(c[0]);
  other.step();
  std::stringstream bytes;
  torch::save(other, bytes);
  torch::load(adam, bytes);
  using StateMap = std::decay_t<decltype(adam.state())>;
  auto step_of = [&](const torch::Tensor& p) {
    const auto& state = adam.state().at(train::optim::detail::state_key<StateMap>(p));
    return static_cast<torch::optim::AdamParamState&>(*state).step();
  };
  CHECK(step_of(a[0]) == 1);  // the archive's
  for (size_t i = 1; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(step_of(a[i]) == 4);  // their own, counted on the device
  }
}
