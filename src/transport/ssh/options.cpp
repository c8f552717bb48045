#include "transport/ssh/options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ferry/host_spec.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/known_hosts.hpp"

extern char** environ;

namespace ferry::ssh {

namespace {

// libssh 0.10's default host key algorithms (kex.c DEFAULT_HOSTKEYS), the list ferry reorders
// to put the types known_hosts holds first, as ssh does.
constexpr std::string_view k_default_host_keys =
    "ssh-ed25519,ecdsa-sha2-nistp521,ecdsa-sha2-nistp384,ecdsa-sha2-nistp256,"
    "sk-ssh-ed25519@openssh.com,sk-ecdsa-sha2-nistp256@openssh.com,rsa-sha2-512,rsa-sha2-256";

// This user's passwd entry's name and home (getpwuid_r: sessions connect from several threads).
std::pair<std::string, std::string> passwd_entry()
{
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr) {
    return {found->pw_name != nullptr ? found->pw_name : "",
            found->pw_dir != nullptr ? found->pw_dir : ""};
  }
  return {};
}

std::string local_user()
{
  const std::string name = passwd_entry().first;
  return name.empty() ? env_or("USER", "") : name;
}

std::string shell()
{
  return env_or("SHELL", "/bin/sh");
}

// `Match exec`: `$SHELL -c COMMAND` with nothing on its stdin, stdout and stderr, as ssh runs it.
int run_match_exec(const std::string& command)
{
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {0, 1, 2}) {
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  const std::string sh = shell();
  std::vector<char*> args{const_cast<char*>(sh.c_str()), const_cast<char*>("-c"),
                          const_cast<char*>(command.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, sh.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc != 0) {
    return -1;
  }
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return -1;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string origin(const ConfigValue& value)
{
  return fmt::format("{} line {}", value.where.file, value.where.line);
}

// Characters a shell would act on, refused in a name that goes into ProxyCommand (as OpenSSH
// 9.6 refuses them).
Expected<void> check_shell_safe(std::string_view what, const std::string& name)
{
  if (name.find_first_of("'`\"$\\;&<>|(){} \t\r\n") != std::string::npos ||
      (!name.empty() && name[0] == '-')) {
    return fail(ErrorKind::usage,
                "{} '{}' holds characters a shell would interpret; ferry does not pass it to a "
                "ProxyCommand",
                what, name);
  }
  return {};
}

class Resolver {
public:
  Resolver(const SshTarget& target, const HostSpec& spec) : m_target(target), m_spec(spec) {}
  Expected<Resolved> run();

private:
  Expected<void> read_config();
  Expected<void> where_to();
  Expected<void> identities();
  Expected<void> identity_agent(IdentityPlan& plan);
  Expected<void> known_hosts();
  Expected<void> trust();
  Expected<void> batch_mode();
  Expected<void> proxy();
  Expected<void> proxy_jump(const ConfigValue& value);
  void timeout_and_algorithms();
  void warnings();
  void set_env_note();
  Expected<std::string> expand_path(const std::string& path, std::string_view what);

  const SshTarget& m_target;
  const HostSpec& m_spec;
  std::string m_home = ssh_home();
  std::string m_config_file;
  SshConfig m_config;
  Resolved m_out;
};

Expected<void> Resolver::read_config()
{
  ConfigQuery query;
  query.host = m_spec.host;
  query.user = m_spec.user;
  query.port = m_spec.port;
  query.home = m_home;
  query.local_user = local_user();
  query.run_command = run_match_exec;
  if (!m_target.ssh_config.empty()) {
    m_config_file = expand_tilde(m_target.ssh_config, m_home);
    std::error_code ec;
    if (m_config_file != "none" && !std::filesystem::exists(m_config_file, ec)) {
      return fail(ErrorKind::usage, "ssh config {} does not exist (--ssh-config)", m_config_file);
    }
    query.config_file = m_config_file;
  }
  FERRY_TRY_ASSIGN(m_config, read_ssh_config(query));
  m_out.config_files = m_config.files_read;
  m_out.blocks = m_config.applied;
  m_out.warnings = m_config.warnings;
  return {};
}

Expected<void> Resolver::where_to()
{
  m_out.host_arg = m_spec.host;
  m_out.host = m_spec.host;
  if (const auto* hostname = m_config.find("hostname")) {
    FERRY_TRY_ASSIGN(m_out.host, percent_expand(hostname->args[0], {{'h', m_spec.host}}, false,
                                                origin(*hostname) + ": HostName"));
  }
  m_out.user = !m_spec.user.empty() ? m_spec.user : m_config.first_arg("user", local_user());
  m_out.port = 22;
  if (m_spec.port != 0) {
    m_out.port = m_spec.port;
  } else if (const auto* port = m_config.find("port")) {
    char* end = nullptr;
    const long value = std::strtol(port->args[0].c_str(), &end, 10);
    if (end == port->args[0].c_str() || *end != '\0' || value < 1 || value > 65535) {
      return fail(ErrorKind::usage, "ssh config {}: Port '{}' is not a number from 1 to 65535",
                  origin(*port), port->args[0]);
    }
    m_out.port = static_cast<unsigned>(value);
  }
  m_out.known_hosts_name = m_config.first_arg("hostkeyalias");
  if (m_out.known_hosts_name.empty()) {
    m_out.known_hosts_name = known_hosts::lookup_name(m_out.host, m_out.port);
  }
  return {};
}

Expected<std::string> Resolver::expand_path(const std::string& path, std::string_view what)
{
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  const std::string this_host = name;
  const std::string port = std::to_string(m_out.port);
  const std::string hash = known_hosts::sha1_hex(this_host + m_out.host + port + m_out.user);
  return percent_expand(expand_tilde(path, m_home),
                        {{'C', hash},
                         {'L', this_host.substr(0, this_host.find('.'))},
                         {'i', std::to_string(::getuid())},
                         {'k', m_config.first_arg("hostkeyalias", m_out.host_arg)},
                         {'l', this_host},
                         {'n', m_out.host_arg},
                         {'p', port},
                         {'d', m_home},
                         {'h', m_out.host},
                         {'r', m_out.user},
                         {'u', local_user()}},
                        true, what);
}

Expected<void> Resolver::identities()
{
  IdentityPlan& plan = m_out.identities;
  if (!m_target.identity.empty()) {
    const std::string file = expand_tilde(m_target.identity, m_home);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      return fail(ErrorKind::usage, "identity file {} does not exist (--identity)", file);
    }
    plan.files.push_back({file, "--identity"});
  }
  for (const auto& value : m_config.identity_files) {
    if (value.args[0] != "none") {
      FERRY_TRY_ASSIGN(auto file, expand_path(value.args[0], origin(value) + ": IdentityFile"));
      plan.files.push_back({std::move(file), origin(value)});
    }
  }
  for (const auto& value : m_config.certificate_files) {
    FERRY_TRY_ASSIGN(auto file, expand_path(value.args[0], origin(value) + ": CertificateFile"));
    plan.certificates.push_back({std::move(file), origin(value)});
  }
  for (const char* name : {"id_rsa", "id_ecdsa", "id_ed25519", "id_dsa"}) {
    plan.defaults.push_back({m_home + "/.ssh/" + name, "default"});
  }
  if (const auto* only = m_config.find("identitiesonly")) {
    plan.identities_only = only->args[0] == "yes" || only->args[0] == "true";
    plan.identities_only_origin = origin(*only);
  }
  return identity_agent(plan);
}

// The agent: IdentityAgent, else $SSH_AUTH_SOCK.
Expected<void> Resolver::identity_agent(IdentityPlan& plan)
{
  plan.agent_socket = env_or("SSH_AUTH_SOCK", "");
  plan.agent_origin = "SSH_AUTH_SOCK";
  if (const auto* agent = m_config.find("identityagent")) {
    const std::string& value = agent->args[0];
    plan.agent_origin = origin(*agent) + " (IdentityAgent)";
    if (value == "none") {
      plan.agent_socket.clear();
    } else if (value != "SSH_AUTH_SOCK") {
      // As ssh: ~, %-tokens and ${VAR} first; what then starts with $ names a variable that
      // holds the socket ($SSH_AUTH_SOCK, $MY_AGENT), anything else is the socket's path.
      FERRY_TRY_ASSIGN(const std::string expanded, expand_path(value, plan.agent_origin));
      plan.agent_socket = !expanded.empty() && expanded[0] == '$'
                              ? env_or(expanded.substr(1).c_str(), "")
                              : expanded;
    }
  }
  return {};
}

Expected<void> Resolver::known_hosts()
{
  if (!m_target.known_hosts.empty()) {
    // An explicit file is the only one consulted: no system-wide list behind the user's back.
    m_out.user_known_hosts = {expand_tilde(m_target.known_hosts, m_home)};
    return {};
  }
  if (const auto* files = m_config.find("userknownhostsfile")) {
    for (const auto& file : files->args) {
      if (file != "none") {
        FERRY_TRY_ASSIGN(auto path, expand_path(file, origin(*files) + ": UserKnownHostsFile"));
        m_out.user_known_hosts.push_back(std::move(path));
      }
    }
  } else {
    m_out.user_known_hosts = {m_home + "/.ssh/known_hosts", m_home + "/.ssh/known_hosts2"};
  }
  if (const auto* files = m_config.find("globalknownhostsfile")) {
    for (const auto& file : files->args) {
      if (file != "none") {
        m_out.global_known_hosts.push_back(expand_tilde(file, m_home));
      }
    }
  } else {
    m_out.global_known_hosts = {"/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"};
  }
  return {};
}

Expected<void> Resolver::trust()
{
  if (const auto* hash = m_config.find("hashknownhosts")) {
    m_out.hash_known_hosts = hash->args[0] == "yes" || hash->args[0] == "true";
  }
  if (m_target.accept_new_host_key) {
    m_out.accept_new = true;
    return {};
  }
  const auto* strict = m_config.find("stricthostkeychecking");
  if (strict == nullptr) {
    return {};
  }
  const std::string& value = strict->args[0];
  if (value == "accept-new") {
    m_out.accept_new = true;
  } else if (value == "no" || value == "off" || value == "false") {
    return fail(ErrorKind::usage,
                "ssh config {}: StrictHostKeyChecking {}: ferry never skips the host key check; "
                "use accept-new (record a new host's key, refuse a changed one) or "
                "--accept-new-host-key",
                origin(*strict), value);
  } else if (value != "yes" && value != "true" && value != "ask") {
    return fail(ErrorKind::usage,
                "ssh config {}: StrictHostKeyChecking '{}' is not yes, ask, "
                "accept-new, no or off",
                origin(*strict), value);
  }
  return {};
}

// BatchMode yes: a script (or its user) says nobody may be asked anything, so a host that asks
// for keyboard-interactive fails at once as it does with no terminal (ssh(1) does not prompt
// either). ssh refuses a value other than yes or no (any case); so does ferry.
Expected<void> Resolver::batch_mode()
{
  const auto* value = m_config.find("batchmode");
  if (value == nullptr) {
    return {};
  }
  const std::string& flag = value->args[0];
  const auto is = [&flag](const char* word) { return ::strcasecmp(flag.c_str(), word) == 0; };
  if (is("yes") || is("true")) {
    m_out.batch_mode = origin(*value);
  } else if (!is("no") && !is("false")) {
    return fail(ErrorKind::usage, "ssh config {}: BatchMode '{}' is not yes or no", origin(*value),
                flag);
  }
  return {};
}

Expected<void> Resolver::proxy_jump(const ConfigValue& value)
{
  // As ssh: the last hop is the jump host, the ones before it are its own -J.
  const std::string& hops = value.args[0];
  const auto comma = hops.rfind(',');
  const std::string last = comma == std::string::npos ? hops : hops.substr(comma + 1);
  FERRY_TRY_ASSIGN(const auto jump, parse_host_spec(last));
  m_out.proxy_argv = {"ssh"};
  if (!jump.user.empty()) {
    m_out.proxy_argv.insert(m_out.proxy_argv.end(), {"-l", jump.user});
  }
  if (jump.port != 0) {
    m_out.proxy_argv.insert(m_out.proxy_argv.end(), {"-p", std::to_string(jump.port)});
  }
  if (comma != std::string::npos) {
    m_out.proxy_argv.insert(m_out.proxy_argv.end(), {"-J", hops.substr(0, comma)});
  }
  if (!m_config_file.empty()) {
    m_out.proxy_argv.insert(m_out.proxy_argv.end(), {"-F", m_config_file});
  }
  if (m_target.debug) {
    m_out.proxy_argv.emplace_back("-v"); // as ssh -v passes it on: its lines show under -v
  }
  // ferry never prompts, and neither does the ssh it starts.
  m_out.proxy_argv.insert(
      m_out.proxy_argv.end(),
      {"-o", "BatchMode=yes", "-W", fmt::format("[{}]:{}", m_out.host, m_out.port), jump.host});
  m_out.proxy_text = fmt::format("ProxyJump {} ({})", hops, origin(value));
  return {};
}

Expected<void> Resolver::proxy()
{
  if (const auto* jump = m_config.find("proxyjump"); jump != nullptr && jump->args[0] != "none") {
    return proxy_jump(*jump);
  }
  const auto* command = m_config.find("proxycommand");
  if (command == nullptr || command->text == "none") {
    return {};
  }
  FERRY_TRY(check_shell_safe("host", m_out.host_arg));
  FERRY_TRY(check_shell_safe("user", m_out.user));
  FERRY_TRY_ASSIGN(const std::string expanded,
                   percent_expand("exec " + command->text,
                                  {{'h', m_out.host},
                                   {'k', m_config.first_arg("hostkeyalias", m_out.host_arg)},
                                   {'n', m_out.host_arg},
                                   {'p', std::to_string(m_out.port)},
                                   {'r', m_out.user}},
                                  false, origin(*command) + ": ProxyCommand"));
  m_out.proxy_argv = {shell(), "-c", expanded};
  m_out.proxy_text = fmt::format("ProxyCommand ({})", origin(*command));
  return {};
}

void Resolver::timeout_and_algorithms()
{
  m_out.timeout_s = 10;
  if (m_target.connect_timeout_s > 0) {
    m_out.timeout_s = m_target.connect_timeout_s;
  } else if (const auto* timeout = m_config.find("connecttimeout")) {
    const long value = std::strtol(timeout->args[0].c_str(), nullptr, 10);
    m_out.timeout_s = value > 0 ? static_cast<double>(value) : 10;
  }
  for (const auto& [keyword, option] :
       {std::pair{"ciphers", SSH_OPTIONS_CIPHERS_C_S},
        {"macs", SSH_OPTIONS_HMAC_C_S},
        {"kexalgorithms", SSH_OPTIONS_KEY_EXCHANGE},
        {"pubkeyacceptedalgorithms", SSH_OPTIONS_PUBLICKEY_ACCEPTED_TYPES},
        {"compression", SSH_OPTIONS_COMPRESSION},
        {"bindaddress", SSH_OPTIONS_BINDADDR}}) {
    const auto* value = m_config.find(keyword);
    if (value == nullptr) {
      continue;
    }
    if (std::string_view("+-^").find(value->args[0][0]) != std::string_view::npos) {
      m_out.warnings.push_back(fmt::format("{}: {} {}: ferry keeps libssh's defaults (libssh 0.10 "
                                           "takes no +, - or ^ lists)",
                                           origin(*value), keyword, value->args[0]));
      continue;
    }
    m_out.algorithms.emplace_back(option, *value);
  }
  m_out.host_key_algorithms = m_config.first_arg("hostkeyalgorithms");
  if (!m_out.host_key_algorithms.empty() && m_out.host_key_algorithms[0] == '-') {
    const auto* value = m_config.find("hostkeyalgorithms");
    m_out.warnings.push_back(fmt::format("{}: hostkeyalgorithms {}: ferry keeps libssh's defaults "
                                         "(a - list is not supported)",
                                         origin(*value), value->args[0]));
  }
}

void Resolver::warnings()
{
  const auto warn = [this](const char* keyword, std::string_view why, auto&& applies) {
    if (const auto* value = m_config.find(keyword); value != nullptr && applies(*value)) {
      m_out.warnings.push_back(
          fmt::format("{}: {} {}: {}", origin(*value), keyword, value->args[0], why));
    }
  };
  const auto always = [](const ConfigValue&) { return true; };
  const auto yes = [](const ConfigValue& v) {
    return v.args[0] == "yes" || v.args[0] == "true" || v.args[0] == "always";
  };
  const auto no = [](const ConfigValue& v) { return v.args[0] == "no" || v.args[0] == "false"; };
  warn("canonicalizehostname",
       "ferry does not canonicalize host names; the name is used as "
       "written",
       yes);
  warn("knownhostscommand", "not run by ferry: host keys come from the known_hosts files only",
       always);
  warn("revokedhostkeys", "not read by ferry (@revoked lines in known_hosts are)", always);
  warn("pkcs11provider", "ferry does not use PKCS#11 keys", always);
  warn("securitykeyprovider", "ferry does not use security keys", always);
  warn("proxyusefdpass", "ferry talks to the proxy command over its stdin and stdout", yes);
  warn("pubkeyauthentication", "ignored: ferry authenticates with keys only", no);
}

// SetEnv asks ssh to send variables to the server. A job gets only the variables its job file,
// ferry's config file and --env declare (docs/job-file.md), so ferry sends none; -v says so,
// with the names only (a value may be a secret), and where to declare them instead.
void Resolver::set_env_note()
{
  const auto* value = m_config.find("setenv");
  if (value == nullptr || !m_target.debug) {
    return;
  }
  std::vector<std::string> names;
  for (const auto& assignment : value->args) {
    names.push_back(assignment.substr(0, assignment.find('=')));
  }
  m_target.debug(fmt::format("{}: SetEnv {}: not sent — a job gets only the variables of its "
                             "[env], config.toml's env and --env; give them there (--env {}=VALUE)",
                             origin(*value), fmt::join(names, " "), names.front()));
}

Expected<Resolved> Resolver::run()
{
  FERRY_TRY(read_config());
  FERRY_TRY(where_to());
  FERRY_TRY(identities());
  FERRY_TRY(known_hosts());
  FERRY_TRY(trust());
  FERRY_TRY(batch_mode());
  FERRY_TRY(proxy());
  timeout_and_algorithms();
  warnings();
  set_env_note();
  return std::move(m_out);
}

std::vector<std::string> split_list(const std::string& list)
{
  std::vector<std::string> names;
  for (std::size_t start = 0; start < list.size();) {
    const auto comma = std::min(list.find(',', start), list.size());
    if (comma > start) {
      names.push_back(list.substr(start, comma - start));
    }
    start = comma + 1;
  }
  return names;
}

// HostKeyAlgorithms as ssh orders them: the types known_hosts holds for the host first.
std::string host_key_order(const Resolved& where, const std::vector<std::string>& known)
{
  const std::string defaults(k_default_host_keys);
  const std::string& wanted = where.host_key_algorithms;
  std::string list = wanted.empty()     ? defaults
                     : wanted[0] == '+' ? defaults + "," + wanted.substr(1)
                     : wanted[0] == '^' ? wanted.substr(1) + "," + defaults
                     : wanted[0] == '-' ? defaults
                                        : wanted;
  const auto is_known = [&known](const std::string& name) {
    return std::any_of(known.begin(), known.end(), [&name](const std::string& type) {
      return type == name || (type == "ssh-rsa" && name.rfind("rsa-sha2-", 0) == 0);
    });
  };
  std::string first, rest;
  for (const auto& name : split_list(list)) {
    std::string& into = is_known(name) ? first : rest;
    into += (into.empty() ? "" : ",") + name;
  }
  return first.empty() ? rest : rest.empty() ? first : first + "," + rest;
}

} // namespace

std::string ssh_home()
{
  const std::string home = passwd_entry().second;
  return home.empty() ? home_dir() : home;
}

Expected<Resolved> resolve(const SshTarget& target)
{
  FERRY_TRY_ASSIGN(const auto spec, parse_host_spec(target.spec));
  return Resolver(target, spec).run();
}

Expected<void> configure(ssh_session session, const Resolved& where,
                         const std::vector<std::string>& known_key_types, int fd)
{
  const bool no = false;
  ssh_options_set(session, SSH_OPTIONS_PROCESS_CONFIG, &no); // ferry has read it already
  ssh_options_set(session, SSH_OPTIONS_HOST, where.host.c_str());
  ssh_options_set(session, SSH_OPTIONS_USER, where.user.c_str());
  ssh_options_set(session, SSH_OPTIONS_PORT, &where.port);
  ssh_options_set(session, SSH_OPTIONS_SSH_DIR, (ssh_home() + "/.ssh").c_str());
  // ferry checks host keys itself (host_key.cpp); libssh must not order or record by its own.
  ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS, "/dev/null");
  ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null");
  const long timeout_s = std::max(1L, static_cast<long>(std::ceil(where.timeout_s)));
  ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout_s);
  const int nodelay = 1;
  ssh_options_set(session, SSH_OPTIONS_NODELAY, &nodelay);
  if (fd >= 0) {
    ssh_options_set(session, SSH_OPTIONS_FD, &fd);
  }
  for (const auto& [option, value] : where.algorithms) {
    if (ssh_options_set(session, option, value.args[0].c_str()) != SSH_OK ||
        (option == SSH_OPTIONS_CIPHERS_C_S &&
         ssh_options_set(session, SSH_OPTIONS_CIPHERS_S_C, value.args[0].c_str()) != SSH_OK) ||
        (option == SSH_OPTIONS_HMAC_C_S &&
         ssh_options_set(session, SSH_OPTIONS_HMAC_S_C, value.args[0].c_str()) != SSH_OK)) {
      return fail(ErrorKind::usage, "ssh config {}: libssh rejects '{}': {}", origin(value),
                  value.args[0], ssh_get_error(session));
    }
  }
  const std::string host_keys = host_key_order(where, known_key_types);
  if (ssh_options_set(session, SSH_OPTIONS_HOSTKEYS, host_keys.c_str()) != SSH_OK) {
    return fail(ErrorKind::usage, "HostKeyAlgorithms '{}': libssh rejects it: {}",
                where.host_key_algorithms, ssh_get_error(session));
  }
  return {};
}

