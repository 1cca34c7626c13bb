#include <train/data.h>

#include "host.h"

namespace train::detail {
namespace {

// The progress display's state in this plugin (one per plugin, like the host
// table), for the train function that runs now: the loader shown, and counts
// that run on across the loaders it shows.
struct Shown {
  const train_host_v1_t* host = nullptr;  // the entry these belong to
  const LoaderProgress* loader = nullptr;
  bool evaluation = false;
  int64_t epoch = 0, batch = 0, batches = 0;
  int64_t epochs_begun = 0, steps = 0, samples = 0;
};
Shown g_shown;

// The host table when it takes progress from this rank, else nullptr.
const train_host_v1_t* progress_host() {
  const train_host_v1_t* host = current_host_or_null();
  if (host == nullptr || host->world_rank != 0 || !TRAIN_HOST_HAS(host, progress) ||
      host->progress == nullptr) {
    return nullptr;
  }
  if (g_shown.host != host) g_shown = Shown{host};  // a new train function: counts start over
  return host;
}

void send() {
  g_shown.host->progress(g_shown.host->handle, g_shown.epoch, g_shown.batch, g_shown.batches,
                         g_shown.steps, g_shown.samples);
}

}  // namespace

LoaderProgress::~LoaderProgress() {
  if (g_shown.loader == this) g_shown.loader = nullptr;
}

bool LoaderProgress::claim() {
  if (progress_host() == nullptr) return false;
  if (g_shown.loader == this) return true;
  // A training loader takes over from an evaluation one.
  if (g_shown.loader != nullptr && !(g_shown.evaluation && !evaluation_)) return false;
  g_shown.loader = this;
  g_shown.evaluation = evaluation_;
  return true;
}

void LoaderProgress::begin_epoch(int64_t epoch, int64_t batches) {
  if (progress_host() == nullptr || g_shown.loader != this) return;
  g_shown.epoch = epoch >= 0 ? epoch : g_shown.epochs_begun;
  ++g_shown.epochs_begun;
  g_shown.batch = 0;
  g_shown.batches = batches;
  send();
}

void LoaderProgress::batch_done(int64_t samples) {
  if (progress_host() == nullptr || g_shown.loader != this) return;
  ++g_shown.batch;
  ++g_shown.steps;
  g_shown.samples += samples;
  send();
}

}  // namespace train::detail
