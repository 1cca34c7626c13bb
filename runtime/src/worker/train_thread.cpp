#include "worker/train_thread.h"

#include <train/torch_compat.h>
#include <trainrun/error.h>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL  // a LibTorch built with CUDA and NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "common/fd.h"
#include "common/network.h"
#include "common/paths.h"
#include "common/seconds.h"
#include "protocol/message.h"
#include "storage/run_directory.h"
#include "storage/s3_config.h"
#include "transfer/checkpoint_files.h"
#include "worker/checkpoint_transfer.h"
#include "worker/checkpoint_uploader.h"
#include "worker/controller_store.h"
#include "worker/object_checkpoint.h"
#include "worker/object_reads.h"
#include "worker/plugin_library.h"
#include "worker/stacks.h"

namespace trainrun {
namespace {

// What the host table's callbacks reach through their opaque handle.
struct HostState {
  zmq::socket_t* controller = nullptr;  // the train thread's connection
  zmq::context_t* context = nullptr;    // ... for the upload thread's
  const WorkerOptions* options = nullptr;
  protocol::Attach attach;  // as the train thread's, for the upload thread's
  int world_rank = 0;
  int64_t reports = 0;
  bool stopped = false;           // a report's wait got SHUTDOWN: the run stops (in-process)
  std::string checkpoint_dir;     // the checkpoint to resume from, or empty
  bool fetch_checkpoint = false;  // ... on the controller's side: fetch it
  bool checkpoint_ready = false;  // verified, or fetched: local_checkpoint is it
  std::filesystem::path local_checkpoint;
  std::filesystem::path downloads;  // where fetched checkpoints go, made when needed
  std::unique_ptr<ObjectCheckpoint> object_checkpoint;  // one from object storage
  std::thread::id train_thread = std::this_thread::get_id();
  std::chrono::steady_clock::time_point progress_sent;  // the last PROGRESS
  std::filesystem::path run_dir, storage_root, cache_dir;
  // In-place recovery: the groups the controller announces, and what forms
  // one (the attempt's ASSIGN, the rendezvous store). The groups formed are
  // never destroyed: an old one's threads may wait for a dead peer until its
  // timeout, and destroying it would wait with them.
  GroupAnnouncements* groups = nullptr;
  // A replacement joins at the next step boundary: its group, from the vote
  // that said so, announced when this rank regroups there.
  std::optional<GroupAnnouncements::Group> pending_join;
  bool replacement = false;     // this rank replaces a lost one (ASSIGN's joining)
  bool reports_counted = true;  // ... and has taken the group's report count
  int joinable_told = -1;       // the last JOINABLE's value (-1: none went out)
  bool join_now = false;        // at the step boundary: regroup forms pending_join
  const protocol::Assign* assign = nullptr;
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<c10d::ProcessGroup*> formed;  // released, newest last
  std::atomic<bool> group_taken{false};     // to tell the controller (GROUP_TAKEN)
  bool group_taken_told = false;
  ObjectReads objects;  // the train function's data in object storage

  // GROUP_TAKEN goes out on the train thread's connection, from that thread.
  void tell_group_taken() {
    if (!group_taken || group_taken_told || std::this_thread::get_id() != train_thread) return;
    group_taken_told = true;
    protocol::send(*controller, protocol::GroupTaken{});
  }
  // Declared last: destroyed first, its thread stopped before the rest goes.
  std::optional<CheckpointUploader> uploader;  // from the first asynchronous checkpoint on

  // Called before DONE or FAILED goes out: after that the process may end at
  // any moment.
  void remove_downloads() {
    std::error_code ec;
    if (!downloads.empty()) std::filesystem::remove_all(downloads, ec);
    downloads.clear();
  }
  ~HostState() { remove_downloads(); }

