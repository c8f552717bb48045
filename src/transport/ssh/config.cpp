#include "transport/ssh/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include <fcntl.h>
#include <glob.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::ssh {

namespace {

constexpr int k_max_include_depth = 16;
constexpr std::size_t k_max_identity_files = 100;

// Every keyword OpenSSH 9.2's ssh knows (readconf.c), and its aliases: a keyword missing here
// is an error, as it is for ssh, unless IgnoreUnknown names it.
constexpr std::string_view k_keywords =
    "protocol cipher fallbacktorsh globalknownhostsfile2 rhostsauthentication "
    "userknownhostsfile2 useroaming usersh useprivilegedport afstokenpassing "
    "kerberosauthentication kerberostgtpassing rsaauthentication rhostsrsaauthentication "
    "compressionlevel gssapiauthentication gssapidelegatecredentials smartcarddevice "
    "pkcs11provider forwardagent exitonforwardfailure xauthlocation gatewayports "
    "passwordauthentication kbdinteractiveauthentication kbdinteractivedevices "
    "pubkeyauthentication hostbasedauthentication identityfile identitiesonly "
    "certificatefile addkeystoagent identityagent hostname hostkeyalias proxycommand port "
    "ciphers macs remoteforward localforward permitremoteopen user host match escapechar "
    "globalknownhostsfile userknownhostsfile connectionattempts batchmode checkhostip "
    "stricthostkeychecking compression tcpkeepalive numberofpasswordprompts syslogfacility "
    "loglevel logverbose dynamicforward preferredauthentications hostkeyalgorithms "
    "casignaturealgorithms bindaddress bindinterface clearallforwardings enablesshkeysign "
    "verifyhostkeydns nohostauthenticationforlocalhost rekeylimit connecttimeout "
    "addressfamily serveraliveinterval serveralivecountmax sendenv setenv controlpath "
    "controlmaster controlpersist hashknownhosts include tunnel tunneldevice localcommand "
    "permitlocalcommand remotecommand visualhostkey kexalgorithms ipqos requesttty "
    "sessiontype stdinnull forkafterauthentication proxyusefdpass canonicaldomains "
    "canonicalizefallbacklocal canonicalizehostname canonicalizemaxdots "
    "canonicalizepermittedcnames streamlocalbindmask streamlocalbindunlink revokedhostkeys "
    "fingerprinthash updatehostkeys hostbasedacceptedalgorithms pubkeyacceptedalgorithms "
    "ignoreunknown proxyjump securitykeyprovider knownhostscommand requiredrsasize "
    "enableescapecommandline forwardx11 forwardx11timeout forwardx11trusted ";
constexpr std::string_view k_aliases = // ALIAS=KEYWORD
    "identityfile2=identityfile keepalive=tcpkeepalive "
    "challengeresponseauthentication=kbdinteractiveauthentication "
    "skeyauthentication=kbdinteractiveauthentication "
    "tisauthentication=kbdinteractiveauthentication dsaauthentication=pubkeyauthentication "
    "hostbasedkeytypes=hostbasedacceptedalgorithms "
    "pubkeyacceptedkeytypes=pubkeyacceptedalgorithms ";

// Each word of `text`, split at spaces.
std::vector<std::string_view> words(std::string_view text)
{
  std::vector<std::string_view> out;
  for (std::size_t start = text.find_first_not_of(' '); start != std::string_view::npos;) {
    const auto end = std::min(text.find(' ', start), text.size());
    out.push_back(text.substr(start, end - start));
    start = text.find_first_not_of(' ', end);
  }
  return out;
}

// Lower-case keyword (or alias) -> the keyword it stands for.
const std::map<std::string, std::string, std::less<>>& keywords()
{
  static const std::map<std::string, std::string, std::less<>> table = [] {
    std::map<std::string, std::string, std::less<>> map;
    for (const auto name : words(k_keywords)) {
      map.emplace(name, name);
    }
    for (const auto pair : words(k_aliases)) {
      const auto equals = pair.find('=');
      map.emplace(pair.substr(0, equals), pair.substr(equals + 1));
    }
    return map;
  }();
  return table;
}

std::string lower(std::string_view text)
{
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

// OpenSSH's secure_permissions: owned by root or the user, writable by no one else.
bool secure_permissions(const struct stat& st)
{
  return (st.st_uid == 0 || st.st_uid == ::getuid()) && (st.st_mode & 022) == 0;
}

// A line of a config file that says something: its keyword and the rest, split once. A
// fan-out reads the same files for each of its hosts, and a fleet's config names every host:
// read and split anew for each, a 256-host file took a quarter of a second of one CPU before
// the first run could start.
struct ConfigLine {
  int number = 0;
  std::string keyword;      // lower-case, as written
  std::string_view rest;    // the arguments' text (after any `=`), trimmed, in ParsedFile::text
  const std::string* known; // the keyword it stands for (keywords()), or null
  std::optional<std::vector<std::string>> args; // split_config_args(rest)
};

struct ParsedFile {
  std::string text; // never changed once split: the lines look into it
  std::vector<ConfigLine> lines;
};

std::optional<ConfigLine> parse_line(std::string_view line, int number)
{
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r' ||
                           line.back() == '\f' || line.back() == '\n')) {
    line.remove_suffix(1);
  }
  const auto start = line.find_first_not_of(" \t");
  if (start == std::string_view::npos || line[start] == '#') {
    return std::nullopt;
  }
  line.remove_prefix(start);
  const auto end = std::min(line.find_first_of(" \t="), line.size());
  ConfigLine parsed{number, lower(line.substr(0, end)), {}, nullptr, std::nullopt};
  std::string_view rest = line.substr(end);
  rest.remove_prefix(std::min(rest.find_first_not_of(" \t"), rest.size()));
  if (!rest.empty() && rest.front() == '=') {
    rest.remove_prefix(1);
    rest.remove_prefix(std::min(rest.find_first_not_of(" \t"), rest.size()));
  }
  parsed.rest = rest;
  if (const auto known = keywords().find(parsed.keyword); known != keywords().end()) {
    parsed.known = &known->second;
  }
  parsed.args = split_config_args(parsed.rest);
  return parsed;
}