void tell_story(const Resolved& where, const SshTarget& target)
{
  if (target.warn) {
    for (const auto& warning : where.warnings) {
      target.warn(warning);
    }
  }
  if (!target.debug) {
    return;
  }
  for (const auto& file : where.config_files) {
    target.debug(fmt::format("read ssh config {}", file));
  }
  for (const auto& block : where.blocks) {
    target.debug(fmt::format("applying {}", block));
  }
  target.debug(fmt::format("connecting to {} port {} as {}{}", where.host, where.port, where.user,
                           where.proxy_text.empty() ? "" : " through " + where.proxy_text));
  std::string files;
  for (const auto& file : where.user_known_hosts) {
    files += " " + file;
  }
  for (const auto& file : where.global_known_hosts) {
    files += " " + file;
  }
  target.debug(fmt::format("host key looked up as {} in{}{}", where.known_hosts_name, files,
                           where.accept_new ? "; a new key is recorded (accept-new)" : ""));
  if (!where.batch_mode.empty()) {
    target.debug(
        fmt::format("BatchMode yes ({}): no keyboard-interactive prompts", where.batch_mode));
  }
  target.debug(where.identities.agent_socket.empty()
                   ? std::string("no ssh agent")
                   : fmt::format("ssh agent from {}", where.identities.agent_origin));
}

