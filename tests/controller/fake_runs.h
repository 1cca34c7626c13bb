#pragma once

// Runs trainrun in this process through the Trainer API, with scripted fake
// workers (tests/fake_worker) in place of trainrun-worker: the controller's
// behaviour without LibTorch in the workers.

#include <trainrun/trainer.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>

/// Options for `workers` fake workers running `script` (see fake_worker.cpp),
/// with storage and plugin cache under `root`.
trainrun::TrainerOptions fake_options(const std::filesystem::path& root, int workers,
                                      nlohmann::json script, const std::string& name = "fake");

/// The lines of a text file.
std::vector<std::string> read_lines(const std::filesystem::path& path);
