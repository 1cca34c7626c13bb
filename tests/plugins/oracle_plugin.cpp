// trainrun's side of tests/oracle/ddp_oracle.py: trains the scenario that
// `prepare` wrote to config "dir" (scenario.json, init.json, data.json) under
// prepare_model, as the script's DDP run does, and writes this rank's final
// parameters, gradients and buffers to <config "out"><rank>.json in the
// script's state format.

#include <train/train.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return json::parse(in);
}

// {"shape": [...], "values": [...]} into a tensor of `dtype`.
torch::Tensor from_json(const json& t, torch::ScalarType dtype = torch::kFloat) {
  auto values = t.at("values").get<std::vector<double>>();
  auto shape = t.at("shape").get<std::vector<int64_t>>();
  return torch::tensor(values, torch::kDouble).reshape(shape).to(dtype);
}

json to_json(const torch::Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  auto flat = tensor.detach().cpu().to(torch::kDouble).contiguous().view({-1});
  const auto* data = flat.data_ptr<double>();
  return {{"shape", tensor.sizes().vec()},
          {"values", std::vector<double>(data, data + flat.numel())}};
}

// The script's models, with its module names in its order.
struct OracleNet : torch::nn::Module {
  explicit OracleNet(const std::string& model) : mlp_bn(model == "mlp_bn") {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    if (mlp_bn) bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module(
        "fc2", torch::nn::Linear(torch::nn::LinearOptions(16, 4).bias(model != "frozen")));
    if (model == "frozen") {
      fc1->weight.set_requires_grad(false);
      fc1->bias.set_requires_grad(false);
    } else if (model == "unused") {
      spare = register_module("spare", torch::nn::Linear(16, 4));
    } else if (model == "sometimes") {
      branch = register_module("branch", torch::nn::Linear(16, 4));
    } else if (!mlp_bn) {
      throw std::invalid_argument("unknown model " + model);
    }
  }

  torch::Tensor forward(const torch::Tensor& x, bool use_branch) {
    if (mlp_bn) return fc2(torch::relu(bn(fc1(x))));
    auto h = torch::tanh(fc1(x));
    auto out = fc2(h);
    if (use_branch && branch) out = out + branch(h);
    return out;
  }

  bool mlp_bn;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, spare{nullptr}, branch{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

// Whether `branch` takes part for `rank` at `step`, micro-batch `micro` of `micros`.
bool uses_branch(const std::string& scenario, int rank, int step, int micro, int micros) {
  if (scenario.rfind("sometimes", 0) == 0) return (step + rank) % 3 == 0;
  if (scenario.rfind("accumulate", 0) == 0) return micro < micros - 1;
  return scenario.rfind("bf16", 0) == 0;
}

}  // namespace

void oracle(const train::Config& config) {
  auto ctx = train::get_context();
  const auto dir = config.get<std::string>("dir");
  const auto scenario = read_json(dir + "/scenario.json");
  const auto init = read_json(dir + "/init.json");
  const auto data = read_json(dir + "/data.json");
  const auto name = scenario.at("scenario").get<std::string>();
  const int world = scenario.at("world").get<int>();
  if (world != ctx.world_size()) {
    throw std::invalid_argument("the scenario is for " + std::to_string(world) + " ranks");
  }

  auto net = std::make_shared<OracleNet>(scenario.at("model").get<std::string>());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->named_parameters())
      p.value().copy_(from_json(init.at("params").at(p.key())));
    for (auto& b : net->named_buffers()) {
      b.value().copy_(from_json(init.at("buffers").at(b.key()), b.value().scalar_type()));
    }
  }
  const auto compression = scenario.at("compression").get<std::string>() == "bf16"
                               ? train::Compression::kBF16
                               : train::Compression::kNone;
  auto model =
      train::prepare_model(net, train::ModelOptions()
                                    .find_unused_parameters(scenario.at("find_unused").get<bool>())
                                    .compression(compression));

  std::unique_ptr<torch::optim::Optimizer> optimizer;
  const double lr = scenario.at("lr").get<double>();
  if (scenario.at("optimizer") == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(lr)
                                 .momentum(scenario.at("momentum").get<double>())
                                 .weight_decay(scenario.at("weight_decay").get<double>()));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(
        model->parameters(),
        torch::optim::AdamOptions(lr).weight_decay(scenario.at("weight_decay").get<double>()));
  }

  const int steps = scenario.at("steps").get<int>();
  const int micros = scenario.at("micro").get<int>();
  const int64_t local = scenario.at("batch").get<int64_t>() / world;
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();  // this LibTorch's default, as the script's torch
    for (int micro = 0; micro < micros; ++micro) {
      const auto index = static_cast<size_t>(step * micros + micro);
      auto x = from_json(data.at("x").at(index)).narrow(0, local * ctx.world_rank(), local);
      auto y = from_json(data.at("y").at(index)).narrow(0, local * ctx.world_rank(), local);
      const bool branch = uses_branch(name, ctx.world_rank(), step, micro, micros);
      auto backward = [&] { torch::mse_loss(model->forward(x, branch), y).backward(); };
      if (micro < micros - 1) {
        train::NoSync no_sync(*model);
        backward();
      } else {
        backward();
      }
    }
    optimizer->step();
  }

  json state{{"params", json::object()}, {"grads", json::object()}, {"buffers", json::object()}};
  for (const auto& p : model->named_parameters()) {
    state["params"][p.key()] = to_json(p.value());
    state["grads"][p.key()] = to_json(p.value().grad());
  }
  for (const auto& b : model->named_buffers()) state["buffers"][b.key()] = to_json(b.value());
  std::ofstream(config.get<std::string>("out") + std::to_string(ctx.world_rank()) + ".json")
      << state.dump();
  train::report({{"steps", steps}});
}

TRAIN_FUNC(oracle);