std::string options_identity(const SshTarget& target, const Resolved& where)
{
  const auto paths = [](const std::vector<NamedFile>& files) {
    std::vector<std::string> out;
    for (const auto& file : files) {
      out.push_back(file.path);
    }
    return out;
  };
  nlohmann::json algorithms = nlohmann::json::array();
  for (const auto& [option, value] : where.algorithms) {
    algorithms.push_back({static_cast<int>(option), value.args});
  }
  const nlohmann::json identity = {
      {"spec", target.spec},
      {"host", where.host},
      {"user", where.user},
      {"port", where.port},
      {"known_hosts_name", where.known_hosts_name},
      {"user_known_hosts", where.user_known_hosts},
      {"global_known_hosts", where.global_known_hosts},
      {"accept_new", where.accept_new || target.accept_new_host_key},
      {"hash_known_hosts", where.hash_known_hosts},
      {"proxy", where.proxy_argv},
      {"identities", paths(where.identities.files)},
      {"certificates", paths(where.identities.certificates)},
      {"default_identities", paths(where.identities.defaults)},
      {"identities_only", where.identities.identities_only},
      {"agent", where.identities.agent_socket},
      {"host_key_algorithms", where.host_key_algorithms},
      {"algorithms", algorithms},
      {"timeout_s", where.timeout_s},
      {"remote_base", target.remote_base},
  };
  return identity.dump();
}

} // namespace ferry::ssh
