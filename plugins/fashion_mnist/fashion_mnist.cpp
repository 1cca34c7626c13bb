// FashionMNIST with ResNet-18, data-parallel: the recipe of the seeds. Adam
// (lr 1e-3, train::optim's multi-tensor or fused kernels), cross-entropy, batch 128 per worker,
// test accuracy after each epoch evaluated across ranks, report({loss, accuracy, epoch}) with a
// checkpoint (model, optimizer, epoch), from which a rerun of the same name resumes.
//
// Config: epochs (10), batch_size (128), lr (1e-3), data_dir, max_steps (per
// epoch, 0 = all), eval (true), eval_steps (test batches per rank, 0 = all), warmup_steps (5: steps
// before the throughput clock starts), seed (0), log_every (50), bucket_cap_mb (25),
// broadcast_buffers (true), compression ("none", "fp16" or "bf16"),
// checkpoint_upload ("sync", or "async": report returns before the upload),
// kernels (the optimizer's path: "auto", "per-tensor" (torch::optim's), "foreach"
// or "fused"), data ("tensors": normalised once and gathered a batch at a time;
// "samples": normalised per image and stacked, as LibTorch's own datasets do),
// resident (false; true with data=tensors: the training set in the device's
// memory, train::TensorDataset::to), capture (false; true: each step captured
// as a CUDA graph and replayed, train::CapturedStep, with drop_last), count_ops (false; true: the
// ATen operators of the step after the warm-up, by phase, in the first epoch's report: ops_data,
// ops_forward_backward (with the reducer's), ops_optimizer; train::OpCounter, the CPU's stand-in
// for launches), shards (a shard spec, local or s3://: the training images from
// WebDataset shards that fashion_mnist_pack wrote, read with train::ShardDataset;
// test_shards: the test images too, else from data_dir), loader_threads (2: with shards).

#include <train/train.h>

#include <torch/torch.h>

#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "fashion_mnist_dataset.h"
#include "resnet.h"

