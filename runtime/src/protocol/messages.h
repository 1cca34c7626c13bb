#pragma once

// The messages between controller and workers, one struct each. A worker says
// HELLO, gets ASSIGN, fetches the plugin (FETCH_CHUNK) if its cache lacks it, and
// sends heartbeats, all on its main thread's connection. Its train thread then
// opens a connection of its own, which begins with ATTACH and carries all the
// train function says and waits for, with no hop through the main thread:
// STARTED once the plugin is loaded and the process group formed; then REPORTs
// (acknowledged once every rank reached the same one), rank 0's PROGRESS (never
// answered), and DONE or FAILED. The
// controller ends every worker with SHUTDOWN, on the main connection.
//
// The process group's rendezvous store is the controller's: a third
// connection per worker (ATTACH with channel "store") carries c10d::Store
// operations as STORE requests, each answered by a STORE_REPLY with the same
// id; a GET or WAIT is answered once its keys exist.
//
// A REPORT with a checkpoint lists the rank's files; the controller answers
// UPLOAD. With a staging directory the worker copies its files there itself
// (it shares the controller's filesystem); without one it streams them as
// UPLOAD_CHUNKs, never more than the credit the controller granted (one
// UPLOAD_CREDIT back per chunk written). Either way it ends with UPLOADED,
// carrying each file's sha256. A REPORT with `async` set (the rank handed its
// directory over) is acknowledged once every rank reported, without waiting
// for the upload: its UPLOAD, chunks, credits and UPLOADED go over a fourth
// connection (ATTACH with channel "upload"), the worker's upload thread's. A
// worker that cannot see the storage fetches the
// checkpoint to resume from with FETCH_CHECKPOINT (the listing comes back as
// CHECKPOINT_LISTING) and FETCH_CHUNK requests.
//
// A node agent (`trainrun worker --nproc N`) starts N workers on its host and
// speaks for them on a connection of its own, which begins with AGENT (its
// host, and the pids of the workers it started): OUTPUT carries what one of
// them wrote, EXITED how one ended, which only its parent can know. The
// controller answers AGENT_ACCEPTED, sends it heartbeats, and SHUTDOWN at the
// end, after which the agent gives its workers a grace period to exit. When a
// failure starts a new attempt, SHUTDOWN says restart: the agent ends its
// workers, reports their exits and waits; RESTART has it start new ones and
// announce them with a new AGENT on the same connection.
//
// Downloads, of the plugin and of a checkpoint, are one mechanism: the worker
// asks for each chunk (FETCH_CHUNK: source, file, offset, length), at most a
// credit's worth in flight, and the controller answers each with a CHUNK and
// its bytes, in the order asked (transfer/chunk_pull.h).

#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::protocol {

/// One file of a checkpoint: its path inside the checkpoint ('/'-separated,
/// relative), size, and sha256 once known.
struct CheckpointFile {
  std::string path;
  uint64_t size = 0;
  std::string sha256;
  MSGPACK_DEFINE_MAP(path, size, sha256);
};

// Worker -> controller.

struct Hello {
  static constexpr const char* kType = "HELLO";
  int32_t index = 0;  // the worker's launch index (local workers) or -1
  std::string host;
  int64_t pid = 0;
  std::string secret;     // the run's worker secret (common/secret.h)
  int32_t attempt = 0;    // a node agent's worker: the attempt it was started for; 0 = any
  int64_t agent_pid = 0;  // a node agent's worker: the agent's pid; 0 = none
  MSGPACK_DEFINE_MAP(index, host, pid, secret, attempt, agent_pid);
};

/// The connections a worker opens after HELLO, each beginning with ATTACH.
inline constexpr const char* kTrainChannel = "train";
inline constexpr const char* kStoreChannel = "store";
/// The upload thread's: asynchronous checkpoint uploads (UPLOAD, UPLOAD_CHUNK,
/// UPLOAD_CREDIT, UPLOADED), opened at the first one.
inline constexpr const char* kUploadChannel = "upload";

struct Attach {  // the first message on a train thread's, a store's or an upload connection
  static constexpr const char* kType = "ATTACH";
  int32_t rank = 0;  // as assigned
  int64_t pid = 0;
  std::string secret;
  std::string channel = kTrainChannel;
  MSGPACK_DEFINE_MAP(rank, pid, secret, channel);
};

/// What a FETCH_CHUNK asks for: the plugin (file 0), or a file of the
/// checkpoint to resume from (CHECKPOINT_LISTING's index).
inline constexpr const char* kPluginSource = "plugin";
inline constexpr const char* kCheckpointSource = "checkpoint";

