#pragma once
#include "util/embedded.hpp"

namespace ferry {

// The files of jobs/ as they were at build time.
std::span<const EmbeddedFile> builtin_job_files();

} // namespace ferry
