#pragma once
// This user's private directory on this machine for what ferry keeps between invocations: the
// connection holder's socket (held/place.hpp) and a direct connection's note of the host's
// python standby script (ssh/standby/memo.hpp). $XDG_RUNTIME_DIR/ferry, else the cache
// directory's ferry/holders; 0700, the user's own.
#include <filesystem>

#include "ferry/expected.hpp"

namespace ferry {

// The directory, made 0700 when missing (`create`). A directory that is a link, not the user's,
// or open to others is refused with what is wrong and what to do.
[[nodiscard]] Expected<std::filesystem::path> user_runtime_dir(bool create);

} // namespace ferry