struct FetchChunk {
  static constexpr const char* kType = "FETCH_CHUNK";
  std::string source;  // kPluginSource or kCheckpointSource
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  MSGPACK_DEFINE_MAP(source, file, offset, length);
};

struct Report {
  static constexpr const char* kType = "REPORT";
  int64_t iteration = 0;
  std::vector<char> metrics;  // msgpack map, as train::report encoded it
  bool checkpoint = false;    // this rank passes a checkpoint: the files follow in an upload
  std::vector<CheckpointFile> files;  // its files, without sha256
  /// The files were handed over: the upload follows on the rank's upload
  /// connection, and the report is acknowledged without waiting for it.
  bool async = false;
  MSGPACK_DEFINE_MAP(iteration, metrics, checkpoint, files, async);
};

/// A rank reached its report `iteration` and waits, answered by ARRIVE_ACK
/// once every rank has: what comes before the report's own collectives (the
/// replica check), so that a rank that never reports ends the run instead.
struct Arrive {
  static constexpr const char* kType = "ARRIVE";
  int64_t iteration = 0;
  MSGPACK_DEFINE_MAP(iteration);
};

/// In-place recovery: this rank's collectives of synchronised step `step`
/// completed in the group of `generation`. Answered by STEP_DECISION.
struct StepVote {
  static constexpr const char* kType = "STEP_VOTE";
  int64_t step = 0;
  int64_t generation = 0;
  MSGPACK_DEFINE_MAP(step, generation);
};

/// A replacement (docs/design.md): the rank's train function takes a
/// replacement at its step boundaries (train::Trainer); on the replacement,
/// it waits to join. No reply.
struct Joinable {
  static constexpr const char* kType = "JOINABLE";
  bool joinable = true;
  MSGPACK_DEFINE_MAP(joinable);
};

/// In-place recovery: the rank's train function took the process group
/// itself (train::process_group), so a lost rank restarts the group. No reply.
struct GroupTaken {
  static constexpr const char* kType = "GROUP_TAKEN";
  bool taken = true;
  MSGPACK_DEFINE_MAP(taken);
};

struct UploadChunk {  // followed by one blob frame with the bytes
  static constexpr const char* kType = "UPLOAD_CHUNK";
  uint32_t file = 0;  // index into the REPORT's files
  uint64_t offset = 0;
  MSGPACK_DEFINE_MAP(file, offset);
};

struct Uploaded {
  static constexpr const char* kType = "UPLOADED";
  int64_t iteration = 0;
  std::vector<CheckpointFile> files;  // with sha256
  std::string error;                  // why the upload failed, or empty
  MSGPACK_DEFINE_MAP(iteration, files, error);
};

struct FetchCheckpoint {
  static constexpr const char* kType = "FETCH_CHECKPOINT";
  std::string checkpoint_dir;  // as ASSIGN named it
  MSGPACK_DEFINE_MAP(checkpoint_dir);
};

/// A c10d::Store operation; `op` names one of StoreOp (protocol/store_op.h).
struct StoreRequest {
  static constexpr const char* kType = "STORE";
  uint64_t id = 0;  // echoed in the reply; a reply to an older id is stale
  std::string op;
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> values;  // SET: 1; COMPARE_SET: expected, desired
  int64_t amount = 0;                        // ADD
  MSGPACK_DEFINE_MAP(id, op, keys, values, amount);
};

struct Started {  // the train thread is about to call the entry: the plugin loaded, the group
                  // formed
  static constexpr const char* kType = "STARTED";
  int32_t rank = 0;
  bool shares_storage = false;  // it read ASSIGN's storage probe: it copies its checkpoints itself
  MSGPACK_DEFINE_MAP(rank, shares_storage);
};

struct Progress {  // rank 0's training loader, at most a few times a second; no reply
  static constexpr const char* kType = "PROGRESS";
  int64_t epoch = 0;    // the loader's
  int64_t batch = 0;    // batches done in this epoch ...
  int64_t batches = 0;  // ... of these
  int64_t steps = 0;    // batches done since the train function began
  int64_t samples = 0;  // samples done on this rank since then
  MSGPACK_DEFINE_MAP(epoch, batch, batches, steps, samples);
};

struct Done {
  static constexpr const char* kType = "DONE";
  int64_t reports = 0;
  MSGPACK_DEFINE_MAP(reports);
};