// Whether what is left to read of `fd` is exactly `text`, read in pieces into `buffer` (no
// thread holds a copy of a large file, nor a large buffer on its stack).
bool holds(int fd, std::string_view text, std::vector<char>& buffer)
{
  std::size_t at = 0;
  while (true) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      return got == 0 && at == text.size();
    }
    const auto size = static_cast<std::size_t>(got);
    if (size > text.size() - at || std::memcmp(buffer.data(), text.data() + at, size) != 0) {
      return false;
    }
    at += size;
  }
}

// The file's lines, split; the same split as long as the file's bytes are the same (each read
// reads them again: a file changed meanwhile is split anew). Null when it cannot be read. One
// thread at a time: a fan-out's threads, starting together, would each split the file.
std::shared_ptr<const ParsedFile> read_parsed(const std::string& path)
{
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const ParsedFile>> split;
  static std::vector<char> buffer(65536);
  const std::lock_guard lock(mutex);
  const auto known = split.find(path);
  if (known != split.end()) {
    const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd && holds(fd.get(), known->second->text, buffer)) {
      return known->second;
    }
  }
  auto read = read_file(path);
  if (!read) {
    return nullptr;
  }
  auto parsed = std::make_shared<ParsedFile>();
  parsed->text = std::move(*read);
  const std::string_view text = parsed->text;
  int number = 0;
  for (std::size_t start = 0; start < text.size();) {
    const auto end = std::min(text.find('\n', start), text.size());
    if (auto line = parse_line(text.substr(start, end - start), ++number)) {
      parsed->lines.push_back(std::move(*line));
    }
    start = end + 1;
  }
  parsed->lines.shrink_to_fit();
  split[path] = parsed;
  return parsed;
}

struct FileFlags {
  bool user_config = true; // relative Include paths are under ~/.ssh (else /etc/ssh)
  bool check_perm = false;
  bool never_match = false;
};

// One pass over the config files for one host.
class Reader {
public:
  Reader(const ConfigQuery& query, SshConfig& out, bool final_pass)
      : m_query(query), m_out(out), m_final(final_pass)
  {
  }

