#pragma once
#include "util/embedded.hpp"

namespace ferry {

// The scripts of src/remote/ (*.sh, *.py) as they were at build time.
std::span<const EmbeddedFile> remote_script_files();

} // namespace ferry
