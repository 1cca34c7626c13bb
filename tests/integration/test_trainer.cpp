// train::Trainer in real runs (tests/plugins/trainer_plugin.cpp): resuming in
// the middle of an epoch after a kill -9 computes what the uninterrupted run
// computes; ModelCheckpoint's top k and EarlyStopping's count survive it;
// averages across ranks are weighted by batch size; ranks that log different
// names fail with both lists instead of hanging.

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "run_helpers.h"

namespace {

std::string trainer_run(const std::string& name, const std::string& config) {
  return std::string("--plugin '") + TRAINER_PLUGIN + "' -n 2 --name " + name + " " + config;
}

std::string line_with(const std::string& output, const std::string& start) {
  std::smatch match;
  if (std::regex_search(output, match, std::regex(start + "[^\n]*"))) return match.str();
  return "";
}

// Runs `config` whole and again with `failure` (a kill -9 of rank 1, with
// --max-failures 1), and checks that the resumed run computed what the whole
// one did, bit for bit: every step's loss and learning rate (StepLR), every
// epoch's mean loss and validation loss, and the model's parameters and
// buffers at the end. The model, optimizer, scheduler, the sampler's
// position, dropout's generator and the epoch's partial sums all came back.
// Returns both runs' reports.
std::pair<std::vector<nlohmann::json>, std::vector<nlohmann::json>> check_resume_is_exact(
    Sandbox& box, const std::string& config, const std::string& failure,
    const std::string& resumed_at) {
  auto whole = box.run(trainer_run("whole", config));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  auto marker = (box.root() / "failed-once").string();
  auto resumed = box.run(trainer_run(
      "resumed", config + " --max-failures 1 --config marker=" + marker + " " + failure));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("was killed by SIGKILL") != std::string::npos);
  CHECK(resumed.output.find("resuming at " + resumed_at) != std::string::npos);
  auto a = read_jsonl(box.run_dir("whole") / "result.jsonl");
  auto b = read_jsonl(box.run_dir("resumed") / "result.jsonl");
  for (const std::string metric : {"loss_step", "lr", "loss_epoch", "val_loss"}) {
    CAPTURE(metric);
    auto expected = by_step(a, metric);
    CHECK(expected.size() >= 2);
    CHECK((by_step(b, metric) == expected));
  }
  const auto bits = line_with(whole.output, "model bits [0-9a-f]+");
  CHECK_FALSE(bits.empty());
  CHECK(line_with(resumed.output, "model bits [0-9a-f]+") == bits);
  return {a, b};
}

}  // namespace

TEST_CASE("trainer: a rank killed mid-epoch resumes there and computes the uninterrupted losses") {
  Sandbox box;
  // A checkpoint every 3 steps; rank 1 dies after step 5, before its report.
  auto [a, b] = check_resume_is_exact(
      box,
      "--config epochs=2 --config batches=8 --config report_steps=1 --config checkpoint_steps=3",
      "--config fail_step=5", "epoch 0, batch 3 (step 3)");
  // Step 4 was reported twice: before the kill and after the resume from step 3.
  CHECK(b.size() == a.size() + 1);
  CHECK(by_step(a, "loss_step").size() == 16);
  // 10 validation samples per rank in batches of 4, 4 and 2: the batch size
  // weighted by batch size is 36/10, where a mean of batch means would be 10/3.
  CHECK(by_step(a, "batch_size").begin()->second == doctest::Approx(3.6));
}

TEST_CASE("trainer: with gradient accumulation and a progress value on one rank only, too") {
  Sandbox box;
  // 8 batches, a step every 2; a checkpoint every 2 steps (batch 4); rank 1
  // dies after step 3. Only rank 0 asks for the loss on the progress line:
  // every rank averages it anyway, no rank waits alone.
  check_resume_is_exact(box,
                        "--config epochs=2 --config batches=8 --config accumulate=2"
                        " --config report_steps=1 --config checkpoint_steps=2 --config log_every=1"
                        " --config prog_bar_rank0=true",
                        "--config fail_step=3", "epoch 0, batch 4 (step 2)");
}

TEST_CASE("trainer: a checkpoint at an epoch's last batch resumes into that epoch's validation") {
  Sandbox box;
  // Checkpoints at steps 4 and 8 (the epoch's last batch); rank 1 dies in
  // the validation that follows: the resumed run trains no batch of epoch 0,
  // and its epoch mean comes from the saved partial sums alone.
  check_resume_is_exact(
      box,
      "--config epochs=2 --config batches=8 --config report_steps=1 --config checkpoint_steps=4",
      "--config fail_in_validation=true", "epoch 0, batch 8 (step 8)");
}

