#pragma once
#include <string_view>

#include "ferry/expected.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

// Public-key authentication (agent, then key files), then "none".
[[nodiscard]] Expected<void> authenticate(ssh_session session, std::string_view label,
                                          std::string_view user, std::string_view identity);

} // namespace ferry::ssh
