#pragma once
// A target as the user writes it: "[user@]host[:port]", IPv6 literals in brackets.
#include <string>
#include <string_view>

#include "ferry/expected.hpp"

namespace ferry {

struct HostSpec {
  std::string user;
  std::string host;
  unsigned port = 0; // 0: not given
};

[[nodiscard]] Expected<HostSpec> parse_host_spec(std::string_view spec);

} // namespace ferry
