// Inference from a finished run, in a plain program (no trainrun run): find
// the best checkpoint of a FashionMNIST run, load the model from it, and
// evaluate it on the test set. The checkpoint is ordinary files (model.pt as
// torch::save wrote it), so any LibTorch program can load it; trainrun's API
// only says which one is best.
//
//   inference RUN_DIR [DATA_DIR]
//
// RUN_DIR is <storage_path>/<name> of a run of the FashionMNIST plugin (best
// by --checkpoint-score-attribute if the run had one, else the latest);
// DATA_DIR defaults to Debian's dataset-fashion-mnist.

#include <trainrun/error.h>
#include <trainrun/result.h>

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <iostream>

#include "fashion_mnist_dataset.h"
#include "resnet.h"

namespace {

const char* const kClasses[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

int run(const std::filesystem::path& run_dir, const std::string& data_dir) {
  // Ray Train: result = trainer.fit(); result.best_checkpoints[0]
  trainrun::Result result = trainrun::load_result(run_dir);
  if (result.best_checkpoints.empty()) {
    std::cerr << "inference: " << run_dir.string() << " has no committed checkpoint\n";
    return 1;
  }
  const trainrun::CheckpointInfo& best = result.best_checkpoints.front();
  std::cout << "checkpoint: " << best.path.string() << " (iteration " << best.iteration
            << ", reported " << best.metrics.dump() << ")\n";

  // The same model the train function built, its weights from the checkpoint.
  fashion_mnist::ResNet18 model(10);
  torch::load(model, (best.path / "model.pt").string(), torch::kCPU);
  model->eval();
  torch::NoGradGuard no_grad;

  fashion_mnist::FashionMNIST test_set(data_dir, fashion_mnist::Split::kTest);
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      test_set.map(torch::data::transforms::Stack<>()), 500);
  int64_t correct = 0, total = 0;
  torch::Tensor first_predictions;
  for (auto& batch : *loader) {
    auto predicted = model->forward(batch.data).argmax(1);
    if (!first_predictions.defined()) first_predictions = predicted.slice(0, 0, 5);
    correct += predicted.eq(batch.target).sum().item<int64_t>();
    total += batch.target.size(0);
  }
  std::printf("test accuracy: %.6f (%lld of %lld images)\n",
              static_cast<double>(correct) / static_cast<double>(total),
              static_cast<long long>(correct), static_cast<long long>(total));
  for (int64_t i = 0; i < first_predictions.size(0); ++i) {
    auto label = test_set.labels()[i].item<int64_t>();
    std::printf("image %lld: predicted %s, labelled %s\n", static_cast<long long>(i),
                kClasses[first_predictions[i].item<int64_t>()], kClasses[label]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: inference RUN_DIR [DATA_DIR]\n";
    return 2;
  }
  try {
    return run(argv[1], argc == 3 ? argv[2] : fashion_mnist::kDefaultDataDir);
  } catch (const trainrun::Error& e) {  // not a run directory, unreadable records
    std::cerr << "inference: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {  // a missing dataset or model file
    std::cerr << "inference: " << e.what() << "\n";
    return 1;
  }
}
