#pragma once
// The user's config file, $XDG_CONFIG_HOME/ferry/config.toml (docs/config.md): per-host-pattern
// interpreters, environment, run directory base and ssh defaults, and host groups.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/run_env.hpp"
#include "ferry/util.hpp"

namespace ferry {

// Defaults for the ssh options; the command line and the spec ([user@]host[:port]) win.
struct SshDefaults {
  std::optional<double> connect_timeout_s;
  std::optional<std::string> user;
  std::optional<unsigned> port;
  std::optional<std::string> identity;
  std::optional<int> persist_s; // seconds a connection is kept after a run (0: none)
};

struct HostConfig {
  HostSettings settings; // interpreters, env
  std::optional<std::string> remote_base;
  SshDefaults ssh;
};

struct UserConfig {
  std::filesystem::path file; // empty when there was no file
  // `[hosts."PATTERN"]` sections in file order; PATTERN is a glob (fnmatch) on the host name.
  std::vector<std::pair<std::string, HostConfig>> hosts;
  // `[groups]`: NAME = ["gpu[01-08]", "spare1", "@other"], named on the command line as @NAME.
  std::map<std::string, std::vector<std::string>, std::less<>> groups;

  // Every matching section merged, the first in the file winning each setting (as in
  // ssh_config). `host` is the name the user gave ([user@]host[:port] or "local").
  [[nodiscard]] HostConfig for_host(std::string_view host) const;
};

// How much of the config file ferry reads: a few KiB is a large one.
inline constexpr SmallFile k_config_file{"the config file", std::uint64_t{1} << 20};

// $XDG_CONFIG_HOME/ferry/config.toml, else ~/.config/ferry/config.toml.
[[nodiscard]] std::filesystem::path default_user_config_path();

// The file's settings; a missing file is an empty config. A bad one is a usage error naming
// the file, the line and the key.
[[nodiscard]] Expected<UserConfig> load_user_config(const std::filesystem::path& file);
[[nodiscard]] Expected<UserConfig> parse_user_config(std::string_view text,
                                                     const std::filesystem::path& file);

} // namespace ferry
