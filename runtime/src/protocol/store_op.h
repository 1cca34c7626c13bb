#pragma once

// The operations of the rendezvous store (c10d::Store's), named on the wire by
// to_string and read back by parse_store_op.

#include <array>
#include <optional>
#include <string_view>

namespace trainrun::protocol {

enum class StoreOp { kSet, kCompareSet, kGet, kAdd, kDeleteKey, kCheck, kNumKeys, kWait };

inline constexpr std::array<std::pair<StoreOp, std::string_view>, 8> kStoreOpNames{{
    {StoreOp::kSet, "SET"},
    {StoreOp::kCompareSet, "COMPARE_SET"},
    {StoreOp::kGet, "GET"},
    {StoreOp::kAdd, "ADD"},
    {StoreOp::kDeleteKey, "DELETE_KEY"},
    {StoreOp::kCheck, "CHECK"},
    {StoreOp::kNumKeys, "NUM_KEYS"},
    {StoreOp::kWait, "WAIT"},
}};

constexpr std::string_view to_string(StoreOp op) {
  for (const auto& [value, name] : kStoreOpNames) {
    if (value == op) return name;
  }
  return "?";
}

constexpr std::optional<StoreOp> parse_store_op(std::string_view name) {
  for (const auto& [value, text] : kStoreOpNames) {
    if (text == name) return value;
  }
  return std::nullopt;
}

}  // namespace trainrun::protocol
