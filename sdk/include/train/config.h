#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// Thrown by `Config::get` when a key is missing (and no default was given) or
/// holds a value of another type. The message names the key and both types.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The run's configuration: what `trainrun --config key=value` and
/// `--config-file` set, handed to `train_func`. Values are numbers, booleans,
/// strings or nested JSON; read them typed, with a default:
///
///   int epochs = config.get<int>("epochs", 10);
///
/// Supported types: bool, int, int64_t, float, double, std::string. An integer
/// value may be read as float or double; a real number is never narrowed to an
/// integer. Copies are cheap and share the same immutable data.
class Config {
 public:
  /// An empty config.
  Config();
  /// Parses a msgpack map (as handed over by the worker). Throws ConfigError if
  /// the bytes are not a msgpack map.
  static Config from_msgpack(const void* data, size_t size);
  /// Parses a JSON object. Throws ConfigError if the text is not a JSON object.
  static Config from_json(const std::string& text);

  /// The value of `key` as T. Throws ConfigError if it is missing or not a T.
  template <typename T>
  T get(const std::string& key) const;
  /// The value of `key` as T, or `default_value` if the key is absent. Throws
  /// ConfigError if the key is present with another type.
  template <typename T>
  T get(const std::string& key, T default_value) const;
  /// Convenience for string defaults given as literals.
  std::string get(const std::string& key, const char* default_value) const {
    return get<std::string>(key, std::string(default_value));
  }

  /// Whether `key` is set.
  bool contains(const std::string& key) const;
  /// The keys that are set, sorted.
  std::vector<std::string> keys() const;
  /// The whole config as a JSON object.
  std::string to_json() const;

 private:
  struct Impl;
  explicit Config(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace train