TEST_CASE("trainer: a checkpoint that lacks a rank's own file is refused, not resumed from") {
  Sandbox box;
  const std::string config = "--config epochs=1 --config batches=8 --config checkpoint_steps=3";
  auto first = box.run(trainer_run("t", config));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // The latest checkpoint without rank 1's rank-1.pt, its manifest agreeing:
  // what a checkpoint kept without a lost rank's shard would be.
  const auto dir = box.run_dir("t");
  const auto latest = read_json(dir / "checkpoint_state.json")["latest"].get<std::string>();
  std::filesystem::remove(dir / latest / "rank-1.pt");
  auto manifest = read_json(dir / latest / "manifest.json");
  auto& files = manifest["files"];
  for (auto it = files.begin(); it != files.end(); ++it) {
    if ((*it)["path"] == "rank-1.pt") {
      files.erase(it);
      break;
    }
  }
  std::ofstream(dir / latest / "manifest.json") << manifest.dump();
  auto again = box.run(trainer_run("t", config + " --config epochs=2"));
  INFO(again.output);
  CHECK(again.exit_code == 1);
  CHECK(again.output.find("has no rank-1.pt, which rank 1 of the 2 that saved it writes") !=
        std::string::npos);
  CHECK(read_reports(dir / "result.jsonl").size() == 3);  // nothing trained on
}

TEST_CASE(
    "trainer: the top-k and early stopping survive a kill -9 and stop where they would have") {
  Sandbox box;
  // Scores per epoch: best 5, 3, (4), 2, then 6 twice: patience 2 stops after epoch 5.
  const std::string config =
      "--config epochs=8 --config batches=2 --config scores=5,3,4,2,6,6,6,6 --config patience=2"
      " --num-to-keep 2 --checkpoint-score-attribute score --checkpoint-score-order min";
  auto whole = box.run(trainer_run("whole", config));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  auto marker = (box.root() / "failed-once").string();
  // Killed in epoch 4 (steps 9 and 10), after epoch 3's checkpoint.
  auto resumed = box.run(trainer_run(
      "resumed", config + " --max-failures 1 --config fail_step=9" + " --config marker=" + marker));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resuming at epoch 4, batch 0 (step 8)") != std::string::npos);
  for (const auto* run : {&whole, &resumed}) {
    CHECK(line_with(run->output, "best_k:") == "best_k: 8=2 4=3");
    CHECK(line_with(run->output, "early_stopping:") == "early_stopping: wait 2 best 2");
    CHECK(line_with(run->output, "fit ended") == "fit ended at epoch 6 step 12");
  }
  // On storage: the best two by score and the latest, the same in both runs.
  auto kept = [&](const std::string& name) {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(box.run_dir(name))) {
      auto file = entry.path().filename().string();
      if (file.rfind("checkpoint_", 0) == 0 && entry.is_directory()) names.insert(file);
    }
    return names;
  };
  CHECK((kept("whole") ==
         std::set<std::string>{"checkpoint_000001", "checkpoint_000003", "checkpoint_000005"}));
  CHECK((kept("resumed") == kept("whole")));
}

