#pragma once

// The worker's train thread: loads the plugin, joins the process group and
// calls the entry. It has its own DEALER to the controller, opened with ATTACH,
// for everything the train function says and waits for (REPORT and its
// acknowledgement, checkpoint uploads and fetches; DONE or FAILED at the end):
// a report goes straight to the controller, not through the worker's main
// thread. The process group's store is the controller's (controller_store.h),
// on a third connection. This is the one file of the worker that includes
// LibTorch's distributed headers.

#include <zmq.hpp>

#include <filesystem>
#include <atomic>
#include <string>

#include "protocol/messages.h"
#include "worker/worker.h"

namespace trainrun {

/// Runs the assigned entry to completion on the calling thread, connected to
/// the controller as `options` say; always ends by sending DONE or FAILED.
/// `returned` is set once the entry has returned (or could not be called).
void run_train_thread(zmq::context_t& context, const WorkerOptions& options,
                      const protocol::Assign& assign, const std::filesystem::path& plugin_path,
                      std::atomic<bool>& returned);

}  // namespace trainrun
