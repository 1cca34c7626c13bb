// The README's tour, step 1: a train function that resumes from its latest
// checkpoint. tests/docs/test_docs.py checks that the README shows this code
// as it is here, and tests/examples/test_tour.py runs it, reruns it, and
// checks that the rerun went on from the first run's last step.
//
//   trainrun --plugin build/examples/tour/libtour.so --num-workers 2 --config steps=50 --name demo

#include <train/train.h>
#include <torch/torch.h>
#include <fstream>

void train_func(const train::Config& config) {
  torch::nn::Linear net(4, 1);
  int first_step = 0;
  if (auto checkpoint = train::get_checkpoint()) {     // a restart or a rerun: resume
    torch::load(net, (checkpoint->path() / "model.pt").string());
    std::ifstream(checkpoint->path() / "step.txt") >> first_step;
    ++first_step;
  }
  auto model = train::prepare_model(net);              // to the device, rank 0's weights everywhere
  train::optim::SGD optimizer(model->parameters(), config.get<double>("lr", 0.05));
  auto ctx = train::get_context();                     // ranks, world size, device
  for (int step = first_step; step < config.get<int>("steps", 100); ++step) {
    auto x = torch::randn({64, 4}).to(ctx.device());
    auto loss = torch::mse_loss(model->forward(x), x.sum(1, true));
    optimizer.zero_grad();
    loss.backward();                                   // gradients averaged across ranks here
    optimizer.step();
    train::Metrics metrics{{"step", step}, {"loss", loss.item<double>()}};
    if (ctx.world_rank() == 0) {                       // the replicas are identical
      train::TempDir dir;                              // a checkpoint is a directory of files
      torch::save(model, (dir.path() / "model.pt").string());
      std::ofstream(dir.path() / "step.txt") << step;
      train::report(metrics, train::Checkpoint::from_directory(dir.path()));
    } else {
      train::report(metrics);                          // every rank reports, as often
    }
  }
}
TRAIN_FUNC(train_func);                                // exports it from the plugin
