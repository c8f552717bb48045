#pragma once
// One entry of a directory, as lstat sees it: what a target lists of a run directory and what
// this machine lists of a job's own directory.
#include <cstdint>
#include <string>

namespace ferry {

struct DirEntry {
  enum class Kind { file, dir, other };
  std::string name;
  Kind kind = Kind::other;
  std::uint64_t size = 0;
  std::string what; // other: "a symbolic link", "a FIFO", ...
};

} // namespace ferry
