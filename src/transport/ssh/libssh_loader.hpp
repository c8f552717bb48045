#pragma once
// libssh is opened on first use (libssh_loader.cpp says why). Every path into libssh calls
// load_libssh() first, so that a missing or unusable libssh is an error that names it.
#include "ferry/expected.hpp"

namespace ferry::ssh {

// The library opened: its soname, as the dynamic linker would look it up.
inline constexpr const char* k_libssh_file = "libssh.so.4";

// Opens libssh and looks up every function ferry uses, once per process; the error names the
// library and what to install.
Expected<void> load_libssh();

// The same for another file (for tests: the message for a library that is missing or lacks a
// function); the process's libssh is not changed.
Expected<void> try_loading_libssh(const char* file);

} // namespace ferry::ssh
