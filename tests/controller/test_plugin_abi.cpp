// The plugin ABI's growth: a plugin built with this SDK runs under a worker
// whose host table is the first, smaller one of ABI 1 (no progress function),
// and reads the progress function only where the table has it.

#include <train/abi.h>

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

struct Calls {
  int reports = 0;
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
void progress(void* handle, int64_t, int64_t batch, int64_t, int64_t, int64_t) {
  auto& calls = *static_cast<Calls*>(handle);
  ++calls.progress;
  calls.last_batch = batch;
}

// Runs the test plugin's "epochs" entry (2 epochs of 10 batches, one rank)
// with a host table of `size` bytes.
int run_epochs(uint32_t size, Calls& calls, std::string& error) {
  void* library = ::dlopen(TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(library != nullptr, ::dlerror());
  auto* plugin = static_cast<const train_plugin_v1_t*>(::dlsym(library, TRAIN_PLUGIN_SYMBOL));
  REQUIRE(plugin != nullptr);
  train_entry_fn_v1_t entry = nullptr;
  for (uint32_t i = 0; i < plugin->num_entries; ++i) {
    if (std::strcmp(plugin->entries[i].name, "epochs") == 0) entry = plugin->entries[i].fn;
  }
  REQUIRE((entry != nullptr));
  const char config[] =
      "\x82\xa6"
      "epochs"
      "\x02\xa8"
      "sleep_ms"
      "\x00";  // msgpack map
  train_host_v1_t host{};
  host.abi_version = TRAIN_PLUGIN_ABI_VERSION;
  host.struct_size = size;
  host.handle = &calls;
  host.world_size = 1;
  host.local_world_size = 1;
  host.device = "cpu";
  host.run_name = "abi";
  host.storage_path = "/nonexistent";
  host.config = reinterpret_cast<const uint8_t*>(config);
  host.config_size = sizeof(config) - 1;
  host.report = &report;
  host.get_checkpoint = &get_checkpoint;
  host.progress = &progress;  // present in memory; the size says whether it is there
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

TEST_CASE("plugin ABI: a host table with it hears every batch; a smaller one is refused") {
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
