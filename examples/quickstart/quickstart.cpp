// The smallest useful plugin: a linear regression trained data-parallel on
// synthetic data. Each rank draws its own batches; train::prepare_model makes
// the replicas identical and averages their gradients in backward, as
// PyTorch's DistributedDataParallel does; the mean loss across ranks is reported.
//
//   trainrun --plugin build/examples/quickstart/libquickstart.so --num-workers 2 --config steps=5

#include <train/train.h>

#include <torch/torch.h>

#include <iostream>

void quickstart(const train::Config& config) {
  auto ctx = train::get_context();
  const int steps = config.get<int>("steps", 20);
  const double lr = config.get<double>("lr", 0.05);
  std::cout << "rank " << ctx.world_rank() << " of " << ctx.world_size() << " on " << ctx.device()
            << ", " << steps << " steps" << std::endl;

  auto model = train::prepare_model(torch::nn::Linear(4, 1));  // rank 0's weights everywhere
  train::optim::SGD optimizer(model->parameters(), lr);
  torch::manual_seed(1000 + ctx.world_rank());  // a different data shard per rank
  const auto true_weight = torch::tensor({{1.0f, -2.0f, 3.0f, 0.5f}}).to(ctx.device());
  auto group = train::process_group();

  for (int step = 0; step < steps; ++step) {
    auto x = torch::randn({64, 4}).to(ctx.device());  // drawn on the CPU, used on the device
    auto y = x.matmul(true_weight.t()) + 0.7 + 0.01 * torch::randn({64, 1}).to(ctx.device());
    auto loss = torch::mse_loss(model->forward(x), y);
    optimizer.zero_grad();
    loss.backward();  // the gradients arrive averaged across ranks
    optimizer.step();
    std::vector<torch::Tensor> mean_loss{loss.detach().clone()};
    group->allreduce(mean_loss)->wait();
    train::report({{"step", step}, {"loss", mean_loss[0].item<double>() / ctx.world_size()}});
  }
}

TRAIN_FUNC(quickstart);
