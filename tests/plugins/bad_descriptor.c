/* A plugin that trainrun must refuse: built for another plugin ABI, or against
 * another LibTorch (both set by the build). Written by hand, as a plugin from
 * another SDK release would look, in both forms the runtime reads: the ELF
 * sections the controller inspects and the descriptor the worker loads. */
#include <train/abi.h>

static int entry(const train_host_v1_t* host, char* error, size_t error_size) {
  (void)host;
  (void)error;
  (void)error_size;
  return TRAIN_OK;
}

__attribute__((section(TRAIN_PLUGIN_ENTRIES_SECTION), used)) static const char entry_name[] =
    "entry";

__attribute__((section(TRAIN_PLUGIN_INFO_SECTION),
               used)) static const train_plugin_info_v1_t info = {
    {'T', 'R', 'A', 'I', 'N', 'R', 'U', 'N'},
    DESCRIPTOR_ABI,
    sizeof(train_plugin_info_v1_t),
    1,
    "0.1.0",
    DESCRIPTOR_TORCH};

static const train_entry_v1_t entries[] = {{entry_name, &entry}};

__attribute__((visibility("default"))) train_plugin_v1_t train_plugin_v1 = {
    DESCRIPTOR_ABI, sizeof(train_plugin_v1_t), "0.1.0", DESCRIPTOR_TORCH, 1, 1, entries};
