// The plugin ABI's growth: a plugin built with this SDK runs under a worker
// whose host table is the first, smaller one of ABI 1 (no progress function),
// and reads the progress and report_checkpoint functions only where the table
// has them.

#include <train/abi.h>

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

struct Calls {
  int reports = 0;
  int async_reports = 0;  // through report_checkpoint
  int progress = 0;
  int64_t last_batch = -1;
};

int report(void* handle, const uint8_t*, size_t, const char*, char*, size_t) {
  ++static_cast<Calls*>(handle)->reports;
  return 0;
}
int get_checkpoint(void*, char* path, size_t, char*, size_t) {
  path[0] = '\0';
  return 0;
}
int report_checkpoint(void* handle, const uint8_t*, size_t, const char*, uint32_t mode, char*,
                      size_t) {
  ++(mode == TRAIN_UPLOAD_ASYNC ? static_cast<Calls*>(handle)->async_reports
                                : static_cast<Calls*>(handle)->reports);
  return 0;
}
void progress(void* handle, int64_t, int64_t batch, int64_t, int64_t, int64_t) {
  auto& calls = *static_cast<Calls*>(handle);
  ++calls.progress;
  calls.last_batch = batch;
}

// Runs the test plugin's "epochs" entry (2 epochs of 10 batches, one rank,
// a checkpoint each; with `async` uploaded asynchronously) with a host table
// of `size` bytes.
int run_epochs(uint32_t size, Calls& calls, std::string& error, bool async = false) {
  void* library = ::dlopen(TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(library != nullptr, ::dlerror());
  auto* plugin = static_cast<const train_plugin_v1_t*>(::dlsym(library, TRAIN_PLUGIN_SYMBOL));
  REQUIRE(plugin != nullptr);
  train_entry_fn_v1_t entry = nullptr;
  for (uint32_t i = 0; i < plugin->num_entries; ++i) {
    if (std::strcmp(plugin->entries[i].name, "epochs") == 0) entry = plugin->entries[i].fn;
  }
  REQUIRE((entry != nullptr));
  const std::string config = std::string(async ? "\x83" : "\x82") +
                             "\xa6"
                             "epochs"
                             "\x02\xa8"
                             "sleep_ms" +
                             std::string(1, '\0') +
                             (async ? "\xab"
                                      "upload_mode"
                                      "\xa5"
                                      "async"
                                    : "");  // msgpack map
  train_host_v1_t host{};
  host.abi_version = TRAIN_PLUGIN_ABI_VERSION;
  host.struct_size = size;
  host.handle = &calls;
  host.world_size = 1;
  host.local_world_size = 1;
  host.device = "cpu";
  host.run_name = "abi";
  host.storage_path = "/nonexistent";
  host.config = reinterpret_cast<const uint8_t*>(config.data());
  host.config_size = config.size();
  host.report = &report;
  host.get_checkpoint = &get_checkpoint;
  host.progress = &progress;  // present in memory; the size says whether they are there
  host.report_checkpoint = &report_checkpoint;
  std::vector<char> message(4096, '\0');
  int rc = entry(&host, message.data(), message.size());
  error = message.data();
  return rc;
}

}  // namespace

TEST_CASE("plugin ABI: a host table without the progress function still runs the entry") {
  Calls calls;
  std::string error;
  CHECK(run_epochs(TRAIN_HOST_V1_MIN_SIZE, calls, error) == TRAIN_OK);
  CHECK(error.empty());
  CHECK(calls.reports == 2);
  CHECK(calls.progress == 0);
}

TEST_CASE("plugin ABI: a host table with it hears every batch, a smaller one is refused") {
  Calls calls;
  std::string error;
  CHECK(run_epochs(sizeof(train_host_v1_t), calls, error) == TRAIN_OK);
  CHECK(calls.reports == 2);
  CHECK(calls.progress == 2 * (1 + 10));  // each epoch's start, and each of its 10 batches
  CHECK(calls.last_batch == 10);
  Calls refused;
  CHECK(run_epochs(TRAIN_HOST_V1_MIN_SIZE - 1, refused, error) == TRAIN_ERROR_HOST);
  CHECK(error.find("incompatible") != std::string::npos);
  CHECK(refused.reports == 0);
}

TEST_CASE(
    "plugin ABI: an asynchronous checkpoint goes to report_checkpoint where the table has it") {
  Calls calls;
  std::string error;
  CHECK(run_epochs(sizeof(train_host_v1_t), calls, error, /*async=*/true) == TRAIN_OK);
  CHECK(error.empty());
  CHECK(calls.async_reports == 2);
  CHECK(calls.reports == 0);
  // A worker without it uploads synchronously, through report.
  Calls older;
  CHECK(run_epochs(offsetof(train_host_v1_t, report_checkpoint), older, error, true) == TRAIN_OK);
  CHECK(error.empty());
  CHECK(older.async_reports == 0);
  CHECK(older.reports == 2);
  CHECK(older.progress > 0);
}
