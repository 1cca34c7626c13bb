/* A plugin whose descriptor trainrun must refuse: another ABI version, or
 * another LibTorch version (set by the build). */
#include <train/abi.h>

static int entry(const train_host_v1_t* host, char* error, size_t error_size) {
  (void)host;
  (void)error;
  (void)error_size;
  return TRAIN_OK;
}

static const train_entry_v1_t entries[] = {{"entry", &entry}};

__attribute__((visibility("default"))) train_plugin_v1_t train_plugin_v1 = {
    DESCRIPTOR_ABI, sizeof(train_plugin_v1_t), "0.1.0", DESCRIPTOR_TORCH, 1, 1, entries};