  bool want_final() const { return m_want_final; }
  Expected<void> read_all();

private:
  struct Position {
    const std::string& file;
    int line;
    FileFlags flags;
    bool* active;
    int depth;
  };

  Expected<bool> read_file(const std::string& path, FileFlags flags, bool* active, int depth);
  Expected<void> process(const ConfigLine& line, Position& at);
  Expected<void> apply(const std::string& keyword, const ConfigLine& line, Position& at);
  Expected<void> block_line(const std::string& keyword, const std::vector<std::string>& args,
                            std::string_view text, Position& at);
  Expected<void> host_line(const std::vector<std::string>& args, Position& at);
  Expected<void> include_line(const std::vector<std::string>& args, Position& at);
  Expected<bool> match_line(const std::vector<std::string>& args, Position& at);
  Expected<bool> match_criterion(std::string_view attribute, const std::string& arg, bool result,
                                 Position& at);
  Expected<bool> match_exec(const std::string& arg, Position& at);
  void store(const std::string& keyword, std::vector<std::string> args, std::string_view text,
             const Position& at);
  void add_file(std::vector<ConfigValue>& list, std::set<std::string>& seen, std::string path,
                const Position& at);

  std::string match_host() const;
  std::string match_user() const;
  std::string location(const Position& at) const
  {
    return fmt::format("{} line {}", at.file, at.line);
  }

  const ConfigQuery& m_query;
  SshConfig& m_out;
  bool m_final;
  bool m_want_final = false;
  std::set<std::string> m_identities;
  std::set<std::string> m_certificates;
};

std::string Reader::match_host() const
{
  // As match_cfg_line: the HostName (with %h) once one is set, else the name given.
  const ConfigValue* hostname = m_out.find("hostname");
  if (hostname == nullptr || hostname->args.empty()) {
    return m_query.host;
  }
  auto expanded = percent_expand(hostname->args[0], {{'h', m_query.host}}, false, "HostName");
  return expanded ? *expanded : hostname->args[0];
}

std::string Reader::match_user() const
{
  if (!m_query.user.empty()) {
    return m_query.user;
  }
  return m_out.first_arg("user", m_query.local_user);
}

Expected<void> Reader::read_all()
{
  bool active = true;
  if (!m_query.config_file.empty()) {
    if (lower(m_query.config_file) == "none") {
      return {};
    }
    FERRY_TRY_ASSIGN(const bool found, read_file(m_query.config_file, {}, &active, 0));
    if (!found) {
      return fail(ErrorKind::usage, "cannot read the ssh config {} (--ssh-config)",
                  m_query.config_file);
    }
    return {};
  }
  FERRY_TRY(read_file(m_query.home + "/.ssh/config", {true, true, false}, &active, 0));
  active = true;
  FERRY_TRY(read_file(m_query.system_config, {false, false, false}, &active, 0));
  return {};
}

// false: the file does not exist (or cannot be opened), which is no error for the default files.
Expected<bool> Reader::read_file(const std::string& path, FileFlags flags, bool* active, int depth)
{
  if (depth > k_max_include_depth) {
    return fail(ErrorKind::usage, "ssh config {}: Include nested more than {} deep", path,
                k_max_include_depth);
  }
  const auto parsed = read_parsed(path);
  if (!parsed) {
    return false;
  }
  struct stat st {};
  if (flags.check_perm && ::stat(path.c_str(), &st) == 0 && !secure_permissions(st)) {
    return fail(ErrorKind::usage,
                "Bad owner or permissions on {}: ssh refuses an ssh config that someone else can "
                "change; chmod go-w {}",
                path, path);
  }
  if (!m_final &&
      std::find(m_out.files_read.begin(), m_out.files_read.end(), path) == m_out.files_read.end()) {
    m_out.files_read.push_back(path);
  }
  Position at{path, 0, flags, active, depth};
  for (const ConfigLine& line : parsed->lines) {
    at.line = line.number;
    FERRY_TRY(process(line, at));
  }
  return true;
}

