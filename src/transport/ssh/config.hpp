#pragma once
// ssh_config(5) read as OpenSSH 9.2 reads it: Host and Match blocks (every criterion, `exec`
// too, and the second pass `Match final` asks for), Include with globs, the first value of a
// keyword wins while IdentityFile and CertificateFile add up, a keyword ssh does not know is an
// error. libssh 0.10's own reader skips `Match originalhost`, matches later Host lines against
// the HostName, keeps one UserKnownHostsFile and ignores IdentitiesOnly, CertificateFile,
// HostKeyAlias and HashKnownHosts, so ferry reads the files here and hands libssh the results.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"

namespace ferry::ssh {

struct ConfigLine {
  std::string file;
  int line = 0;
};

struct ConfigValue {
  std::vector<std::string> args; // the arguments, unquoted
  std::string text;              // the arguments as written (ProxyCommand, KnownHostsCommand)
  ConfigLine where;
};

struct ConfigQuery {
  std::string host;        // as the user wrote it: an alias or a name
  std::string user;        // from USER@host; empty: not given
  unsigned port = 0;       // from host:PORT; 0: not given
  std::string config_file; // only this file; "none": no file; empty: the user's, then the system's
  std::string home;        // what ~ stands for
  std::string local_user;
  std::string system_config = "/etc/ssh/ssh_config";
  // Runs an expanded `Match exec` command: its exit status, or -1 when it cannot be run.
  std::function<int(const std::string&)> run_command;
};

struct SshConfig {
  std::map<std::string, ConfigValue> values; // lower-case keyword -> the first value that applied
  std::vector<ConfigValue> identity_files;   // every IdentityFile that applied, each once
  std::vector<ConfigValue> certificate_files;
  std::vector<std::string> files_read;
  std::vector<std::string> applied;  // "FILE line N: Match originalhost gpu*" for each block used
  std::vector<std::string> warnings; // "FILE line N: ..." for what ferry does not honour

  [[nodiscard]] const ConfigValue* find(const std::string& keyword) const;
  // The first argument of the keyword's value, or `fallback` when no line set it.
  [[nodiscard]] std::string first_arg(const std::string& keyword, std::string fallback = {}) const;
};

[[nodiscard]] Expected<SshConfig> read_ssh_config(const ConfigQuery& query);

// Arguments split as OpenSSH's argv_split splits them: blanks separate, "..." and '...' quote,
// a backslash escapes the next character, a word that starts with # ends the line.
// nullopt: a quote is not closed.
[[nodiscard]] std::optional<std::vector<std::string>> split_config_args(std::string_view text);

// OpenSSH's match_pattern: `*` any run, `?` any one character, case as written.
[[nodiscard]] bool match_pattern(std::string_view text, std::string_view pattern);
// OpenSSH's match_pattern_list: comma-separated patterns, a matching !pattern wins (false);
// `lower` lower-cases the patterns (the text is expected in lower case then).
[[nodiscard]] bool match_pattern_list(std::string_view text, std::string_view list, bool lower);

// `~` and `~/...` with `home`, `~user/...` with that user's home.
[[nodiscard]] std::string expand_tilde(const std::string& path, const std::string& home);

// %X tokens (and `%%`) from `tokens`; with `dollar`, ${NAME} from the environment as well.
// An unknown token or an unset variable is an error naming `what`.
[[nodiscard]] Expected<std::string> percent_expand(std::string_view text,
                                                   const std::map<char, std::string>& tokens,
                                                   bool dollar, std::string_view what);

} // namespace ferry::ssh
