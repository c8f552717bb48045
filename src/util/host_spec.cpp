#include "ferry/host_spec.hpp"

#include <charconv>

namespace ferry {

Expected<HostSpec> parse_host_spec(std::string_view spec)
{
  HostSpec result;
  std::string_view rest = spec;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    result.user = std::string(rest.substr(0, at));
    rest.remove_prefix(at + 1);
  }
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) {
      return fail(ErrorKind::usage, "host '{}': missing ']' after an IPv6 address", spec);
    }
    result.host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return fail(ErrorKind::usage, "host '{}': expected ':PORT' after ']'", spec);
      }
      port_text = rest.substr(1);
    }
  } else if (const auto colon = rest.find(':');
             colon != std::string_view::npos &&
             rest.find(':', colon + 1) == std::string_view::npos) {
    result.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  } else {
    result.host = std::string(rest);
  }
  if (result.host.empty()) {
    return fail(ErrorKind::usage, "host '{}': no host name ([user@]host[:port])", spec);
  }
  if (!port_text.empty() || (spec.find(':') != std::string_view::npos && port_text.empty() &&
                             result.host.find(':') == std::string::npos)) {
    unsigned port = 0;
    const auto [ptr, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() ||
        port == 0 || port > 65535) {
      return fail(ErrorKind::usage, "host '{}': the port must be a number from 1 to 65535", spec);
    }
    result.port = port;
  }
  return result;
}

} // namespace ferry