Expected<void> Reader::process(const ConfigLine& line, Position& at)
{
  if (line.rest.empty()) {
    return fail(ErrorKind::usage, "ssh config {}: no argument after keyword \"{}\"", location(at),
                line.keyword);
  }
  if (line.known == nullptr) {
    const std::string ignored = m_out.first_arg("ignoreunknown");
    if (!ignored.empty() && match_pattern_list(line.keyword, ignored, true)) {
      return {};
    }
    return fail(ErrorKind::usage,
                "ssh config {}: Bad configuration option: {} (ssh refuses this file too; fix "
                "the line, or name it in IgnoreUnknown)",
                location(at), line.keyword);
  }
  return apply(*line.known, line, at);
}

Expected<void> Reader::apply(const std::string& keyword, const ConfigLine& line, Position& at)
{
  const std::string_view rest = line.rest;
  const auto& args = line.args;
  if (!args) {
    return fail(ErrorKind::usage, "ssh config {}: invalid quotes", location(at));
  }
  if (keyword == "host" || keyword == "match") {
    return block_line(keyword, *args, rest, at);
  }
  if (keyword == "include") {
    return include_line(*args, at);
  }
  if (args->empty()) {
    return fail(ErrorKind::usage, "ssh config {}: {} needs an argument", location(at), keyword);
  }
  if (!*at.active) {
    return {};
  }
  if (keyword == "identityfile") {
    add_file(m_out.identity_files, m_identities, args->front(), at);
  } else if (keyword == "certificatefile") {
    add_file(m_out.certificate_files, m_certificates, args->front(), at);
  } else {
    store(keyword, *args, rest, at);
  }
  return {};
}

void Reader::store(const std::string& keyword, std::vector<std::string> args, std::string_view text,
                   const Position& at)
{
  // ProxyCommand and ProxyJump share one slot: whichever comes first wins.
  if ((keyword == "proxycommand" || keyword == "proxyjump") &&
      (m_out.find("proxycommand") != nullptr || m_out.find("proxyjump") != nullptr)) {
    return;
  }
  m_out.values.emplace(keyword,
                       ConfigValue{std::move(args), std::string(text), {at.file, at.line}});
}

void Reader::add_file(std::vector<ConfigValue>& list, std::set<std::string>& seen, std::string path,
                      const Position& at)
{
  if (list.size() < k_max_identity_files && seen.insert(path).second) {
    list.push_back(ConfigValue{{std::move(path)}, {}, {at.file, at.line}});
  }
}

Expected<void> Reader::block_line(const std::string& keyword, const std::vector<std::string>& args,
                                  std::string_view text, Position& at)
{
  if (keyword == "host") {
    FERRY_TRY(host_line(args, at));
  } else {
    FERRY_TRY_ASSIGN(const bool matched, match_line(args, at));
    *at.active = !at.flags.never_match && matched;
  }
  if (*at.active) {
    m_out.applied.push_back(fmt::format("{}: {} {}{}", location(at), keyword, trim(text),
                                        m_final ? " (final pass)" : ""));
  }
  return {};
}

Expected<void> Reader::host_line(const std::vector<std::string>& args, Position& at)
{
  *at.active = false;
  if (at.flags.never_match) {
    return {};
  }
  // The first pass matches the name given; the final pass the HostName (ssh.c passes `host`).
  const std::string host = m_final ? lower(match_host()) : m_query.host;
  for (const auto& arg : args) {
    const bool negated = !arg.empty() && arg[0] == '!';
    if (match_pattern(host, negated ? std::string_view(arg).substr(1) : std::string_view(arg))) {
      if (negated) {
        *at.active = false;
        return {};
      }
      *at.active = true;
    }
  }
  return {};
}

