#pragma once
// What ferry trusts on a host before it runs anything there (docs/run-protocol.md, "Stage"): the
// run base and every directory above it up to the first of root's, as sshd's StrictModes trusts
// the path to a user's keys, and the files it runs from the base. These are the rules, apart from
// SFTP, which gathers what they judge.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::ssh {

// A directory on the way up from the run base, as lstat showed it.
struct SeenDir {
  enum class Type { directory, link, other };
  std::string path;
  Type type = Type::directory;
  std::uint32_t uid = 0;
  std::uint32_t mode = 0; // the permission bits, setuid, setgid and sticky included (07777)
};

// The directory above `path` ("/" for "/x"); nullopt for "/" itself.
[[nodiscard]] std::optional<std::string> parent_dir(std::string_view path);
// Whether the walk up from the base looks above `dir`: it stops at the first directory of
// root's, which only root can change (and root can change anything anyway).
[[nodiscard]] bool walk_above(const SeenDir& dir);

// What keeps ferry from trusting the run base for the user `uid` (named `user` in the advice):
// `chain` is the base, then each directory above it as far as walk_above goes. Every directory
// must be a real one (not a link), the user's (above the base: the user's or root's), and
// writable by nobody else; a directory of root's with the sticky bit (/tmp) may be writable by
// all, as nobody but its owner can rename or remove an entry there. Owners are judged only when
// `uid` is known. nullopt: nothing.
[[nodiscard]] std::optional<std::string> base_chain_problem(const std::vector<SeenDir>& chain,
                                                            std::optional<std::uint32_t> uid,
                                                            std::string_view user);

// Whether a file in the base may be run or trusted (a job cache entry, the script kept ahead): a
// regular file of the user's that neither its group nor others can write.
[[nodiscard]] bool trusted_file(bool regular, std::uint32_t owner, std::uint32_t mode,
                                std::uint32_t uid);

} // namespace ferry::ssh
