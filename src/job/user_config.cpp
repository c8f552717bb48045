// The user's config file: TOML, read with toml++; every value is checked here so that a mistake
// is reported with its file, line and key before any host is contacted.
#include "ferry/user_config.hpp"

#include <algorithm>
#include <cctype>

#include <fnmatch.h>
#include <toml++/toml.h>

#include "ferry/host_spec.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace fs = std::filesystem;

namespace {

// Where a value sits, for messages: "FILE:LINE: hosts."gpu*".KEY: ...".
struct Where {
  const fs::path& file;
  std::string section;

  template <typename... Args>
  [[nodiscard]] Unexpected<Error> refuse(const toml::node& at, std::string_view key,
                                         fmt::format_string<Args...> format, Args&&... args) const
  {
    return fail(ErrorKind::usage, "{}:{}: {}.{}: {}", file.string(), at.source().begin.line,
                section, terminal_safe(key), fmt::format(format, std::forward<Args>(args)...));
  }
};

Expected<std::string> string_value(const toml::node& node, std::string_view key, const Where& at)
{
  const auto text = node.value_exact<std::string>();
  if (!text) {
    return at.refuse(node, key, "must be a string");
  }
  return *text;
}

Expected<void> set_interpreters(HostConfig& host, const toml::node& node, const Where& at)
{
  const auto* table = node.as_table();
  if (table == nullptr) {
    return at.refuse(node, "interpreters", "must be a table: interpreters.python3 = \"/path\"");
  }
  for (const auto& [name, value] : *table) {
    const std::string key = "interpreters." + std::string(name.str());
    FERRY_TRY_ASSIGN(auto path, string_value(value, key, at));
    if (!is_shell_neutral_token(path)) {
      return at.refuse(value, key,
                       "'{}' is not a program name or absolute path made only of "
                       "[A-Za-z0-9/._-]",
                       terminal_safe(path));
    }
    host.settings.interpreters.emplace(name.str(), std::move(path));
  }
  return {};
}

Expected<void> set_env(HostConfig& host, const toml::node& node, const Where& at)
{
  const auto* table = node.as_table();
  if (table == nullptr) {
    return at.refuse(node, "env", "must be a table: env.HF_HOME = \"/data/hf\"");
  }
  for (const auto& [name, value] : *table) {
    const std::string key = "env." + std::string(name.str());
    FERRY_TRY_ASSIGN(auto text, string_value(value, key, at));
    const std::string where =
        fmt::format("{}:{}: {}.env", at.file.string(), value.source().begin.line, at.section);
    FERRY_TRY(check_env_var(name.str(), text, where));
    host.settings.env.emplace(name.str(), std::move(text));
  }
  return {};
}

Expected<void> set_ssh_key(SshDefaults& ssh, std::string_view key, const toml::node& value,
                           const Where& at)
{
  const std::string full = "ssh." + std::string(key);
  if (key == "user" || key == "identity") {
    FERRY_TRY_ASSIGN(auto text, string_value(value, full, at));
    if (text.empty()) {
      return at.refuse(value, full, "must not be empty");
    }
    (key == "user" ? ssh.user : ssh.identity) = std::move(text);
  } else if (key == "port") {
    const auto port = value.value_exact<std::int64_t>();
    if (!port || *port < 1 || *port > 65535) {
      return at.refuse(value, full, "must be a whole number between 1 and 65535");
    }
    ssh.port = static_cast<unsigned>(*port);
  } else if (key == "connect_timeout") {
    const auto seconds = value.value<double>();
    if (!seconds || !(*seconds > 0) || *seconds > 3600) {
      return at.refuse(value, full, "must be a number of seconds between 0 and 3600");
    }
    ssh.connect_timeout_s = *seconds;
  } else if (key == "persist") {
    const auto seconds = value.value_exact<std::int64_t>();
    if (!seconds || *seconds < 0 || *seconds > 7 * 24 * 3600) {
      return at.refuse(value, full, "must be whole seconds from 0 to 604800 (0 keeps none)");
    }
    ssh.persist_s = static_cast<int>(*seconds);
  } else {
    return at.refuse(value, full,
                     "unknown key (known: connect_timeout, user, port, identity, persist)");
  }
  return {};
}

Expected<void> set_ssh(HostConfig& host, const toml::node& node, const Where& at)
{
  const auto* table = node.as_table();
  if (table == nullptr) {
    return at.refuse(node, "ssh", "must be a table: ssh.user = \"me\"");
  }
  for (const auto& [key, value] : *table) {
    FERRY_TRY(set_ssh_key(host.ssh, key.str(), value, at));
  }
  return {};
}

Expected<void> set_remote_base(HostConfig& host, const toml::node& node, const Where& at)
{
  FERRY_TRY_ASSIGN(host.remote_base, string_value(node, "remote_base", at));
  return {};
}

// The keys of a host section, each with what reads it.
using HostSetter = Expected<void> (*)(HostConfig&, const toml::node&, const Where&);
constexpr std::pair<std::string_view, HostSetter> k_host_keys[] = {
    {"interpreters", set_interpreters},
    {"env", set_env},
    {"remote_base", set_remote_base},
    {"ssh", set_ssh},
};

Expected<HostConfig> parse_host(const toml::node& node, const Where& at)
{
  const auto* table = node.as_table();
  if (table == nullptr) {
    return at.refuse(node, "", "must be a table ([{}])", at.section);
  }
  HostConfig host;
  for (const auto& [key, value] : *table) {
    const std::string_view name = key.str();
    const auto* known = std::find_if(std::begin(k_host_keys), std::end(k_host_keys),
                                     [name](const auto& entry) { return entry.first == name; });
    if (known == std::end(k_host_keys)) {
      return at.refuse(value, name, "unknown key (known: interpreters, env, remote_base, ssh)");
    }
    FERRY_TRY(known->second(host, value, at));
  }
  return host;
}

// A group's name is what follows '@' on the command line: no spaces, commas or brackets.
bool is_group_name(std::string_view name)
{
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
  });
}

