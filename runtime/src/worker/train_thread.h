#pragma once

// The worker's train thread: loads the plugin, joins the process group and
// calls the entry. It talks to the worker's I/O thread only through an inproc
// PAIR socket (REPORT up, REPORT_ACK down; DONE or FAILED at the end), so the
// ZeroMQ DEALER stays owned by the I/O thread. This is the one file of the
// worker that includes LibTorch's distributed headers.

#include <zmq.hpp>

#include <filesystem>

#include "protocol/messages.h"

namespace trainrun {

/// Runs the assigned entry to completion on the calling thread; always ends by
/// sending DONE or FAILED on a PAIR socket connected to kTrainThreadEndpoint.
void run_train_thread(zmq::context_t& context, const protocol::Assign& assign,
                      const std::filesystem::path& plugin_path);

}  // namespace trainrun
