// End to end on GPUs: the trainrun executable with --use-gpu, real worker
// processes, NCCL, files. Each case needs the CUDA devices it names and is
// skipped (gpu_skip.h) where there are fewer.

#include <torch/cuda.h>

#include <cmath>
#include <cstdlib>

#include "doctest_torch.h"
#include "gpu_skip.h"
#include "run_helpers.h"

namespace {

std::string plugin(const char* path) { return std::string("--plugin '") + path + "'"; }

// FashionMNIST for `epochs` epochs of `steps` steps of batch 64, no evaluation;
// from $FASHION_MNIST_DIR where set (tools/gpu/run.sh), else the Debian package's.
std::string fashion_mnist(int epochs, int steps) {
  const char* data_dir = std::getenv("FASHION_MNIST_DIR");
  return plugin(FASHION_MNIST_PLUGIN) + " --config epochs=" + std::to_string(epochs) +
         " --config max_steps=" + std::to_string(steps) +
         " --config batch_size=64 --config eval=false --config warmup_steps=1" +
         (data_dir ? std::string(" --config 'data_dir=") + data_dir + "'" : std::string());
}

}  // namespace

TEST_CASE("1 worker on cuda:0 trains FashionMNIST and its loss falls") {
  skip_unless_gpus(1);
  Sandbox box;
  auto run = box.run(fashion_mnist(3, 40) + " --use-gpu -n 1 --name gpu");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("steps per epoch, on cuda:0") != std::string::npos);
  auto reports = read_jsonl(box.run_dir("gpu") / "result.jsonl");
  REQUIRE(reports.size() == 3);
  const double first = reports.front()["metrics"]["loss"].get<double>();
  const double last = reports.back()["metrics"]["loss"].get<double>();
  CHECK(std::isfinite(last));
  CHECK(last < first * 0.8);
  CHECK(read_json(box.run_dir("gpu") / "run.json")["scaling"]["use_gpu"] == true);
}

TEST_CASE("a checkpoint saved on GPU resumes on CPU, and one saved on CPU resumes on GPU") {
  skip_unless_gpus(1);
  Sandbox box;
  auto on_gpu = box.run(fashion_mnist(1, 10) + " --use-gpu -n 1 --name moved");
  INFO(on_gpu.output);
  REQUIRE(on_gpu.exit_code == 0);
  auto on_cpu = box.run(fashion_mnist(2, 10) + " -n 1 --name moved");
  INFO(on_cpu.output);
  REQUIRE(on_cpu.exit_code == 0);
  CHECK(on_cpu.output.find("resuming after epoch 0") != std::string::npos);
  auto back = box.run(fashion_mnist(3, 10) + " --use-gpu -n 1 --name moved");
  INFO(back.output);
  REQUIRE(back.exit_code == 0);
  CHECK(back.output.find("resuming after epoch 1") != std::string::npos);
  auto reports = read_jsonl(box.run_dir("moved") / "result.jsonl");
  REQUIRE(reports.size() == 3);
  for (const auto& report : reports) CHECK(std::isfinite(report["metrics"]["loss"].get<double>()));
}

TEST_CASE("more workers than GPUs on a host fail with the device each rank lacks") {
  skip_unless_gpus(1);
  const int workers = cuda_devices() + 1;
  Sandbox box;
  auto run = box.run(plugin(QUICKSTART_PLUGIN) + " --use-gpu -n " + std::to_string(workers) +
                     " --name over");
  INFO(run.output);
  CHECK(run.exit_code != 0);
  CHECK(run.output.find("needs cuda:" + std::to_string(workers - 1) + " but this host has " +
                        std::to_string(workers - 1) + " CUDA device(s)") != std::string::npos);
}

TEST_CASE("DDP equivalence on 2 CUDA devices with NCCL: 2 workers end where 1 does") {
  skip_unless_gpus(2);
  Sandbox box;
  const auto ddp = plugin(DDP_PLUGIN) + " --use-gpu --entry equivalence";
  auto one = box.run(ddp + " -n 1 --name one --config out=" + (box.root() / "one.txt").string());
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  auto two = box.run(ddp + " -n 2 --name two --config out=" + (box.root() / "two.txt").string() +
                     " --config bucket_cap_mb=0.002 --config first_bucket_cap_mb=0.001");
  INFO(two.output);
  REQUIRE(two.exit_code == 0);
  CHECK(largest_difference(box.root() / "one.txt", box.root() / "two.txt") < 1e-4);
  CHECK(read_jsonl(box.run_dir("two") / "result.jsonl").back()["metrics"]["replica_spread"] == 0.0);
}