struct Failed {
  static constexpr const char* kType = "FAILED";
  std::string message;
  std::string kind;  // a FailureKind's name: "exception", "plugin", "setup", "lost"
  // Where the exception was thrown, innermost frame first, where known.
  std::vector<std::string> stack{};
  MSGPACK_DEFINE_MAP(message, kind, stack);
};

// Stacks on request: the controller asks a worker's main thread (STACKS), which
// stops each of the process's threads for a moment to record its frames, and
// answers with all of them (STACKS_REPLY, the same id).
struct Stacks {
  static constexpr const char* kType = "STACKS";
  int64_t id = 0;
  MSGPACK_DEFINE_MAP(id);
};

struct ThreadStack {
  int64_t tid = 0;
  std::string name;
  std::vector<std::string> frames;  // innermost first
  bool answered = true;             // false: the walk did not reach it
  bool train = false;               // it runs the train function
  MSGPACK_DEFINE_MAP(tid, name, frames, answered, train);
};

struct StacksReply {
  static constexpr const char* kType = "STACKS_REPLY";
  int64_t id = 0;
  std::vector<ThreadStack> threads;
  MSGPACK_DEFINE_MAP(id, threads);
};

struct AgentHello {  // the first message on a node agent's connection
  static constexpr const char* kType = "AGENT";
  std::string host;
  int64_t pid = 0;
  std::string secret;            // as a remote worker's HELLO
  std::vector<int64_t> workers;  // the pids of the workers it started
  std::string error;             // why it could not start them all, or empty
  int32_t attempt = 0;           // the RESTART it answers; 0 for the first
  MSGPACK_DEFINE_MAP(host, pid, secret, workers, error, attempt);
};

/// A worker's output streams, as OUTPUT names them.
inline constexpr int32_t kStdout = 0;
inline constexpr int32_t kStderr = 1;

struct Output {  // followed by one blob frame with the bytes, not necessarily whole lines
  static constexpr const char* kType = "OUTPUT";
  int64_t pid = 0;  // one of AGENT's workers
  int32_t stream = kStdout;
  MSGPACK_DEFINE_MAP(pid, stream);
};

struct Exited {
  static constexpr const char* kType = "EXITED";
  int64_t pid = 0;
  int32_t code = 0;    // the exit code, when signal is 0
  int32_t signal = 0;  // the signal that ended it, or 0
  MSGPACK_DEFINE_MAP(pid, code, signal);
};

// Both ways, on a worker's main connection and an agent's. `sent` and
// `output` are what its sender sent on this connection before it (LinkTally);
// -1: it does not count (a scripted test peer).
struct Heartbeat {
  static constexpr const char* kType = "HEARTBEAT";
  int64_t sent_ms = 0;
  int64_t sent = -1;
  int64_t output = -1;
  MSGPACK_DEFINE_MAP(sent_ms, sent, output);
};

// Controller -> worker.

struct Assign {
  static constexpr const char* kType = "ASSIGN";
  int32_t world_rank = 0;
  int32_t local_rank = 0;
  int32_t node_rank = 0;
  int32_t world_size = 0;
  int32_t local_world_size = 0;
  std::string run_name;
  std::string storage_path;
  std::string entry;
  std::vector<char> config;  // msgpack map
  std::string plugin_sha256;
  uint64_t plugin_size = 0;
  std::string plugin_name;    // its file name where the user has it, for stacks
  int64_t profile_first = 0;  // the steps to profile (TrainerOptions::profile_steps); 0: none
  int64_t profile_last = 0;
  std::string store_prefix;  // one per attempt, so a restart never sees old keys
  std::string bind_host;     // the address Gloo listens on for this worker
  int32_t num_threads = 0;
  std::string device;
  int64_t heartbeat_timeout_ms = 0;
  int64_t heartbeat_interval_ms = 0;  // how often to send them
  int64_t collective_timeout_ms = 0;  // the process group's timeout; 0 = c10d's default
  std::string checkpoint_dir;         // the checkpoint to resume from, or empty
  bool fetch_checkpoint = false;      // checkpoint_dir is not visible here: FETCH_CHECKPOINT it
  std::string attach_secret;  // what this worker's ATTACHes carry; empty = the run's worker secret
  // A file in the run directory holding storage_token, for a remote worker to
  // find out whether it shares the controller's filesystem (empty: it streams).
  std::string storage_probe;
  std::string storage_token;
  bool in_place = false;  // survivors of a lost rank go on in a new group (PEER_LOST)
  // It replaces a lost rank: no group of its own; it joins the group PEER_LOST
  // announces once the others reach a step boundary.
  bool joining = false;
  MSGPACK_DEFINE_MAP(world_rank, local_rank, node_rank, world_size, local_world_size, run_name,
                     storage_path, entry, config, plugin_sha256, plugin_size, store_prefix,
                     bind_host, num_threads, device, heartbeat_timeout_ms, heartbeat_interval_ms,
                     collective_timeout_ms, checkpoint_dir, fetch_checkpoint, attach_secret,
                     storage_probe, storage_token, plugin_name, profile_first, profile_last,
                     in_place, joining);
};

