// Handing a checkpoint directory over for an asynchronous upload, on real
// directories: what is taken, what is refused, and what is cleaned up.

#include <trainrun/error.h>

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>

#include "common/network.h"
#include "temp_dir.h"
#include "worker/checkpoint_handover.h"

namespace fs = std::filesystem;
using trainrun::give_back_checkpoint;
using trainrun::hand_over_checkpoint;
using trainrun::KeptDirectory;

namespace {

fs::path make_checkpoint(const fs::path& dir) {
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "model.pt") << "weights";
  return dir;
}

// The message of the UsageError that hand_over_checkpoint throws, or "".
std::string refusal(const fs::path& dir, const std::vector<KeptDirectory>& kept = {}) {
  try {
    auto taken = hand_over_checkpoint(dir, 1, kept);
    trainrun::remove_handed_over_checkpoint(taken.dir);
  } catch (const trainrun::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a handed-over directory is renamed beside itself, whole, and can be given back") {
  TempDir tmp;
  auto dir = make_checkpoint(tmp.path / "ckpt");
  auto taken = hand_over_checkpoint(dir, 7, {});
  CHECK_FALSE(fs::exists(dir));
  CHECK(taken.source == fs::canonical(tmp.path) / "ckpt");
  CHECK(taken.dir.parent_path() == fs::canonical(tmp.path));
  CHECK(taken.dir.filename() ==
        "ckpt.trainrun-upload-" + trainrun::host_name() + "-" + std::to_string(::getpid()) + "-7");
  CHECK(fs::exists(taken.dir / "sub" / "model.pt"));
  CHECK(fs::exists(taken.dir.string() + ".lock"));
  // The same path can be written again at once.
  make_checkpoint(dir);
  CHECK(refusal(dir).empty());
  fs::remove_all(dir);
  CHECK(give_back_checkpoint(taken));
  CHECK(fs::exists(dir / "sub" / "model.pt"));
  CHECK_FALSE(fs::exists(taken.dir));
  CHECK_FALSE(fs::exists(taken.dir.string() + ".lock"));
}

TEST_CASE("links, files, the root and kept directories are refused and stay where they were") {
  TempDir tmp;
  auto target = make_checkpoint(tmp.path / "target");
  fs::create_directory_symlink(target, tmp.path / "link");
  for (const auto& form : {"link", "link/", "link/."}) {
    CAPTURE(form);
    CHECK(refusal(tmp.path / form).find("symbolic link") != std::string::npos);
  }
  CHECK(fs::exists(target / "sub" / "model.pt"));
  std::ofstream(tmp.path / "file") << "x";
  CHECK(refusal(tmp.path / "file").find("not a directory") != std::string::npos);
  CHECK(refusal("/").find("root directory") != std::string::npos);

  auto run = tmp.path / "results" / "run";
  make_checkpoint(run / "scratch");
  std::vector<KeptDirectory> kept{{run, "the run directory"},
                                  {tmp.path / "work", "the working directory", false}};
  CHECK(refusal(run / "scratch", kept).find("lies inside the run directory") != std::string::npos);
  CHECK(refusal(tmp.path / "results", kept).find("holds the run directory") != std::string::npos);
  CHECK(fs::exists(run / "scratch" / "sub" / "model.pt"));
  // Any run's directory or checkpoint, known or not, and what is inside them.
  auto other = make_checkpoint(tmp.path / "elsewhere" / "checkpoint_000001");
  std::ofstream(other / "manifest.json") << "{}";
  CHECK(refusal(other).find("it is a run directory or a checkpoint") != std::string::npos);
  CHECK(refusal(other / "sub").find("it lies inside a run directory or a checkpoint") !=
        std::string::npos);
  // A project's own run.json or manifest.json makes nothing a run.
  auto project = make_checkpoint(tmp.path / "project" / "ckpt");
  std::ofstream(tmp.path / "project" / "run.json") << "{}";
  std::ofstream(tmp.path / "project" / "manifest.json") << "{}";
  CHECK(refusal(project).empty());
  std::ofstream(tmp.path / "elsewhere" / "run.json") << "{}";
  std::ofstream(tmp.path / "elsewhere" / "result.jsonl") << "";
  CHECK(refusal(tmp.path / "elsewhere")
            .find("(" + (tmp.path / "elsewhere").string() + " holds run.json)") !=
        std::string::npos);
  CHECK(fs::exists(other / "sub" / "model.pt"));
  // Inside the working directory is where checkpoints are usually made.
  CHECK(refusal(make_checkpoint(tmp.path / "work" / "ckpt"), kept).empty());
  CHECK(refusal(tmp.path / "work", kept).find("holds the working directory") != std::string::npos);
}

TEST_CASE("a directory that holds, or lies inside, one being uploaded is refused") {
  TempDir tmp;
  auto taken = hand_over_checkpoint(make_checkpoint(tmp.path / "outer" / "step1"), 1, {});
  CHECK(refusal(tmp.path / "outer").find("holds a checkpoint being uploaded") != std::string::npos);
  CHECK(refusal(make_checkpoint(taken.dir / "inner"))
            .find("lies inside a checkpoint being uploaded") != std::string::npos);
  CHECK(fs::exists(taken.dir / "sub" / "model.pt"));
  trainrun::remove_handed_over_checkpoint(taken.dir);
  CHECK_FALSE(fs::exists(taken.dir));
  CHECK_FALSE(fs::exists(taken.dir.string() + ".lock"));
}

TEST_CASE("a hand-over deletes what gone processes left beside it: their locks are free") {
  TempDir tmp;
  // Left by a process that is gone: the lock file is there, nobody holds it.
  auto abandoned = make_checkpoint(tmp.path / "a.trainrun-upload-somehost-12345-3");
  std::ofstream(abandoned.string() + ".lock");
  // In use elsewhere (another process, host or container): its lock is held.
  auto in_use = make_checkpoint(tmp.path / "b.trainrun-upload-somehost-12345-4");
  int held = ::open((in_use.string() + ".lock").c_str(), O_RDWR | O_CREAT, 0600);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
  // Not ours at all: no lock file.
  auto unrelated = make_checkpoint(tmp.path / "c.trainrun-upload-elsewhere-1-1");
  auto taken = hand_over_checkpoint(make_checkpoint(tmp.path / "ckpt"), 4, {});
  CHECK_FALSE(fs::exists(abandoned));
  CHECK_FALSE(fs::exists(abandoned.string() + ".lock"));
  CHECK(fs::exists(in_use / "sub" / "model.pt"));
  CHECK(fs::exists(unrelated));
  ::close(held);
  // On the way out, what was handed over and never uploaded goes too.
  trainrun::remove_handed_over_checkpoints();
  CHECK_FALSE(fs::exists(taken.dir));
  CHECK_FALSE(fs::exists(taken.dir.string() + ".lock"));
}