  // What an asynchronous checkpoint must not be, lie in, or hold.
  std::vector<KeptDirectory> kept() const {
    std::error_code ec;
    return {{run_dir, "the run directory"},
            {storage_root, "the run's storage", /*inside_too=*/false},
            {checkpoint_dir, "the checkpoint the run resumed from"},
            {downloads, "the fetched checkpoints"},
            {cache_dir, "the plugin cache"},
            {std::filesystem::current_path(ec), "the working directory", /*inside_too=*/false}};
  }
};

void copy_message(const std::string& message, char* error, size_t error_size) {
  if (error_size == 0) return;
  size_t n = std::min(message.size(), error_size - 1);
  // A cut never splits a UTF-8 character: back to the start of the one it would.
  while (n > 0 && n < message.size() && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) {
    --n;
  }
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

protocol::Report make_report(HostState& state, const uint8_t* metrics, size_t metrics_size) {
  protocol::Report report;
  report.iteration = state.reports + 1;
  report.metrics.assign(reinterpret_cast<const char*>(metrics),
                        reinterpret_cast<const char*>(metrics) + metrics_size);
  return report;
}

// Waits for the acknowledgement (an Ack: ReportAck, or ArriveAck for the
// arrival before a report) of report `iteration`; 0, or 1 with the message.
template <typename Ack = protocol::ReportAck>
int await_ack(HostState& state, int64_t iteration, char* error, size_t error_size) {
  auto reply = protocol::Incoming::parse(protocol::recv_frames(*state.controller));
  if (reply.type() == Ack::kType && reply.as<Ack>().iteration == iteration) return 0;
  state.stopped = state.stopped || reply.type() == protocol::Shutdown::kType;
  copy_message("the run is stopping (" + reply.type() + ")", error, error_size);
  return 1;
}

int host_report(void* handle, const uint8_t* metrics, size_t metrics_size,
                const char* checkpoint_dir, char* error, size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  try {
    if (state.uploader) state.uploader->check();  // an upload that failed here fails this report
    state.tell_group_taken();
    auto report = make_report(state, metrics, metrics_size);
    if (checkpoint_dir != nullptr) {
      report.checkpoint = true;
      report.files = list_checkpoint_files(checkpoint_dir, state.world_rank);
    }
    ++state.reports;
    protocol::send(*state.controller, report);
    if (report.checkpoint) {
      upload_checkpoint(*state.controller, report.iteration, checkpoint_dir, report.files);
    }
    return await_ack(state, report.iteration, error, error_size);
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return 1;
}

// An asynchronous checkpoint: handed over and queued for the upload thread
// before its REPORT goes out, so the upload starts as soon as the controller
// makes room for it.
int host_report_checkpoint(void* handle, const uint8_t* metrics, size_t metrics_size,
                           const char* checkpoint_dir, uint32_t upload_mode, char* error,
                           size_t error_size) {
  if (upload_mode == TRAIN_UPLOAD_SYNC || checkpoint_dir == nullptr) {
    return host_report(handle, metrics, metrics_size, checkpoint_dir, error, error_size);
  }
  auto& state = *static_cast<HostState*>(handle);
  try {
    if (upload_mode != TRAIN_UPLOAD_ASYNC) {
      throw UsageError("unknown checkpoint upload mode " + std::to_string(upload_mode));
    }
    if (!state.uploader) state.uploader.emplace(*state.context, *state.options, state.attach);
    state.uploader->check();  // an earlier upload that failed here fails this report
    auto report = make_report(state, metrics, metrics_size);
    report.checkpoint = true;
    report.async = true;
    auto handed = hand_over_checkpoint(checkpoint_dir, report.iteration, state.kept());
    try {
      report.files = list_checkpoint_files(handed.dir, state.world_rank);
    } catch (const std::exception& e) {
      if (give_back_checkpoint(handed)) throw;
      throw UsageError(std::string(e.what()) + " (the directory is now " + handed.dir.string() +
                       ")");
    }
    ++state.reports;
    state.uploader->submit(report.iteration, handed.dir, report.files);
    protocol::send(*state.controller, report);
    return await_ack(state, report.iteration, error, error_size);
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return 1;
}

std::chrono::milliseconds collective_timeout(const protocol::Assign& assign) {
  return assign.collective_timeout_ms > 0 ? std::chrono::milliseconds(assign.collective_timeout_ms)
                                          : kProcessGroupDefaultTimeout;
}

void host_group_taken(void* handle) {
  auto& state = *static_cast<HostState*>(handle);
  state.group_taken = true;
  try {
    state.tell_group_taken();        // or with this thread's next message
  } catch (const std::exception&) {  // the train thread's next message fails the same way
  }
}

int64_t host_group_generation(void* handle) {
  return static_cast<HostState*>(handle)->groups->generation();
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const protocol::Assign& assign, const WorkerOptions& options,
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size);

// Joins the newest group announced after `after`: waits for its announcement,
// then for its members in the store. A member lost meanwhile fails the
// rendezvous, and the next generation is tried; all of it within the
// collective timeout.
void* host_regroup(void* handle, int64_t after, int64_t* generation, int32_t* rank, int32_t* size,
                   char* error, size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  try {
    // At the step boundary where a replacement joins (and only there: a
    // collective of the old group that failed meanwhile regroups without it).
    if (std::exchange(state.join_now, false) && state.pending_join &&
        state.pending_join->first > after) {
      state.groups->announce(state.pending_join->first, state.pending_join->second);
      state.pending_join.reset();
    }
    const auto timeout = collective_timeout(*state.assign);
    const auto began = std::chrono::steady_clock::now();
    const auto deadline = began + timeout;
    // A lost rank is announced within moments of its death: a collective
    // that failed with none announced within a heartbeat timeout failed for
    // another reason, and says so rather than wait out the collective timeout.
    // A replacement waits for the others' next step boundary instead.
    const bool joins = state.replacement && after == 0;
    const auto heartbeat = std::chrono::milliseconds(state.assign->heartbeat_timeout_ms);
    const auto announced_by =
        heartbeat.count() > 0 && !joins ? std::min(deadline, began + heartbeat) : deadline;
    std::string last_error =
        joins
            ? "no group to join within the collective timeout (" +
                  seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(timeout)) + ")"
            : "";
    while (true) {
      while (state.groups->generation() <= after) {
        const auto now = std::chrono::steady_clock::now();
        if (last_error.empty() && now >= announced_by) {
          throw Error("a collective failed, and the controller announced no lost rank within " +
                      seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(
                          announced_by - began)) +
                      ": the failure is not a lost rank's (a peer too slow for the collective "
                      "timeout, or a collective the backend refuses)");
        }
        if (now >= deadline) throw Error(last_error);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      auto [formed, members] = state.groups->newest();
      auto me = std::find(members.begin(), members.end(), state.world_rank);
      if (me == members.end()) throw Error("this rank is not in the group of the ranks left");
      const int my_rank = static_cast<int>(me - members.begin());
      const int my_size = static_cast<int>(members.size());
      try {
        auto group = create_process_group(
            *state.assign, *state.options, state.store,
            state.assign->store_prefix + "/gen-" + std::to_string(formed), my_rank, my_size);
        state.formed.push_back(group.release());
        *generation = formed;
        *rank = my_rank;
        *size = my_size;
        return state.formed.back();
      } catch (const std::exception& e) {
        last_error = e.what();  // a member lost while it formed: the next generation is tried
        after = formed;
      }
    }
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return nullptr;
}

// The vote on a synchronised step: answered by the controller once every
// rank of the group voted, or the group ended.
int host_step_vote(void* handle, int64_t step, int64_t generation, char* error, size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  try {
    state.tell_group_taken();
    protocol::send(*state.controller, protocol::StepVote{step, generation});
    const auto timeout = collective_timeout(*state.assign);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    zmq::pollitem_t item{state.controller->handle(), 0, ZMQ_POLLIN, 0};
    while (true) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        throw Error("no decision on step " + std::to_string(step) + " within the collective " +
                    "timeout (" + std::to_string(timeout.count() / 1000) + " s)");
      }
      auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      if (protocol::poll(&item, 1, std::min(wait, std::chrono::milliseconds(1000))) > 0) break;
    }
    auto reply = protocol::Incoming::parse(protocol::recv_frames(*state.controller));
    if (reply.type() == protocol::StepDecision::kType) {
      auto decision = reply.as<protocol::StepDecision>();
      if (decision.step == step) {
        if (!decision.apply) return 0;
        if (!state.reports_counted) {  // a replacement's first step in the group
          state.reports = std::max<int64_t>(decision.reports, 0);
          state.reports_counted = true;
        }
        if (decision.join <= generation) return 1;
        state.pending_join = GroupAnnouncements::Group{decision.join, std::move(decision.ranks)};
        return 2;
      }
    }
    state.stopped = state.stopped || reply.type() == protocol::Shutdown::kType;
    copy_message("the run is stopping (" + reply.type() + ")", error, error_size);
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return -1;
}

void host_joinable(void* handle, int32_t joinable) {
  auto& state = *static_cast<HostState*>(handle);
  if (std::this_thread::get_id() != state.train_thread || joinable < 0 || joinable > 2) return;
  if (joinable == 2) {
    state.join_now = true;
    return;
  }
  if (joinable == 0) state.pending_join.reset();  // the loop ended: none joins here
  if (state.joinable_told == joinable) return;
  state.joinable_told = joinable;
  try {
    protocol::send(*state.controller, protocol::Joinable{joinable == 1});
  } catch (const std::exception&) {  // the train thread's next message fails the same way
  }
}

int host_arrive(void* handle, char* error, size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  try {
    state.tell_group_taken();
    const int64_t iteration = state.reports + 1;
    protocol::send(*state.controller, protocol::Arrive{iteration});
    return await_ack<protocol::ArriveAck>(state, iteration, error, error_size);
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return 1;
}

// The group's first rank (the SDK sends from it alone) sends where its loader
// is at most every kProgressInterval, and an
// epoch's end (so the display shows it complete) unless one went out within
// kProgressMinInterval, without waiting: a full queue drops it. Only from the
// train thread, which owns the connection.
constexpr auto kProgressInterval = std::chrono::milliseconds(250);
constexpr auto kProgressMinInterval = std::chrono::milliseconds(20);

void host_progress(void* handle, int64_t epoch, int64_t batch, int64_t batches, int64_t steps,
                   int64_t samples) {
  auto& state = *static_cast<HostState*>(handle);
  if (std::this_thread::get_id() != state.train_thread) return;  // the SDK sends from one rank
  auto now = std::chrono::steady_clock::now();
  const bool epoch_end = batches > 0 && batch >= batches;
  if (now - state.progress_sent < (epoch_end ? kProgressMinInterval : kProgressInterval)) return;
  state.progress_sent = now;
  try {
    (void)protocol::try_send(*state.controller,
                             protocol::Progress{epoch, batch, batches, steps, samples});
  } catch (const std::exception&) {  // progress is never worth failing the run
  }
}

// The host's object reads: 0, 2 for no such object, 1 with a message.
template <typename Read>
int object_call(Read read, char* error, size_t error_size) {
  try {
    return read() ? 0 : 2;
  } catch (const s3::S3Error& e) {
    copy_message(e.what(), error, error_size);
    return e.status() == 404 || e.status() == 416 ? 2 : 1;
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
    return 1;
  }
}

int host_object_size(void* handle, const char* url, uint64_t* size, char* error,
                     size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  return object_call(
      [&] {
        const auto found = state.objects.size(url);
        if (found) *size = *found;
        return found.has_value();
      },
      error, error_size);
}

int host_read_object(void* handle, const char* url, uint64_t offset, uint64_t length, void* out,
                     char* error, size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  return object_call(
      [&] {
        state.objects.read(url, offset, length, out);
        return true;
      },
      error, error_size);
}

int host_get_checkpoint(void* handle, char* path, size_t path_size, char* error,
                        size_t error_size) {
  auto& state = *static_cast<HostState*>(handle);
  try {
    if (!state.checkpoint_ready && !state.checkpoint_dir.empty()) {
      if (s3::is_s3_url(state.checkpoint_dir)) {
        state.object_checkpoint =
            std::make_unique<ObjectCheckpoint>(state.checkpoint_dir, state.cache_dir);
        state.local_checkpoint = state.object_checkpoint->dir();
      } else if (state.fetch_checkpoint) {
        if (state.downloads.empty()) state.downloads = make_temp_dir("trainrun-checkpoint-");
        state.local_checkpoint =
            download_checkpoint(*state.controller, state.checkpoint_dir, state.downloads);
      } else {
        run_directory::verify_checkpoint(state.checkpoint_dir);  // checksums, once per worker
        state.local_checkpoint = state.checkpoint_dir;
      }
    }
    state.checkpoint_ready = true;
    auto local = state.local_checkpoint.string();
    if (local.size() + 1 > path_size) throw Error("checkpoint path too long");
    copy_message(local, path, path_size);
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  }
  return 1;
}

#ifdef USE_C10D_NCCL
// Names CUDA_VISIBLE_DEVICES when it is set: it renumbers and hides devices.
std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return "";
  return " (CUDA_VISIBLE_DEVICES=" + std::string(visible) + ")";
}
#endif

// Where Gloo listens for its peers: the address the controller chose, or with
// remote workers the one this host reaches the controller from (a UDP socket
// "connected" to it sends nothing, but the kernel picks the route), or the
// interface the worker was told to use.
std::shared_ptr<::gloo::transport::Device> gloo_device(const protocol::Assign& assign,
                                                       const WorkerOptions& options) {
  if (!assign.bind_host.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(assign.bind_host);
  }
  if (!options.interface.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(options.interface);
  }
  if (auto local = local_address_towards(options.connect)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(*local);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const protocol::Assign& assign, const WorkerOptions& options,
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size) {
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  const auto timeout = collective_timeout(assign);
  c10::Device device(assign.device);
  if (device.is_cuda()) {
#ifdef USE_C10D_NCCL
    const int devices = c10::cuda::device_count();
    if (device.index() >= devices) {
      throw Error("local rank " + std::to_string(assign.local_rank) + " needs " + assign.device +
                  " but this host has " + std::to_string(devices) + " CUDA device(s)" +
                  visible_devices_note());
    }
    c10::cuda::set_device(device.index());  // the train function runs on this thread
    return train::compat::make_nccl_group(prefixed, rank, size, device,
                                          gloo_device(assign, options), timeout);
#else
    throw Error("device " + assign.device + " needs a LibTorch built with CUDA and NCCL");
#endif
  }
  return train::compat::make_gloo_group(prefixed, rank, size, gloo_device(assign, options),
                                        timeout);
}

// Whether this worker shares the controller's run directory: the probe file
// ASSIGN names holds its token here (the same filesystem, at the same path),
// and a file can be created beside it (not mounted read-only, nor squashed).
bool shares_storage(const protocol::Assign& assign) {
  if (assign.storage_probe.empty() || assign.storage_token.empty()) return false;
  std::ifstream probe(assign.storage_probe, std::ios::binary);
  std::string content(assign.storage_token.size() + 1, '\0');
  probe.read(content.data(), static_cast<std::streamsize>(content.size()));
  content.resize(static_cast<size_t>(probe.gcount()));
  if (content != assign.storage_token) return false;
  auto written = assign.storage_probe + "." + std::to_string(::getpid());
  Fd fd(::open(written.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) return false;
  fd.reset();
  return ::unlink(written.c_str()) == 0;
}

// Whether `path` lies inside `dir` (both absolute, as the controller sends them).
bool is_inside(const std::string& path, const std::string& dir) {
  auto relative = std::filesystem::path(path).lexically_relative(dir);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

void run_train_thread(zmq::context_t& context, const WorkerOptions& options,
                      const protocol::Assign& assign, const std::filesystem::path& plugin_path,
                      std::atomic<bool>& returned, GroupAnnouncements& groups) {
  // Its stack is the one a hang's message names; an overflow of it still gets
  // a report (not in-process, where no handler of the worker's is installed).
  stacks::mark_train_thread();
  if (!options.in_process) stacks::give_this_thread_a_signal_stack();
  struct Returned {
    std::atomic<bool>& flag;
    ~Returned() { flag = true; }
  };
  zmq::socket_t controller(context, zmq::socket_type::dealer);
  controller.set(zmq::sockopt::linger, 2000);  // DONE or FAILED gets out before the process ends
  connect_to_controller(controller, options, protocol::kTrainChannel);
  const auto& secret = assign.attach_secret.empty() ? options.secret : assign.attach_secret;
  protocol::Attach attach{assign.world_rank, ::getpid(), secret};
  protocol::send(controller, attach);
  // Closed on the way out (the context cannot end while it is open), even
  // when the group that holds it is not destroyed.
  auto store = c10::make_intrusive<ControllerStore>(context, options, attach);
  struct CloseStore {
    ControllerStore& store;
    ~CloseStore() { store.close(); }
  } close_store{*store};
  auto failed_kind = FailureKind::kPlugin;
  std::string failed_message;
  std::vector<std::string> failed_stack;
  // Outlives FAILED: stopping an upload under way may take a moment, and the
  // controller must hear of the failure first.
  std::unique_ptr<HostState> state_holder;
  // Outlives the entry: a rank that fails must not close its connections before
  // the controller has its report, or its peers' collectives fail first and
  // look like the cause. The process ends without destroying it, unless the
  // entry returned (below).
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    stacks::name_library(plugin_path.filename().string(), assign.plugin_name);
    auto plugin = PluginLibrary::open(plugin_path);
    auto entry = plugin.entry(assign.entry);
    failed_kind = FailureKind::kSetup;
    if (assign.num_threads > 0) at::set_num_threads(assign.num_threads);
    // A replacement has no group until it joins the others' (host_regroup).
    if (!assign.joining) {
      group = create_process_group(assign, options, store, assign.store_prefix, assign.world_rank,
                                   assign.world_size);
    }

    state_holder = std::make_unique<HostState>();
    auto& state = *state_holder;
    state.controller = &controller;
    state.context = &context;
    state.options = &options;
    state.attach = attach;
    state.world_rank = assign.world_rank;
    state.groups = &groups;
    state.replacement = assign.joining;
    state.reports_counted = !assign.joining;
    state.assign = &assign;
    state.store = store;
    state.checkpoint_dir = assign.checkpoint_dir;
    if (!s3::is_s3_url(assign.storage_path)) {  // nothing on this host to keep
      state.storage_root = assign.storage_path;
      state.run_dir = std::filesystem::path(assign.storage_path) / assign.run_name;
    }
    state.cache_dir = options.cache_dir;
    // A remote worker that sees the storage copies its checkpoints there, and
    // reads the one to resume from in place when it is in the storage too
    // (--resume-from may name one on the controller's own disk).
    const bool sees_storage = shares_storage(assign);
    state.fetch_checkpoint =
        assign.fetch_checkpoint &&
        !(sees_storage && is_inside(assign.checkpoint_dir, assign.storage_path));
    train_host_v1_t host{};
    host.abi_version = TRAIN_PLUGIN_ABI_VERSION;
    host.struct_size = sizeof(host);
    host.handle = &state;
    host.world_rank = assign.world_rank;
    host.local_rank = assign.local_rank;
    host.node_rank = assign.node_rank;
    host.world_size = assign.world_size;
    host.local_world_size = assign.local_world_size;
    host.device = assign.device.c_str();
    host.run_name = assign.run_name.c_str();
    host.storage_path = assign.storage_path.c_str();
    host.config = reinterpret_cast<const uint8_t*>(assign.config.data());
    host.config_size = assign.config.size();
    host.process_group = group.get();
    host.report = &host_report;
    host.get_checkpoint = &host_get_checkpoint;
    host.progress = &host_progress;
    host.report_checkpoint = &host_report_checkpoint;
    host.arrive = &host_arrive;
    // Beside the run's results where this worker sees them (a local worker,
    // or a remote one that shares the storage), else in its cache.
    const bool sees_run_dir = !state.run_dir.empty() && (options.index >= 0 || sees_storage);
    const auto profile_path =
        (sees_run_dir ? state.run_dir / "profiles"
                      : std::filesystem::path(options.cache_dir) / "profiles" / assign.run_name) /
        ("rank-" + std::to_string(assign.world_rank) + ".json");
    const auto profile_text = profile_path.string();
    host.profile_first = assign.profile_first;
    host.profile_last = assign.profile_last;
    host.profile_path = profile_text.c_str();
    host.in_place = assign.in_place && c10::Device(assign.device).is_cpu() ? 1 : 0;
    host.group_generation = &host_group_generation;
    host.regroup = &host_regroup;
    host.step_vote = &host_step_vote;
    host.group_taken = &host_group_taken;
    host.joining = assign.joining ? 1 : 0;
    host.joinable = &host_joinable;
    host.object_size = &host_object_size;
    host.read_object = &host_read_object;

    failed_kind = FailureKind::kException;
    protocol::send(controller, protocol::Started{assign.world_rank, sees_storage});
    std::vector<char> error(16 * 1024, '\0');
    stacks::forget_last_throw();
    int rc = 0;
    {
      Returned on_return{returned};
      rc = entry(&host, error.data(), error.size());
    }
    state.remove_downloads();
    // The run ends with the last checkpoint uploaded (the controller commits
    // it once every rank's is in).
    if (rc == TRAIN_OK && state.uploader) state.uploader->wait();
    if (rc == TRAIN_OK) {
      protocol::send(controller, protocol::Done{state.reports});
      if (c10::Device(assign.device).is_cpu()) {
        // Closes this rank's Gloo connections, as a process that exits does: a
        // rank still in (or entering) a collective with it fails at once, not
        // at the collective timeout. Every collective this rank took part in
        // is complete here, its bytes sent. After a recovery in place that is
        // the newest group; the older ones may still wait for a lost peer.
        if (!state.formed.empty()) {
          (void)group.release();
          group = c10::intrusive_ptr<c10d::ProcessGroup>::reclaim(state.formed.back());
          state.formed.pop_back();
        }
        group.reset();
      } else {
        (void)group.release();  // NCCL: its peers cannot be told this way
      }
      return;
    }
    failed_message = error.data();
    if (rc != TRAIN_ERROR_EXCEPTION) failed_kind = FailureKind::kPlugin;
    if (state.stopped) failed_kind = FailureKind::kInterrupted;  // what a stop made it raise
    // The entry caught it; the last throw on this thread is where it began.
    if (rc == TRAIN_ERROR_EXCEPTION) failed_stack = stacks::last_throw(failed_message);
  } catch (const std::exception& e) {
    failed_message = e.what();
  }
  returned = true;
  protocol::send(controller, protocol::Failed{failed_message, std::string(to_string(failed_kind)),
                                              std::move(failed_stack)});
  // A worker process ends without destroying it (above). An in-process one's
  // process goes on: a CPU group of its one rank, which has no peers to
  // mislead, is closed rather than left with its threads.
  if (options.in_process && c10::Device(assign.device).is_cpu()) {
    group.reset();
  } else {
    (void)group.release();
  }
}

}  // namespace trainrun
