#pragma once
// Forced into the fuzz build of ferry's sources (see CMakeLists.txt): toml++ without its
// internal assertions, like the Debian library ferry links. Not NDEBUG, which would turn
// them into __builtin_assume under clang and keep ferry's own assertions from firing.
#define TOML_ASSERT(expr) static_cast<void>(0)