// `[groups]`: each NAME = ["host", "gpu[01-08]", "@other", ...]; the entries are expanded when a
// command names the group, so a mistake in one group stops only the commands that use it.
Expected<void> parse_groups(UserConfig& config, const toml::node& node, const fs::path& file)
{
  const Where at{file, "groups"};
  const auto* table = node.as_table();
  if (table == nullptr) {
    return fail(ErrorKind::usage,
                "{}:{}: groups: must be a table: [groups] a100 = [\"gpu[01-08]\", \"spare1\"]",
                file.string(), node.source().begin.line);
  }
  for (const auto& [name, value] : *table) {
    if (!is_group_name(name.str())) {
      return at.refuse(value, name.str(), "a group name is made of [A-Za-z0-9_.-]");
    }
    const auto* entries = value.as_array();
    if (entries == nullptr || entries->empty()) {
      return at.refuse(value, name.str(), "must be a list of hosts: [\"gpu[01-08]\", \"spare1\"]");
    }
    std::vector<std::string> hosts;
    for (const auto& entry : *entries) {
      FERRY_TRY_ASSIGN(auto host, string_value(entry, name.str(), at));
      if (trim(host).empty()) {
        return at.refuse(entry, name.str(), "names an empty host");
      }
      hosts.push_back(std::move(host));
    }
    config.groups.emplace(std::string(name.str()), std::move(hosts));
  }
  return {};
}

