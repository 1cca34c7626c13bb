#include <train/data.h>

#include "core/host.h"

namespace train::detail {
namespace {

// The progress display's state in this plugin (one per plugin, like the host
// table), for the train function that runs now: the loader shown, and the
// counts it sends. Touched only on the entry's thread.
struct Shown {
  uint64_t entry = 0;  // entry_serial() of the train function these belong to
  const LoaderProgress* loader = nullptr;
  bool evaluation = false;
  int64_t epoch = 0, batch = 0, batches = 0;
  int64_t steps = 0, samples = 0;  // since the loader shown began to be shown
};
Shown g_shown;

// Counts above this are clamped: the controller refuses larger ones.
constexpr int64_t kMostCount = int64_t{1} << 50;

// The host table when it takes progress from this rank on this thread: the
// group's first rank (rank 0, or while it is being replaced, the lowest left).
const train_host_v1_t* progress_host() {
  const train_host_v1_t* host = entry_host_on_this_thread();
  if (host == nullptr || !leads_group() || !TRAIN_HOST_HAS(host, progress) ||
      host->progress == nullptr) {
    return nullptr;
  }
  if (g_shown.entry != entry_serial()) g_shown = Shown{entry_serial()};  // a new train function
  return host;
}

void send(const train_host_v1_t& host) {
  auto clamp = [](int64_t v) { return std::min(std::max<int64_t>(v, 0), kMostCount); };
  host.progress(host.handle, clamp(g_shown.epoch), clamp(g_shown.batch), clamp(g_shown.batches),
                clamp(g_shown.steps), clamp(g_shown.samples));
}

}  // namespace

LoaderProgress::~LoaderProgress() {
  if (g_shown.loader == this) g_shown.loader = nullptr;
}

bool LoaderProgress::claim() {
  if (progress_host() == nullptr) return false;
  if (g_shown.loader == this) return true;
  // A training loader takes over from an evaluation one; the rate starts over.
  if (g_shown.loader != nullptr && !(g_shown.evaluation && !evaluation_)) return false;
  const bool took_over = g_shown.loader != nullptr;
  g_shown.loader = this;
  g_shown.evaluation = evaluation_;
  if (took_over) g_shown.steps = g_shown.samples = 0;
  return true;
}

void LoaderProgress::begin_epoch(int64_t epoch, int64_t batches, int64_t first) {
  const auto* host = progress_host();
  if (host == nullptr || g_shown.loader != this) return;
  g_shown.epoch = epoch >= 0 ? epoch : epochs_begun_;
  ++epochs_begun_;
  g_shown.batch = first;  // an epoch resumed part-way
  g_shown.batches = batches;
  send(*host);
}

void LoaderProgress::batch_done(int64_t samples) {
  const auto* host = progress_host();
  if (host == nullptr || g_shown.loader != this) return;
  ++g_shown.batch;
  ++g_shown.steps;
  g_shown.samples += samples;
  send(*host);
}

}  // namespace train::detail
