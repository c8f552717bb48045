#pragma once
#include <string_view>

namespace ferry {
[[nodiscard]] std::string_view version();
// The versions of the libraries ferry runs with (as loaded, not as built against).
[[nodiscard]] std::string_view ssh_library_version();    // "0.10.6/openssl/zlib"
[[nodiscard]] std::string_view sqlite_library_version(); // "3.40.1"
} // namespace ferry