TEST_CASE("the Trainer in 16-mixed on cuda:0 resumes after a kill -9 to the uninterrupted losses") {
  skip_unless_gpus(1);
  Sandbox box;
  // train::Autocast to float16 and a GradScaler (its scale in the checkpoint),
  // the CUDA generator in rank-0.pt; a checkpoint every 3 steps, rank 0 killed
  // after step 5.
  const std::string run_args = plugin(TRAINER_PLUGIN) +
                               " --use-gpu -n 1 --config precision=16-mixed --config epochs=2"
                               " --config batches=8 --config report_steps=1"
                               " --config checkpoint_steps=3";
  auto whole = box.run(run_args + " --name whole");
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  auto marker = (box.root() / "failed-once").string();
  auto resumed = box.run(run_args + " --name resumed --max-failures 1 --config fail_step=5" +
                         " --config fail_rank=0 --config marker=" + marker);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resuming at epoch 0, batch 3 (step 3)") != std::string::npos);
  auto a = by_step(read_jsonl(box.run_dir("whole") / "result.jsonl"), "loss_step");
  auto b = by_step(read_jsonl(box.run_dir("resumed") / "result.jsonl"), "loss_step");
  REQUIRE(a.size() == 16);
  REQUIRE(b.size() == a.size());
  for (const auto& [step, loss] : a) {
    CAPTURE(step);
    CHECK(std::isfinite(loss));
    CHECK(b[step] == doctest::Approx(loss).epsilon(1e-6));
  }
}

TEST_CASE("the Trainer's captured step on cuda:0 trains as its eager steps do") {
  skip_unless_gpus(1);
  Sandbox box;
  // train::optim::Adam, StepLR per epoch (the learning rate halves after
  // epoch 3: the step is captured again at each epoch), gradients clipped by
  // norm on the device, losses logged as tensors, no dropout (a graph draws
  // its random numbers from other offsets); in float32 and 16-mixed.
  const std::string run_args = plugin(TRAINER_PLUGIN) +
                               " --use-gpu -n 1 --config epochs=5 --config batches=8"
                               " --config report_steps=1 --config sdk_optim=true"
                               " --config epoch_scheduler=true --config log_lr=false"
                               " --config clip=0.5 --config dropout=false";
  auto losses = [&](const std::string& name) {
    return by_step(read_jsonl(box.run_dir(name) / "result.jsonl"), "loss_step");
  };
  auto check_close = [](std::map<int64_t, double> a, std::map<int64_t, double> b) {
    REQUIRE(a.size() == 40);
    REQUIRE(b.size() == a.size());
    for (const auto& [step, value] : a) {
      CAPTURE(step);
      CHECK(std::isfinite(value));
      CHECK(b[step] == doctest::Approx(value).epsilon(1e-4));
    }
  };
  for (const std::string precision : {"32", "16-mixed"}) {
    CAPTURE(precision);
    const auto args = run_args + " --config precision=" + precision;
    auto eager = box.run(args + " --name eager" + precision);
    INFO(eager.output);
    REQUIRE(eager.exit_code == 0);
    auto captured = box.run(args + " --name captured" + precision + " --config capture=true");
    INFO(captured.output);
    REQUIRE(captured.exit_code == 0);
    CHECK(captured.output.find("train::CapturedStep: captured the step") != std::string::npos);
    CHECK(captured.output.find("steps run eagerly") == std::string::npos);
    check_close(losses("eager" + precision), losses("captured" + precision));
    for (const std::string metric : {"loss_epoch", "val_loss"}) {
      CAPTURE(metric);
      auto a = by_step(read_jsonl(box.run_dir("eager" + precision) / "result.jsonl"), metric);
      auto b = by_step(read_jsonl(box.run_dir("captured" + precision) / "result.jsonl"), metric);
      REQUIRE(a.size() == 5);
      REQUIRE(b.size() == a.size());
      for (const auto& [step, value] : a) CHECK(b[step] == doctest::Approx(value).epsilon(1e-4));
    }
  }
  // A number from the host logged in the step cannot be replayed: the capture
  // fails, that batch runs again eagerly, and so do the rest, as without capture.
  auto host = box.run(run_args + " --name host --config capture=true --config log_lr=true");
  INFO(host.output);
  REQUIRE(host.exit_code == 0);
  CHECK(host.output.find("training_step logs 'lr' as a number, which a replayed step cannot "
                         "compute again") != std::string::npos);
  check_close(losses("eager32"), losses("host"));
}