Expected<void> Reader::include_line(const std::vector<std::string>& args, Position& at)
{
  for (const auto& arg : args) {
    if (arg[0] == '~' && !at.flags.user_config) {
      return fail(ErrorKind::usage, "ssh config {}: bad include path {}", location(at), arg);
    }
    std::string pattern = arg;
    if (arg[0] != '/' && arg[0] != '~') {
      pattern = (at.flags.user_config ? m_query.home + "/.ssh/" : std::string("/etc/ssh/")) + arg;
    }
    // ~ is the same home as everywhere else (glob's GLOB_TILDE would read $HOME).
    pattern = expand_tilde(pattern, m_query.home);
    glob_t found{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &found);
    const Defer free_glob([&found] { ::globfree(&found); });
    if (rc == GLOB_NOMATCH) {
      continue;
    }
    if (rc != 0) {
      return fail(ErrorKind::usage, "ssh config {}: glob failed for {}", location(at), pattern);
    }
    const bool was_active = *at.active;
    for (std::size_t i = 0; i < found.gl_pathc; ++i) {
      FileFlags flags{at.flags.user_config, true, at.flags.never_match || !was_active};
      FERRY_TRY(read_file(found.gl_pathv[i], flags, at.active, at.depth + 1));
      *at.active = was_active; // a Match in the included file ends with it
    }
  }
  return {};
}

Expected<bool> Reader::match_line(const std::vector<std::string>& args, Position& at)
{
  bool result = true;
  int attributes = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool negate = args[i][0] == '!';
    const std::string attribute = lower(std::string_view(args[i]).substr(negate ? 1 : 0));
    if (attribute == "all") {
      if (attributes > 1 || i + 1 < args.size()) {
        return fail(ErrorKind::usage,
                    "ssh config {}: 'all' cannot be combined with other Match attributes",
                    location(at));
      }
      return result && !negate;
    }
    ++attributes;
    if (attribute == "canonical" || attribute == "final") {
      m_want_final |= attribute == "final";
      result &= m_final != negate; // both hold only in the final pass, as in ssh
      continue;
    }
    if (i + 1 >= args.size()) {
      return fail(ErrorKind::usage, "ssh config {}: Missing Match criteria for {}", location(at),
                  attribute);
    }
    FERRY_TRY_ASSIGN(const bool matched, match_criterion(attribute, args[++i], result, at));
    result &= matched != negate;
  }
  if (attributes == 0) {
    return fail(ErrorKind::usage, "ssh config {}: One or more attributes required for Match",
                location(at));
  }
  return result;
}

Expected<bool> Reader::match_criterion(std::string_view attribute, const std::string& arg,
                                       bool result, Position& at)
{
  if (attribute == "host") {
    return match_pattern_list(lower(match_host()), arg, true);
  }
  if (attribute == "originalhost") {
    return match_pattern_list(lower(m_query.host), arg, true);
  }
  if (attribute == "user") {
    return match_pattern_list(match_user(), arg, false);
  }
  if (attribute == "localuser") {
    return match_pattern_list(m_query.local_user, arg, false);
  }
  if (attribute == "exec") {
    // Not run once an earlier criterion failed, nor in a file read only to be skipped.
    if (!result || at.flags.never_match) {
      return false;
    }
    return match_exec(arg, at);
  }
  return fail(ErrorKind::usage,
              "ssh config {}: Unsupported Match attribute {} (OpenSSH 9.2 knows all, canonical, "
              "final, exec, host, originalhost, user, localuser)",
              location(at), attribute);
}

Expected<bool> Reader::match_exec(const std::string& arg, Position& at)
{
  const std::string port = std::to_string(m_query.port != 0 ? m_query.port : 22);
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  const std::string this_host = name;
  const std::string host = match_host();
  FERRY_TRY_ASSIGN(const std::string command,
                   percent_expand(arg,
                                  {{'L', this_host.substr(0, this_host.find('.'))},
                                   {'d', m_query.home},
                                   {'h', host},
                                   {'k', m_out.first_arg("hostkeyalias", host)},
                                   {'l', this_host},
                                   {'n', m_query.host},
                                   {'p', port},
                                   {'r', match_user()},
                                   {'u', m_query.local_user},
                                   {'i', std::to_string(::getuid())}},
                                  false, location(at) + ": Match exec"));
  if (!m_query.run_command) {
    return false;
  }
  const int status = m_query.run_command(command);
  if (status < 0) {
    return fail(ErrorKind::usage, "ssh config {}: match exec '{}' cannot be run", location(at),
                command);
  }
  return status == 0;
}

