#pragma once
// Between libssh's keys and their blobs (blobs.hpp).
#include <string>
#include <string_view>

#include "transport/ssh/blobs.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

// The key's public blob (a certificate's blob for a certificate key); empty on failure.
[[nodiscard]] std::string key_blob(ssh_key key);
// The libssh key for a public blob; null when libssh cannot read it.
[[nodiscard]] Key key_from_blob(std::string_view blob);

} // namespace ferry::ssh
