#pragma once
#include "util/embedded.hpp"

namespace ferry {

// The files of src/cli/completion/ (ferry.bash, ferry.zsh, ferry.fish) as they were at build time.
std::span<const EmbeddedFile> completion_script_files();

} // namespace ferry