// `[hosts."PATTERN"]` sections, in the file's order.
Expected<void> parse_hosts(UserConfig& config, const toml::table& hosts, const fs::path& file)
{
  for (const auto& [pattern, section] : hosts) {
    const Where at{file, fmt::format("hosts.\"{}\"", terminal_safe(pattern.str()))};
    FERRY_TRY_ASSIGN(auto host, parse_host(section, at));
    config.hosts.emplace_back(std::string(pattern.str()), std::move(host));
  }
  // toml++ keeps a table sorted by key; the file's order decides which section wins.
  std::vector<std::pair<std::size_t, std::size_t>> order;
  for (const auto& [pattern, section] : hosts) {
    order.emplace_back(section.source().begin.line, order.size());
  }
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::string, HostConfig>> sorted;
  for (const auto& [line, index] : order) {
    sorted.push_back(config.hosts[index]);
  }
  config.hosts = std::move(sorted);
  return {};
}

Expected<UserConfig> parse_table(const toml::table& table, const fs::path& file)
{
  UserConfig config;
  config.file = file;
  for (const auto& [key, value] : table) {
    if ((key.str() == "archive" || key.str() == "slurm") && value.is_table()) {
      continue; // read and checked by their own readers (docs/archive.md, docs/slurm.md)
    }
    if (key.str() == "groups") {
      FERRY_TRY(parse_groups(config, value, file));
      continue;
    }
    const auto* hosts = value.as_table();
    if (key.str() != "hosts" || hosts == nullptr) {
      return fail(ErrorKind::usage,
                  "{}:{}: {}: unknown key; the file holds [hosts.\"PATTERN\"], [groups], "
                  "[slurm] and [archive] sections",
                  file.string(), value.source().begin.line, terminal_safe(key.str()));
    }
    FERRY_TRY(parse_hosts(config, *hosts, file));
  }
  return config;
}

template <typename T> void keep_first(std::optional<T>& into, const std::optional<T>& from)
{
  if (!into && from) {
    into = from;
  }
}

bool matches(const std::string& pattern, std::string_view host)
{
  const std::string name(host);
  if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) {
    return true;
  }
  const auto spec = parse_host_spec(host);
  return spec && ::fnmatch(pattern.c_str(), spec->host.c_str(), 0) == 0;
}

} // namespace

HostConfig UserConfig::for_host(std::string_view host) const
{
  HostConfig merged;
  for (const auto& [pattern, section] : hosts) {
    if (!matches(pattern, host)) {
      continue;
    }
    merged.settings.interpreters.insert(section.settings.interpreters.begin(),
                                        section.settings.interpreters.end());
    merged.settings.env.insert(section.settings.env.begin(), section.settings.env.end());
    keep_first(merged.remote_base, section.remote_base);
    keep_first(merged.ssh.connect_timeout_s, section.ssh.connect_timeout_s);
    keep_first(merged.ssh.persist_s, section.ssh.persist_s);
    keep_first(merged.ssh.user, section.ssh.user);
    keep_first(merged.ssh.port, section.ssh.port);
    keep_first(merged.ssh.identity, section.ssh.identity);
  }
  return merged;
}

fs::path default_user_config_path()
{
  // The XDG spec says to ignore a relative $XDG_CONFIG_HOME.
  if (const fs::path config = env_or("XDG_CONFIG_HOME", ""); config.is_absolute()) {
    return config / "ferry" / "config.toml";
  }
  return fs::path(home_dir()) / ".config" / "ferry" / "config.toml";
}

Expected<UserConfig> parse_user_config(std::string_view text, const fs::path& file)
{
  toml::table table;
  try {
    table = toml::parse(text, file.string());
  } catch (const toml::parse_error& e) {
    return fail(ErrorKind::usage, "{}:{}:{}: invalid TOML: {}", file.string(),
                e.source().begin.line, e.source().begin.column, e.description());
  }
  return parse_table(table, file);
}

Expected<UserConfig> load_user_config(const fs::path& file)
{
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    return UserConfig{};
  }
  FERRY_TRY_ASSIGN(const auto text, read_small_file(file, k_config_file));
  return parse_user_config(text, file);
}

} // namespace ferry
