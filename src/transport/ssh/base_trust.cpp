#include "transport/ssh/base_trust.hpp"

#include <fmt/format.h>

namespace ferry::ssh {

namespace {

constexpr std::uint32_t k_group_or_others_write = 022;
constexpr std::uint32_t k_others_write = 002;
constexpr std::uint32_t k_sticky = 01000;

bool shared_by_all(const SeenDir& dir)
{
  return dir.uid == 0 && (dir.mode & k_sticky) != 0 && (dir.mode & k_others_write) != 0;
}

std::optional<std::string> base_problem(const SeenDir& base, std::optional<std::uint32_t> uid,
                                        std::string_view user)
{
  if (shared_by_all(base)) {
    // Never "chmod 700 /tmp": that would break every other user of the host.
    return fmt::format("the run base {0} is shared by every user of the host (mode {1:o}): use a "
                       "private directory under it, --remote-base {0}/ferry-{2}, which ferry "
                       "makes with mode 0700",
                       base.path == "/" ? "" : base.path, base.mode, user);
  }
  if (uid && base.uid != *uid) {
    return fmt::format("the run base {} belongs to uid {}, not to you (uid {}): its owner could "
                       "replace what ferry runs there. Choose a --remote-base of your own (the "
                       "default is ~/.cache/ferry/runs)",
                       base.path, base.uid, *uid);
  }
  if ((base.mode & k_group_or_others_write) != 0) {
    return fmt::format("the run base {0} is writable by group or others (mode {1:o}): another "
                       "user could replace what ferry runs there. Fix it with `chmod 700 {0}`, "
                       "or choose another --remote-base",
                       base.path, base.mode);
  }
  return std::nullopt;
}

std::optional<std::string> ancestor_problem(const SeenDir& dir, std::optional<std::uint32_t> uid)
{
  if (uid && dir.uid != *uid && dir.uid != 0) {
    return fmt::format("{}, above the run base, belongs to uid {} (neither you, uid {}, nor "
                       "root): its owner could replace the directories below it and what ferry "
                       "runs there. Choose a --remote-base under directories that only you and "
                       "root control (the default is ~/.cache/ferry/runs)",
                       dir.path, dir.uid, *uid);
  }
  if ((dir.mode & k_group_or_others_write) == 0 || shared_by_all(dir)) {
    return std::nullopt;
  }
  if (dir.uid != 0) {
    return fmt::format("{0}, above the run base, is writable by group or others (mode {1:o}): "
                       "another user could rename the directories below it and replace what "
                       "ferry runs there. Fix it with `chmod go-w {0}`, or choose another "
                       "--remote-base",
                       dir.path, dir.mode);
  }
  return fmt::format("{}, above the run base, is writable by group or others (mode {:o}) and "
                     "not sticky: another user could rename the directories below it and replace "
                     "what ferry runs there. Choose a --remote-base under directories that only "
                     "you and root can write (the default is ~/.cache/ferry/runs)",
                     dir.path, dir.mode);
}

} // namespace

std::optional<std::string> parent_dir(std::string_view path)
{
  while (path.size() > 1 && path.back() == '/') {
    path.remove_suffix(1);
  }
  const auto slash = path.rfind('/');
  if (path == "/" || slash == std::string_view::npos) {
    return std::nullopt;
  }
  return std::string(slash == 0 ? std::string_view("/") : path.substr(0, slash));
}

bool walk_above(const SeenDir& dir)
{
  return dir.uid != 0 && dir.path != "/";
}

std::optional<std::string> base_chain_problem(const std::vector<SeenDir>& chain,
                                              std::optional<std::uint32_t> uid,
                                              std::string_view user)
{
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const SeenDir& dir = chain[i];
    if (dir.type == SeenDir::Type::link) {
      return fmt::format("{} is a symbolic link; ferry trusts only real directories on the way "
                         "to the run base. Give --remote-base as the directory's real path",
                         dir.path);
    }
    if (dir.type != SeenDir::Type::directory) {
      return fmt::format("{} exists and is not a directory", dir.path);
    }
    if (auto problem = i == 0 ? base_problem(dir, uid, user) : ancestor_problem(dir, uid)) {
      return problem;
    }
  }
  return std::nullopt;
}

bool trusted_file(bool regular, std::uint32_t owner, std::uint32_t mode, std::uint32_t uid)
{
  return regular && owner == uid && (mode & k_group_or_others_write) == 0;
}

} // namespace ferry::ssh