namespace {

using Clock = std::chrono::steady_clock;

// Sums each value across ranks, with train::all_reduce rather than
// process_group()'s allreduce: it survives a lost rank (--recovery in-place).
std::vector<double> sum_across_ranks(std::vector<double> values) {
  auto tensor = torch::tensor(values, torch::kFloat64);
  train::all_reduce(tensor);
  return {tensor.data_ptr<double>(), tensor.data_ptr<double>() + tensor.numel()};
}

double max_across_ranks(double value) {
  auto tensor = torch::tensor({value}, torch::kFloat64);
  train::all_reduce(tensor, c10d::ReduceOp::MAX);
  return tensor.item<double>();
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Test-set accuracy and loss, each rank evaluating its own share.
template <typename TestSet>
std::pair<double, double> evaluate(fashion_mnist::ResNet18& model, const TestSet& test_set,
                                   size_t batch_size, int max_batches) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto loader = train::prepare_data_loader(
      test_set, train::LoaderOptions()
                    .batch_size(batch_size)
                    .shuffle(false)
                    .allow_duplicates(false)
                    .max_batches(static_cast<size_t>(std::max(max_batches, 0))));
  double correct = 0, loss = 0, count = 0;
  for (torch::data::Example<>& batch : loader) {
    torch::Tensor output = model->forward(batch.data);
    loss += torch::nn::functional::cross_entropy(
                output, batch.target,
                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
    correct += output.argmax(1).eq(batch.target).sum().item<double>();
    count += static_cast<double>(batch.target.size(0));
  }
  model->train();
  auto totals = sum_across_ranks({correct, loss, count});
  return {totals[0] / totals[2], totals[1] / totals[2]};
}

train::Compression compression_of(const std::string& name) {
  if (name == "none") return train::Compression::kNone;
  if (name == "fp16") return train::Compression::kFP16;
  if (name == "bf16") return train::Compression::kBF16;
  throw std::invalid_argument("config compression must be none, fp16 or bf16, got '" + name + "'");
}

train::optim::Kernels kernels_of(const std::string& name) {
  for (auto kernels : {train::optim::Kernels::kAuto, train::optim::Kernels::kPerTensor,
                       train::optim::Kernels::kForeach, train::optim::Kernels::kFused}) {
    if (name == train::optim::to_string(kernels)) return kernels;
  }
  throw std::invalid_argument("config kernels must be auto, per-tensor, foreach or fused, got '" +
                              name + "'");
}

train::CheckpointUploadMode upload_mode_of(const std::string& name) {
  if (name == "sync") return train::CheckpointUploadMode::kSync;
  if (name == "async") return train::CheckpointUploadMode::kAsync;
  throw std::invalid_argument("config checkpoint_upload must be sync or async, got '" + name + "'");
}

// What the epochs need besides the data, set up once.
struct Run {
  train::Context ctx;
  int first_epoch, epochs, max_steps, eval_steps, warmup_steps, log_every;
  size_t batch_size;
  bool eval, count_ops, capture;
  train::CheckpointUploadMode upload_mode;
  fashion_mnist::ResNet18 model;
  train::optim::Adam& optimizer;
  c10::optional<size_t> loader_threads;  // none: the loader's default
};

// The epochs from run.first_epoch on, with a report and checkpoint after each.
template <typename TrainSet, typename TestSet>
void train_epochs(Run& run, TrainSet train_set, const TestSet& test_set) {
  const auto& ctx = run.ctx;
  auto& model = run.model;
  auto& optimizer = run.optimizer;
  const size_t batch_size = run.batch_size;
  const size_t train_size = train_set.size().value();
  auto loader = train::prepare_data_loader(
      std::move(train_set), train::LoaderOptions()
                                .batch_size(batch_size)
                                .shuffle(true)
                                .drop_last(run.capture)
                                .workers(run.loader_threads)
                                .max_batches(static_cast<size_t>(std::max(run.max_steps, 0))));
  const size_t steps_per_epoch = loader.size();
  if (ctx.world_rank() == 0) {
    std::cout << "FashionMNIST: " << train_size << " training images, " << ctx.world_size()
              << " workers x batch " << batch_size << " = global batch "
              << batch_size * ctx.world_size() << ", " << steps_per_epoch << " steps per epoch, on "
              << ctx.device() << ", Adam " << train::optim::to_string(optimizer.kernels())
              << std::endl;
  }
  // Over the loader's epochs: with --recovery in-place, a replacement for a
  // lost rank starts at the others' epoch and batch (its run.first_epoch is
  // the checkpoint's), with their model and Adam state.
  for (size_t loop_epoch : loader.epochs(static_cast<size_t>(std::max(run.first_epoch, 0)),
                                         static_cast<size_t>(std::max(run.epochs, 0)))) {
    const int epoch = static_cast<int>(loop_epoch);
    double loss_sum = 0, loss_count = 0, timed_samples = 0;
    int step = 0;
    Clock::time_point timed_start;
    std::unique_ptr<train::OpCounter> ops;  // from the warm-up's end to the next step's end
    train::Metrics op_counts;
    auto phase = [&](const char* name) {
      if (!ops) return;
      op_counts.emplace(name, ops->count());
      ops->reset();
    };
    train::CapturedStep train_step(
        [&](const torch::Tensor& data, const torch::Tensor& target) {
          torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(data), target);
          optimizer.zero_grad();
          loss.backward();
          phase("ops_forward_backward");
          optimizer.step();
          phase("ops_optimizer");
          return loss;
        },
        train::CaptureOptions().enabled(run.capture));
    for (torch::data::Example<>& batch : loader) {
      if (step == run.warmup_steps) timed_start = Clock::now();
      phase("ops_data");
      torch::Tensor loss = train_step(batch.data, batch.target);
      ops.reset();
      loss_sum += loss.item<double>();
      loss_count += 1;
      ++step;
      if (step > run.warmup_steps) timed_samples += static_cast<double>(batch.data.size(0));
      if (ctx.world_rank() == 0 && run.log_every > 0 && step % run.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << "/" << steps_per_epoch << " loss "
                  << loss.item<double>() << std::endl;
      }
      if (run.count_ops && epoch == run.first_epoch && step == run.warmup_steps) {
        ops = std::make_unique<train::OpCounter>();
      }
    }
    double seconds = step > run.warmup_steps
                         ? std::chrono::duration<double>(Clock::now() - timed_start).count()
                         : 0;
    auto totals = sum_across_ranks({loss_sum, loss_count, timed_samples});
    train::Metrics metrics{{"epoch", epoch},
                           {"loss", totals[0] / totals[1]},
                           {"steps", step},
                           {"peak_rss_mb", max_across_ranks(peak_rss_mb())}};
    if (seconds > 0) metrics.emplace("samples_per_s", totals[2] / seconds);
    metrics.insert(op_counts.begin(), op_counts.end());
    if (run.eval) {
      auto [accuracy, test_loss] = evaluate(model, test_set, batch_size, run.eval_steps);
      metrics.emplace("accuracy", accuracy);
      metrics.emplace("test_loss", test_loss);
    }
    // The replicas are identical: rank 0 saves the checkpoint for all.
    if (ctx.world_rank() == 0) {
      train::TempDir dir;
      torch::save(model, (dir.path() / "model.pt").string());
      torch::save(optimizer, (dir.path() / "optimizer.pt").string());
      std::ofstream(dir.path() / "epoch.txt") << epoch << "\n";
      train::report(metrics, train::Checkpoint::from_directory(dir.path()), run.upload_mode);
    } else {
      train::report(metrics);
    }
  }
}

}  // namespace