/// In-place recovery, on the main connection: ranks were lost, and the
/// survivors form the group of `generation` under the attempt's store prefix
/// plus "/gen-<generation>". `ranks`: its members' world ranks, by group rank.
struct PeerLost {
  static constexpr const char* kType = "PEER_LOST";
  int64_t generation = 0;
  std::vector<int32_t> ranks;
  std::vector<int32_t> lost;  // the world ranks lost since the last generation
  MSGPACK_DEFINE_MAP(generation, ranks, lost);
};

/// The answer to STEP_VOTE: `apply` when every rank of the group voted,
/// false once the group ended (the step is done again in the next one).
struct StepDecision {
  static constexpr const char* kType = "STEP_DECISION";
  int64_t step = 0;
  bool apply = false;
  // A replacement joins at the next step boundary: the group of generation
  // `join` (0: none), of the world ranks `ranks` by group rank.
  int64_t join = 0;
  std::vector<int32_t> ranks;
  // The reports the group has made: where a replacement's count begins.
  int64_t reports = 0;
  MSGPACK_DEFINE_MAP(step, apply, join, ranks, reports);
};

struct AgentAccepted {
  static constexpr const char* kType = "AGENT_ACCEPTED";
  int64_t heartbeat_timeout_ms = 0;  // the controller is lost after this much silence
  MSGPACK_DEFINE_MAP(heartbeat_timeout_ms);
};

struct Chunk {  // the answer to FETCH_CHUNK, followed by one blob frame with the bytes
  static constexpr const char* kType = "CHUNK";
  std::string source;
  uint32_t file = 0;
  uint64_t offset = 0;
  MSGPACK_DEFINE_MAP(source, file, offset);
};

struct StoreReply {
  static constexpr const char* kType = "STORE_REPLY";
  uint64_t id = 0;
  std::string error;           // why the operation was refused, or empty
  std::vector<uint8_t> value;  // GET, COMPARE_SET
  int64_t number = 0;          // ADD, DELETE_KEY and CHECK (0 or 1), NUM_KEYS
  MSGPACK_DEFINE_MAP(id, error, value, number);
};

struct ReportAck {
  static constexpr const char* kType = "REPORT_ACK";
  int64_t iteration = 0;
  MSGPACK_DEFINE_MAP(iteration);
};

struct ArriveAck {
  static constexpr const char* kType = "ARRIVE_ACK";
  int64_t iteration = 0;
  MSGPACK_DEFINE_MAP(iteration);
};

struct Upload {  // the answer to a REPORT with a checkpoint
  static constexpr const char* kType = "UPLOAD";
  int64_t iteration = 0;
  std::string staging_dir;  // copy the files here; empty = stream them
  int32_t credit = 0;       // chunks that may be in flight
  MSGPACK_DEFINE_MAP(iteration, staging_dir, credit);
};

struct UploadCredit {
  static constexpr const char* kType = "UPLOAD_CREDIT";
  int32_t chunks = 0;
  MSGPACK_DEFINE_MAP(chunks);
};

struct CheckpointListing {
  static constexpr const char* kType = "CHECKPOINT_LISTING";
  std::string name;  // empty: there is no checkpoint
  std::vector<CheckpointFile> files;
  MSGPACK_DEFINE_MAP(name, files);
};

struct Shutdown {
  static constexpr const char* kType = "SHUTDOWN";
  std::string reason;
  // The run goes on with a new attempt: a node agent ends its workers and
  // waits for RESTART instead of exiting. Workers exit either way.
  bool restart = false;
  MSGPACK_DEFINE_MAP(reason, restart);
};

struct Restart {  // to a node agent whose workers ended for a new attempt
  static constexpr const char* kType = "RESTART";
  int32_t attempt = 0;
  MSGPACK_DEFINE_MAP(attempt);
};

struct Refused {
  static constexpr const char* kType = "REFUSED";
  std::string reason;
  MSGPACK_DEFINE_MAP(reason);
};

}  // namespace trainrun::protocol
