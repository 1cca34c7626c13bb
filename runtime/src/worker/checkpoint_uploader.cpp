#include "worker/checkpoint_uploader.h"

#include <trainrun/error.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "protocol/message.h"
#include "worker/checkpoint_handover.h"
#include "worker/checkpoint_transfer.h"

namespace trainrun {

CheckpointUploader::CheckpointUploader(zmq::context_t& context, const WorkerOptions& options,
                                       protocol::Attach attach) {
  thread_ = std::thread(
      [this, &context, options, attach = std::move(attach)] { run(context, options, attach); });
}

CheckpointUploader::~CheckpointUploader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
  for (const auto& job : jobs_) remove_handed_over_checkpoint(job.dir);
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
    connect_to_controller(controller, options, protocol::kUploadChannel);
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
      try {
        upload_checkpoint(controller, job.iteration, job.dir, job.files, &stop_);
      } catch (const std::exception& e) {
        // The controller fails the run as a storage error: without this it
        // would wait for the upload for ever.
        if (!stop_)
          (void)protocol::try_send(controller, protocol::Uploaded{job.iteration, {}, e.what()});
        throw;
      }
      remove_handed_over_checkpoint(job.dir);
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