TEST_CASE(
    "trainer: validations within an epoch are checked by ModelCheckpoint, gradients clipped by "
    "value") {
  Sandbox box;
  // Validation after batches 3 and 6 and at the epoch's end: three checks,
  // each saving (save_last), with gradients clipped by value.
  auto run =
      box.run(trainer_run("v",
                          "--config epochs=1 --config batches=8 --config val_every=3"
                          " --config scores=1,1 --config clip=0.001 --config clip_by_value=true"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto reports = read_reports(box.run_dir("v") / "result.jsonl");
  REQUIRE(reports.size() == 3);
  std::vector<int64_t> steps;
  for (const auto& r : reports) {
    CHECK(r.contains("checkpoint"));
    CHECK(r["metrics"].contains("val_loss"));
    steps.push_back(r["metrics"]["step"].get<int64_t>());
  }
  CHECK((steps == std::vector<int64_t>{3, 6, 8}));
}

TEST_CASE("trainer: capture on the CPU runs eagerly, says why, and trains as without it") {
  Sandbox box;
  // train::optim::Adam, a scheduler per epoch, gradients clipped by norm on
  // the device: a loop that could be captured on a GPU. Here the steps run
  // through the captured step's eager path, logging after each step.
  const std::string config =
      "--config epochs=2 --config batches=8 --config report_steps=1 --config sdk_optim=true"
      " --config epoch_scheduler=true --config clip=0.5";
  auto eager = box.run(trainer_run("eager", config));
  INFO(eager.output);
  REQUIRE(eager.exit_code == 0);
  auto captured = box.run(trainer_run("captured", config + " --config capture=true"));
  INFO(captured.output);
  REQUIRE(captured.exit_code == 0);
  CHECK(captured.output.find("train::CapturedStep: steps run eagerly: the batch is on cpu: a "
                             "CUDA graph captures GPU work") != std::string::npos);
  auto a = read_jsonl(box.run_dir("eager") / "result.jsonl");
  auto b = read_jsonl(box.run_dir("captured") / "result.jsonl");
  for (const std::string metric : {"loss_step", "lr", "loss_epoch", "val_loss"}) {
    CAPTURE(metric);
    CHECK(by_step(a, metric).size() >= 2);
    CHECK((by_step(b, metric) == by_step(a, metric)));
  }
}

TEST_CASE("trainer: capture says in one line why a loop it cannot replay runs eagerly") {
  Sandbox box;
  const std::string base = "--config epochs=1 --config batches=4 --config capture=true";
  struct Case {
    std::string name, config, reason;
  };
  for (const auto& c : std::vector<Case>{
           {"libtorch_optim", "",
            "train::Trainer: steps run eagerly: the optimizer is not train::optim's SGD, Adam or "
            "AdamW"},
           {"accumulate", " --config sdk_optim=true --config accumulate=2",
            "train::Trainer: steps run eagerly: accumulate_grad_batches is 2"},
           {"step_scheduler", " --config sdk_optim=true",
            "train::Trainer: steps run eagerly: the LR scheduler steps every optimizer step"},
           {"hook",
            " --config sdk_optim=true --config epoch_scheduler=true --config step_hook=true",
            "train::Trainer: steps run eagerly: callback 'StepHook' overrides "
            "on_before_optimizer_step"},
       }) {
    CAPTURE(c.name);
    auto run = box.run(trainer_run(c.name, base + c.config));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find(c.reason) != std::string::npos);
    // The hook is called at every step, eager as they are.
    if (c.name == "hook") {
      CHECK(run.output.find("on_before_optimizer_step calls: 4") != std::string::npos);
    }
  }
}

TEST_CASE("trainer: ModelCheckpoint on a step value saves only steps that beat the best so far") {
  Sandbox box;
  // No validation; the step loss, averaged at each step sync point, is the monitor.
  auto run = box.run(trainer_run("s",
                                 "--config epochs=1 --config batches=16 --config val_batches=0"
                                 " --config checkpoint_steps=2 --config monitor=loss_step"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  std::vector<double> saved;
  for (const auto& r : read_reports(box.run_dir("s") / "result.jsonl")) {
    if (r.contains("checkpoint")) saved.push_back(r["metrics"]["loss_step"].get<double>());
  }
  REQUIRE(!saved.empty());
  for (size_t i = 1; i < saved.size(); ++i) CHECK(saved[i] < saved[i - 1]);
}

TEST_CASE("trainer: a validation set that gives no rank a batch is refused at the start") {
  Sandbox box;
  auto run = box.run(trainer_run("small", "--config val_size=1"));
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("the validation set gives no batch to any of the 2 ranks") !=
        std::string::npos);
}

TEST_CASE("trainer: ranks that log different names fail with both lists instead of hanging") {
  Sandbox box;
  auto run =
      box.run(trainer_run("m", "--config epochs=1 --config batches=2 --config mismatch=true"));
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("the ranks logged different metrics to average") != std::string::npos);
  CHECK(run.output.find("rank 0 logged [loss_step, loss_epoch, lr], rank 1 [loss_step, "
                        "loss_epoch, lr, only_rank_1_step, only_rank_1_epoch]") !=
        std::string::npos);
}

TEST_CASE("trainer: the Lightning FashionMNIST example trains, validates and checkpoints") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + LIGHTNING_FASHION_MNIST_PLUGIN +
                     "' -n 2 --name l --config epochs=1 --config max_steps=3 --config "
                     "val_batches=1 --config batch_size=16 --config precision=bf16");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto results = read_jsonl(box.run_dir("l") / "result.jsonl");
  REQUIRE(results.size() == 1);
  const auto& metrics = results[0]["metrics"];
  CHECK(metrics["step"] == 3);
  CHECK(metrics.contains("accuracy"));
  CHECK(metrics.contains("val_loss"));
  CHECK(metrics.contains("loss_epoch"));
  CHECK(results[0].contains("checkpoint"));
}
