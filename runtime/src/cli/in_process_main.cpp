// The in-process worker module (common/in_process.h): the worker, loaded into
// the controller's process for `trainrun --local`, whose train function then
// runs on a thread of that process.

#include <chrono>

#include "common/in_process.h"
#include "worker/stacks.h"
#include "worker/worker.h"

extern "C" __attribute__((visibility("default"))) int trainrun_in_process_worker_v1(
    trainrun_in_process_v1* args) {
  if (args == nullptr || args->struct_size < sizeof(trainrun_in_process_v1)) return 2;
  trainrun::WorkerOptions options;
  options.connect = args->connect;
  options.index = 0;
  options.cache_dir = args->cache_dir;
  options.startup_timeout = std::chrono::milliseconds(args->startup_timeout_ms);
  options.secret = args->secret;
  options.in_process = true;
  options.plugin = args->plugin;
  options.stop_fd = args->stop_fd;
  // Walks of this process's stacks (`trainrun stacks`) run trainrun-worker:
  // this process's own executable is the controller's.
  trainrun::stacks::set_helper_executable(args->helper_executable);
  bool left_running = false;
  const int code = trainrun::run_worker_in_process(options, left_running);
  args->train_left_running = left_running ? 1 : 0;
  return code;
}
