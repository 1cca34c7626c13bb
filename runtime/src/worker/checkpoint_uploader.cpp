#include "worker/checkpoint_uploader.h"

#include <trainrun/error.h>

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "protocol/message.h"
#include "worker/checkpoint_transfer.h"

namespace trainrun {
namespace {

// Every directory handed over and not yet deleted, for the process's way out.
std::mutex handed_over_mutex;
std::set<std::filesystem::path>& handed_over() {
  static auto* dirs = new std::set<std::filesystem::path>;  // never destroyed: _Exit skips it
  return *dirs;
}

void forget(const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  handed_over().erase(dir);
}

void remove_handed_over(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  forget(dir);
}

// Whether `path` is `dir` or lies inside it (both absolute and normal).
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto relative = path.lexically_relative(dir);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

std::filesystem::path hand_over_checkpoint(const std::filesystem::path& dir, int64_t iteration,
                                           const std::vector<KeptDirectory>& kept) {
  const std::string refused = "cannot hand checkpoint directory " + dir.string() + " over";
  std::error_code ec;
  auto status = std::filesystem::symlink_status(dir, ec);
  if (std::filesystem::is_symlink(status)) {
    throw UsageError(refused + ": it is a symbolic link; pass the directory itself");
  }
  if (!std::filesystem::is_directory(status)) {
    throw UsageError(refused + ": it is not a directory");
  }
  auto path = std::filesystem::weakly_canonical(std::filesystem::absolute(dir), ec);
  if (ec) throw UsageError(refused + ": " + ec.message());
  for (const auto& keep : kept) {
    if (keep.path.empty()) continue;
    auto other = std::filesystem::weakly_canonical(keep.path, ec);
    if (ec) continue;  // gone: nothing to protect
    if (is_within(other, path) || (keep.inside_too && is_within(path, other))) {
      throw UsageError(refused + ": it " + (is_within(other, path) ? "holds" : "lies inside") +
                       " " + keep.what + " (" + other.string() +
                       "); asynchronous upload moves and deletes the directory it is given, so "
                       "pass one of the train function's own, or use CheckpointUploadMode::kSync");
    }
  }
  auto target = path.parent_path() / (path.filename().string() + ".trainrun-upload-" +
                                      std::to_string(::getpid()) + "-" + std::to_string(iteration));
  std::filesystem::remove_all(target, ec);  // a dead process's, of the same pid
  {
    std::lock_guard<std::mutex> lock(handed_over_mutex);
    if (::rename(path.c_str(), target.c_str()) != 0) {
      throw UsageError(refused + ": cannot move it to " + target.string() + ": " +
                       std::strerror(errno) +
                       " (asynchronous upload needs a directory whose parent it may write)");
    }
    handed_over().insert(target);
  }
  return target;
}

void give_back_checkpoint(const std::filesystem::path& handed_over,
                          const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  if (::rename(handed_over.c_str(), std::filesystem::absolute(dir).c_str()) == 0) {
    trainrun::handed_over().erase(handed_over);
  }
}

void remove_handed_over_checkpoints() {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  for (const auto& dir : handed_over()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  handed_over().clear();
}

CheckpointUploader::CheckpointUploader(zmq::context_t& context, const WorkerOptions& options,
                                       protocol::Attach attach) {
  thread_ = std::thread([this, &context, options, attach = std::move(attach)] {
    run(context, options, attach);
  });
}

CheckpointUploader::~CheckpointUploader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
  for (const auto& job : jobs_) remove_handed_over(job.dir);
}

void CheckpointUploader::submit(int64_t iteration, std::filesystem::path dir,
                                std::vector<protocol::CheckpointFile> files) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({iteration, std::move(dir), std::move(files)});
  }
  changed_.notify_all();
}

void CheckpointUploader::check() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throw Error("checkpoint upload failed: " + error_);
}

void CheckpointUploader::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return jobs_.empty() || !error_.empty(); });
  if (!error_.empty()) throw Error("checkpoint upload failed: " + error_);
}

void CheckpointUploader::run(zmq::context_t& context, const WorkerOptions& options,
                             protocol::Attach attach) {
  // setpriority on a thread id changes that thread only (Linux).
  auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  int nice = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, tid, std::min(nice + kUploadNice, 19));
  try {
    zmq::socket_t controller(context, zmq::socket_type::dealer);
    controller.set(zmq::sockopt::linger, 2000);  // UPLOADED gets out before the process ends
    connect_to_controller(controller, options);
    attach.channel = protocol::kUploadChannel;
    protocol::send(controller, attach);
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = jobs_.front();
      }
      upload_checkpoint(controller, job.iteration, job.dir, job.files, &stop_);
      remove_handed_over(job.dir);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        jobs_.pop_front();
      }
      changed_.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stop_) error_ = e.what();
  }
  changed_.notify_all();
}

}  // namespace trainrun
