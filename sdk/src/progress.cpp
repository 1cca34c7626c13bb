#include <train/data.h>

#include "host.h"

namespace train::detail {
namespace {
// The loader whose progress is sent: the first one made while no other is
// (the training loader, in the usual train function). One per plugin, like
// the host table.
const LoaderProgress* g_reporting = nullptr;
}  // namespace

LoaderProgress::LoaderProgress() {
  const train_host_v1_t* host = current_host_or_null();
  if (host == nullptr || g_reporting != nullptr || !TRAIN_HOST_HAS(host, progress) ||
      host->progress == nullptr) {
    return;
  }
  g_reporting = this;
  host_ = host;
}

LoaderProgress::~LoaderProgress() {
  if (g_reporting == this) g_reporting = nullptr;
}

void LoaderProgress::begin_epoch(int64_t epoch, int64_t batches) {
  epoch_ = epoch;
  batches_ = batches;
  batch_ = 0;
  send();
}

void LoaderProgress::batch_done(int64_t samples) {
  ++batch_;
  ++steps_;
  samples_ += samples;
  send();
}

void LoaderProgress::send() const {
  // The host table lives as long as the entry; a loader that outlives it
  // (kept in a static) goes quiet.
  if (host_ == nullptr || g_reporting != this || current_host_or_null() != host_) return;
  host_->progress(host_->handle, epoch_, batch_, batches_, steps_, samples_);
}

}  // namespace train::detail
