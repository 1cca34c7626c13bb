// Which copy of std::filesystem a program that links LibTorch calls. pip's
// LibTorch (2.11: libtorch.so and libtorch_cpu.so; 2.15: libtorch_cpu.so)
// exports its own, unversioned, and the loader binds a call to the first
// definition in load order; LibTorch 2.11's crashed every worker at its first
// train::TempDir. cmake/TrainrunLinkOrder.cmake puts libstdc++ first: here the
// loader's actual answer is checked, not only the order of DT_NEEDED.

#include <dlfcn.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

TEST_CASE("std::filesystem::remove_all is libstdc++'s, not a copy in LibTorch") {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&);
  RemoveAll remove_all = &std::filesystem::remove_all;  // through the GOT: what the loader bound
  Dl_info info{};
  REQUIRE(::dladdr(reinterpret_cast<void*>(remove_all), &info) != 0);
  REQUIRE(info.dli_fname != nullptr);
  const std::string library = info.dli_fname;
  INFO("remove_all comes from " << library);
  CHECK(library.find("libstdc++") != std::string::npos);
  CHECK(library.find("libtorch") == std::string::npos);
  CHECK(library.find("libc10") == std::string::npos);
}
