#pragma once

// The messages between controller and workers, one struct each. A worker says
// HELLO, gets ASSIGN, fetches the plugin in chunks if its cache lacks it. Rank 0
// hosts the rendezvous store and says STORE_READY; the controller passes its
// address to the other ranks in STORE_ADDRESS. Then REPORTs (acknowledged once
// every rank reached the same one), heartbeats, and DONE or FAILED. The
// controller ends every worker with SHUTDOWN.

#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::protocol {

// Worker -> controller.

struct Hello {
  static constexpr const char* kType = "HELLO";
  int32_t index = 0;  // the worker's launch index (local workers) or -1
  std::string host;
  int64_t pid = 0;
  MSGPACK_DEFINE_MAP(index, host, pid);
};

struct FetchPlugin {
  static constexpr const char* kType = "FETCH_PLUGIN";
  uint64_t offset = 0;
  uint64_t length = 0;
  MSGPACK_DEFINE_MAP(offset, length);
};

struct Report {
  static constexpr const char* kType = "REPORT";
  int64_t iteration = 0;
  std::vector<char> metrics;   // msgpack map, as train::report encoded it
  std::string checkpoint_dir;  // this rank's checkpoint files, or empty
  MSGPACK_DEFINE_MAP(iteration, metrics, checkpoint_dir);
};

struct StoreReady {  // from rank 0, once its store listens
  static constexpr const char* kType = "STORE_READY";
  int32_t port = 0;
  MSGPACK_DEFINE_MAP(port);
};

struct Done {
  static constexpr const char* kType = "DONE";
  int64_t reports = 0;
  MSGPACK_DEFINE_MAP(reports);
};

struct Failed {
  static constexpr const char* kType = "FAILED";
  std::string message;
  std::string kind;  // "exception", "plugin", "setup"
  MSGPACK_DEFINE_MAP(message, kind);
};

struct Heartbeat {
  static constexpr const char* kType = "HEARTBEAT";
  int64_t sent_ms = 0;
  MSGPACK_DEFINE_MAP(sent_ms);
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
  std::string store_host;    // rank 0's address, where it hosts the store
  std::string store_prefix;  // one per attempt, so a restart never sees old keys
  std::string bind_host;     // the address Gloo listens on for this worker
  int32_t num_threads = 0;
  std::string device;
  int64_t heartbeat_timeout_ms = 0;
  std::string checkpoint_dir;  // the latest committed checkpoint, or empty
  MSGPACK_DEFINE_MAP(world_rank, local_rank, node_rank, world_size, local_world_size, run_name,
                     storage_path, entry, config, plugin_sha256, plugin_size, store_host,
                     store_prefix, bind_host, num_threads, device, heartbeat_timeout_ms,
                     checkpoint_dir);
};

struct PluginChunk {  // followed by one blob frame with the bytes
  static constexpr const char* kType = "PLUGIN_CHUNK";
  uint64_t offset = 0;
  MSGPACK_DEFINE_MAP(offset);
};

struct StoreAddress {  // to ranks other than 0
  static constexpr const char* kType = "STORE_ADDRESS";
  std::string host;
  int32_t port = 0;
  MSGPACK_DEFINE_MAP(host, port);
};

struct ReportAck {
  static constexpr const char* kType = "REPORT_ACK";
  int64_t iteration = 0;
  MSGPACK_DEFINE_MAP(iteration);
};

struct Shutdown {
  static constexpr const char* kType = "SHUTDOWN";
  std::string reason;
  MSGPACK_DEFINE_MAP(reason);
};

struct Refused {
  static constexpr const char* kType = "REFUSED";
  std::string reason;
  MSGPACK_DEFINE_MAP(reason);
};

}  // namespace trainrun::protocol