void fashion_mnist_train(const train::Config& config) {
  auto ctx = train::get_context();
  const double lr = config.get<double>("lr", 1e-3);
  const auto data_dir = config.get("data_dir", fashion_mnist::kDefaultDataDir);
  torch::manual_seed(config.get<int>("seed", 0));

  const auto kernels = kernels_of(config.get("kernels", "auto"));
  const auto data = config.get("data", "tensors");
  if (data != "tensors" && data != "samples") {
    throw std::invalid_argument("config data must be tensors or samples, got '" + data + "'");
  }
  auto images = [&](fashion_mnist::Split split) {
    return fashion_mnist::FashionMNIST(data_dir, split);
  };
  // Normalised once, then gathered a batch at a time; the bytes are let go.
  const bool resident = config.get<bool>("resident", false);
  auto tensors = [&](fashion_mnist::Split split) {
    auto raw = images(split);
    train::TensorDataset dataset(raw.normalized_images(), raw.labels());
    return resident && split == fashion_mnist::Split::kTrain ? dataset.to(ctx.device()) : dataset;
  };
  // Resume: model, optimizer and epoch from the latest committed checkpoint.
  auto checkpoint = train::get_checkpoint();
  int first_epoch = 0;
  fashion_mnist::ResNet18 net(10);
  if (checkpoint) {
    // Onto the CPU, where the net is until prepare_model moves it: a checkpoint
    // saved on a GPU resumes on a CPU and the other way round.
    torch::load(net, (checkpoint->path() / "model.pt").string(), torch::kCPU);
    std::ifstream(checkpoint->path() / "epoch.txt") >> first_epoch;
    ++first_epoch;
    if (ctx.world_rank() == 0) {
      std::cout << "resuming after epoch " << first_epoch - 1 << " from "
                << checkpoint->path().string() << std::endl;
    }
  }
  auto model = train::prepare_model(
      net, train::ModelOptions()
               .bucket_cap_mb(config.get<double>("bucket_cap_mb", 25))
               .broadcast_buffers(config.get<bool>("broadcast_buffers", true))
               .compression(compression_of(config.get("compression", "none"))));
  train::optim::Adam optimizer(model->parameters(), train::optim::AdamOptions(lr), kernels);
  if (checkpoint) {  // its state onto the parameters' device
    torch::load(optimizer, (checkpoint->path() / "optimizer.pt").string(), ctx.device());
  }
  Run run{ctx,
          first_epoch,
          config.get<int>("epochs", 10),
          config.get<int>("max_steps", 0),
          config.get<int>("eval_steps", 0),
          config.get<int>("warmup_steps", 5),
          config.get<int>("log_every", 50),
          static_cast<size_t>(config.get<int>("batch_size", 128)),
          config.get<bool>("eval", true),
          config.get<bool>("count_ops", false),
          config.get<bool>("capture", false),
          upload_mode_of(config.get("checkpoint_upload", "sync")),
          model,
          optimizer,
          c10::nullopt};
  // The training set first, so that a missing folder names its files.
  if (const auto spec = config.get("shards", ""); !spec.empty()) {
    // Each sample an .npy of 28x28 pixels and a .cls, made into what get()
    // makes of the idx files, on the loader's threads.
    auto image_of = [](const train::Sample& sample) {
      auto pixels = train::npy_tensor(sample.at("npy")).to(torch::kFloat32).div_(255);
      return torch::data::Example<>(
          pixels.sub_(fashion_mnist::kMean).div_(fashion_mnist::kStd).unsqueeze(0),
          torch::tensor(train::class_label(sample.at("cls"))));
    };
    run.loader_threads = static_cast<size_t>(config.get<int>("loader_threads", 2));
    train::ShardDataset train_set(spec, image_of);
    if (const auto test_spec = config.get("test_shards", ""); !test_spec.empty()) {
      train_epochs(run, std::move(train_set), train::ShardDataset(test_spec, image_of));
    } else {
      train_epochs(run, std::move(train_set), tensors(fashion_mnist::Split::kTest));
    }
  } else if (data == "tensors") {
    auto train_set = tensors(fashion_mnist::Split::kTrain);
    train_epochs(run, std::move(train_set), tensors(fashion_mnist::Split::kTest));
  } else {
    auto train_set = images(fashion_mnist::Split::kTrain);
    train_epochs(run, std::move(train_set), images(fashion_mnist::Split::kTest));
  }
}

TRAIN_FUNC(fashion_mnist_train);
