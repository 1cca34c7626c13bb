#include <train/config.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>

namespace train {

struct Config::Impl {
  nlohmann::json values = nlohmann::json::object();
};

namespace {

std::string type_name(const nlohmann::json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number_float()) return "a real number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_string()) return "a string";
  if (value.is_null()) return "null";
  return std::string("a JSON ") + value.type_name();
}

[[noreturn]] void wrong_type(const std::string& key, const nlohmann::json& value,
                             const char* wanted) {
  throw ConfigError("config key '" + key + "' is " + type_name(value) + " (" + value.dump() +
                    "), expected " + wanted);
}

template <typename T>
T convert(const std::string& key, const nlohmann::json& value) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) wrong_type(key, value, "a boolean");
    return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!value.is_number_integer()) wrong_type(key, value, "an integer");
    if (value.is_number_unsigned()) {
      auto v = value.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        wrong_type(key, value, "an integer that fits its type");
      }
      return static_cast<T>(v);
    }
    auto v = value.get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      wrong_type(key, value, "an integer that fits its type");
    }
    return static_cast<T>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) wrong_type(key, value, "a number");
    return value.get<T>();
  } else {
    if (!value.is_string()) wrong_type(key, value, "a string");
    return value.get<std::string>();
  }
}

}  // namespace

Config::Config() : impl_(std::make_shared<const Impl>()) {}

Config::Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Config Config::from_msgpack(const void* data, size_t size) {
  auto bytes = static_cast<const uint8_t*>(data);
  nlohmann::json values;
  try {
    values = nlohmann::json::from_msgpack(bytes, bytes + size);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("config is not valid msgpack: ") + e.what());
  }
  if (!values.is_object()) throw ConfigError("config is not a map of key to value");
  return Config(std::make_shared<const Impl>(Impl{std::move(values)}));
}

Config Config::from_json(const std::string& text) {
  nlohmann::json values;
  try {
    values = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("config is not valid JSON: ") + e.what());
  }
  if (!values.is_object()) throw ConfigError("config is not a JSON object");
  return Config(std::make_shared<const Impl>(Impl{std::move(values)}));
}

template <typename T>
T Config::get(const std::string& key) const {
  auto it = impl_->values.find(key);
  if (it == impl_->values.end()) throw ConfigError("config key '" + key + "' is not set");
  return convert<T>(key, *it);
}

template <typename T>
T Config::get(const std::string& key, T default_value) const {
  auto it = impl_->values.find(key);
  if (it == impl_->values.end()) return default_value;
  return convert<T>(key, *it);
}

bool Config::contains(const std::string& key) const { return impl_->values.contains(key); }

std::vector<std::string> Config::keys() const {
  std::vector<std::string> keys;
  for (const auto& item : impl_->values.items()) keys.push_back(item.key());
  return keys;
}

std::string Config::to_json() const { return impl_->values.dump(); }

#define TRAIN_CONFIG_INSTANTIATE(T)                    \
  template T Config::get<T>(const std::string&) const; \
  template T Config::get<T>(const std::string&, T) const;
TRAIN_CONFIG_INSTANTIATE(bool)
TRAIN_CONFIG_INSTANTIATE(int)
TRAIN_CONFIG_INSTANTIATE(int64_t)
TRAIN_CONFIG_INSTANTIATE(float)
TRAIN_CONFIG_INSTANTIATE(double)
TRAIN_CONFIG_INSTANTIATE(std::string)
#undef TRAIN_CONFIG_INSTANTIATE

}  // namespace train
