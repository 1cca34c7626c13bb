#pragma once

#include <c10/core/Device.h>

#include <string>

namespace train {

/// Where this worker sits in the run: the counterpart of Ray Train's
/// `train.get_context()`. Ranks are grouped by host, so local and node ranks are
/// right on every node.
class Context {
 public:
  Context(int world_rank, int local_rank, int node_rank, int world_size, int local_world_size,
          c10::Device device, std::string run_name, std::string storage_path)
      : world_rank_(world_rank),
        local_rank_(local_rank),
        node_rank_(node_rank),
        world_size_(world_size),
        local_world_size_(local_world_size),
        device_(device),
        run_name_(std::move(run_name)),
        storage_path_(std::move(storage_path)) {}

  /// Rank of this worker among all workers, 0..world_size-1.
  int world_rank() const { return world_rank_; }
  /// Rank of this worker among the workers on its host.
  int local_rank() const { return local_rank_; }
  /// Index of this worker's host among the run's hosts.
  int node_rank() const { return node_rank_; }
  /// Number of workers in the run.
  int world_size() const { return world_size_; }
  /// Number of workers on this worker's host.
  int local_world_size() const { return local_world_size_; }
  /// The device this worker trains on: CPU, or one CUDA device per worker.
  c10::Device device() const { return device_; }
  /// The run's name (`--name`).
  const std::string& run_name() const { return run_name_; }
  /// The storage root (`--storage-path`); results are in storage_path/run_name.
  const std::string& storage_path() const { return storage_path_; }

 private:
  int world_rank_;
  int local_rank_;
  int node_rank_;
  int world_size_;
  int local_world_size_;
  c10::Device device_;
  std::string run_name_;
  std::string storage_path_;
};

/// The context of the running worker. Throws std::logic_error when called
/// outside a train function started by trainrun.
Context get_context();

}  // namespace train
