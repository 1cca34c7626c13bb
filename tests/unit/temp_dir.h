#pragma once

#include <stdlib.h>

#include <filesystem>

/// A fresh directory under /tmp, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char pattern[] = "/tmp/trainrun-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};