// One argument from s[i] on, its quotes and escapes removed; nullopt when a quote is not closed.
std::optional<std::string> read_word(std::string_view s, std::size_t& i)
{
  std::string arg;
  char quote = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (c == '\\' && (next == '\'' || next == '"' || next == '\\' || (!quote && next == ' '))) {
      arg += next;
      ++i;
    } else if (!quote && (c == ' ' || c == '\t')) {
      break;
    } else if (!quote && (c == '"' || c == '\'')) {
      quote = c;
    } else if (quote && c == quote) {
      quote = 0;
    } else {
      arg += c;
    }
  }
  if (quote) {
    return std::nullopt;
  }
  return arg;
}

} // namespace

const ConfigValue* SshConfig::find(const std::string& keyword) const
{
  const auto it = values.find(keyword);
  return it == values.end() ? nullptr : &it->second;
}

std::string SshConfig::first_arg(const std::string& keyword, std::string fallback) const
{
  const ConfigValue* value = find(keyword);
  return value != nullptr && !value->args.empty() ? value->args[0] : std::move(fallback);
}

Expected<SshConfig> read_ssh_config(const ConfigQuery& query)
{
  SshConfig config;
  Reader first(query, config, false);
  FERRY_TRY(first.read_all());
  if (first.want_final()) {
    Reader final_pass(query, config, true);
    FERRY_TRY(final_pass.read_all());
  }
  return config;
}

std::optional<std::vector<std::string>> split_config_args(std::string_view s)
{
  std::vector<std::string> args;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ' ' || s[i] == '\t') {
      ++i;
    } else if (s[i] == '#') {
      break;
    } else {
      auto word = read_word(s, i);
      if (!word) {
        return std::nullopt;
      }
      args.push_back(std::move(*word));
    }
  }
  return args;
}

bool match_pattern(std::string_view text, std::string_view pattern)
{
  std::size_t t = 0, p = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++t, ++p;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1, t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') {
    ++p;
  }
  return p == pattern.size();
}

bool match_pattern_list(std::string_view text, std::string_view list, bool lower_patterns)
{
  bool positive = false;
  while (true) {
    const auto comma = list.find(',');
    std::string pattern(list.substr(0, comma));
    const bool negated = !pattern.empty() && pattern[0] == '!';
    if (negated) {
      pattern.erase(0, 1);
    }
    if (lower_patterns) {
      pattern = lower(pattern);
    }
    if (match_pattern(text, pattern)) {
      if (negated) {
        return false;
      }
      positive = true;
    }
    if (comma == std::string_view::npos) {
      return positive;
    }
    list.remove_prefix(comma + 1);
  }
}

std::string expand_tilde(const std::string& path, const std::string& home)
{
  if (path.empty() || path[0] != '~') {
    return path;
  }
  const auto slash = path.find('/');
  const std::string name = path.substr(1, slash == std::string::npos ? slash : slash - 1);
  std::string base = home;
  if (!name.empty()) {
    passwd entry{};
    passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
        found == nullptr || found->pw_dir == nullptr) {
      return path; // no such user: left as written, as ssh leaves it
    }
    base = found->pw_dir;
  }
  return slash == std::string::npos ? base : base + path.substr(slash);
}

Expected<std::string> percent_expand(std::string_view text,
                                     const std::map<char, std::string>& tokens, bool dollar,
                                     std::string_view what)
{
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (dollar && text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      const auto close = text.find('}', i + 2);
      if (close == std::string_view::npos || close == i + 2) {
        return fail(ErrorKind::usage, "{}: bad ${{...}} in '{}'", what, text);
      }
      const std::string name(text.substr(i + 2, close - i - 2));
      const char* value = std::getenv(name.c_str());
      if (value == nullptr) {
        return fail(ErrorKind::usage, "{}: environment variable ${{{}}} has no value", what, name);
      }
      out += value;
      i = close;
    } else if (text[i] != '%') {
      out += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == '%') {
      out += '%';
      ++i;
    } else if (const auto token = i + 1 < text.size() ? tokens.find(text[i + 1]) : tokens.end();
               token != tokens.end()) {
      out += token->second;
      ++i;
    } else {
      return fail(ErrorKind::usage, "{}: unknown token %{} in '{}'", what,
                  i + 1 < text.size() ? std::string(1, text[i + 1]) : std::string(), text);
    }
  }
  return out;
}

} // namespace ferry::ssh
