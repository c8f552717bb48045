// The note of the python standby's script in a host's job cache (standby/memo.hpp).
#include "transport/ssh/standby/memo.hpp"

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/util.hpp"
#include "ferry/version.hpp"
#include "transport/user_runtime_dir.hpp"

namespace ferry::ssh {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view k_failed = "no";
constexpr std::size_t k_max_size = 4096;

std::optional<fs::path> memo_path(const std::string& options_identity, bool create)
{
  auto dir = user_runtime_dir(create);
  if (!dir) {
    return std::nullopt;
  }
  return standby_memo_path(*dir, options_identity);
}

// The note's text when it is the user's own regular file, private, and fresh (`written`: when).
std::optional<std::string> read_fresh(const fs::path& path, struct timespec* written = nullptr)
{
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid() ||
      (st.st_mode & 077) != 0 || st.st_size > static_cast<off_t>(k_max_size)) {
    return std::nullopt;
  }
  const auto age = std::chrono::seconds(std::time(nullptr) - st.st_mtime);
  if (age < std::chrono::seconds(-60) || age >= k_standby_memo_fresh) {
    return std::nullopt;
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  const ssize_t n = ::read(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    return std::nullopt;
  }
  while (!text.empty() && text.back() == '\n') {
    text.pop_back();
  }
  if (written != nullptr) {
    *written = st.st_mtim;
  }
  return text;
}

bool is_sha256_hex(std::string_view text)
{
  return text.size() == 64 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A note's text: the entry, then the compiled code's sha256 when known.
std::pair<std::string_view, std::string_view> note_fields(std::string_view text)
{
  const auto space = text.find(' ');
  if (space == std::string_view::npos) {
    return {text, {}};
  }
  return {text.substr(0, space), text.substr(space + 1)};
}

// Written whole under a fresh name, then renamed over the note (dated `written` when given).
void write_note(const std::string& options_identity, std::string_view text,
                const struct timespec* written = nullptr)
{
  const auto path = memo_path(options_identity, true);
  if (!path) {
    return;
  }
  fs::path temporary = *path;
  temporary += ".tmp-" + random_hex(8);
  {
    const Fd fd(
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) {
      return;
    }
    const std::string line = std::string(text) + "\n";
    const struct timespec times[2] = {{0, UTIME_OMIT}, written ? *written : timespec{0, UTIME_NOW}};
    if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()) ||
        ::futimens(fd.get(), times) != 0) {
      ::unlink(temporary.c_str());
      return;
    }
  }
  if (::rename(temporary.c_str(), path->c_str()) != 0) {
    ::unlink(temporary.c_str());
  }
}

} // namespace

fs::path standby_memo_path(const fs::path& dir, const std::string& options_identity)
{
  const std::string key = fmt::format("{}\n{}\n{}", ::getuid(), version(), options_identity);
  return dir / (sha256_hex(key).substr(0, 24) + ".standby");
}

std::optional<StandbyMemo> recall_standby(const std::string& options_identity,
                                          std::string_view expected_name)
{
  const auto path = memo_path(options_identity, false);
  const auto text = path ? read_fresh(*path) : std::nullopt;
  if (!text) {
    return std::nullopt;
  }
  if (*text == k_failed) {
    return StandbyMemo{};
  }
  // This build's script, under an absolute run base whose path is neutral in a command.
  const auto [entry, tag] = note_fields(*text);
  const auto slash = entry.rfind('/');
  if (slash == std::string::npos || slash == 0 || entry[0] != '/' ||
      entry.substr(slash + 1) != expected_name || !is_shell_neutral_token(entry)) {
    return std::nullopt;
  }
  return StandbyMemo{std::string(entry), is_sha256_hex(tag) ? std::string(tag) : std::string()};
}

void remember_standby(const std::string& options_identity, const std::string& entry)
{
  if (const auto path = memo_path(options_identity, false)) {
    if (const auto text = read_fresh(*path); text && *text == k_failed) {
      return;
    } else if (text) {
      const auto [noted, tag] = note_fields(*text);
      if (noted == entry && is_sha256_hex(tag)) {
        write_note(options_identity, *text);
        return;
      }
    }
  }
  write_note(options_identity, entry);
}

void remember_standby_code(const std::string& options_identity, const std::string& entry,
                           const std::string& tag_sha256)
{
  const auto path = memo_path(options_identity, false);
  struct timespec written {};
  const auto text = path ? read_fresh(*path, &written) : std::nullopt;
  if (!text || note_fields(*text).first != entry || !is_sha256_hex(tag_sha256) ||
      !is_shell_neutral_token(entry)) {
    return;
  }
  write_note(options_identity, entry + " " + tag_sha256, &written);
}

void standby_failed(const std::string& options_identity)
{
  write_note(options_identity, k_failed);
}

void forget_standby(const std::string& options_identity)
{
  if (const auto path = memo_path(options_identity, false)) {
    ::unlink(path->c_str());
  }
}

} // namespace ferry::ssh
