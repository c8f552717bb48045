// The glob and path rules of files that travel with a job and files that come back from it.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/bundle.hpp"
#include "ferry/fd.hpp"
#include "ferry/job.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace fs = std::filesystem;

namespace {

bool has_wildcard(std::string_view segment)
{
  return segment.find_first_of("*?[") != std::string_view::npos;
}

std::string_view kind_name(mode_t mode)
{
  if (S_ISLNK(mode)) {
    return "a symbolic link";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO";
  }
  if (S_ISSOCK(mode)) {
    return "a socket";
  }
  return "a device or special file";
}

// The matches of one segment among `entries`, each joined to `prefix`.
void match_segment(const std::string& prefix, std::string_view segment,
                   const std::vector<DirEntry>& entries, std::vector<GlobMatch>& into)
{
  const std::string pattern(segment);
  for (const auto& entry : entries) {
    const bool matches = has_wildcard(segment)
                             ? ::fnmatch(pattern.c_str(), entry.name.c_str(), FNM_PERIOD) == 0
                             : entry.name == segment;
    if (matches) {
      into.push_back({prefix.empty() ? entry.name : prefix + "/" + entry.name, entry});
    }
  }
}

} // namespace

Expected<std::vector<std::string>> glob_segments(std::string_view pattern, std::string_view what)
{
  if (pattern.empty()) {
    return fail(ErrorKind::usage, "{}: empty path; give a path relative to the directory", what);
  }
  if (pattern.front() == '/') {
    return fail(ErrorKind::usage,
                "{}: an absolute path; give a path relative to the directory it is taken from",
                what);
  }
  std::vector<std::string> segments;
  for (std::size_t start = 0; start <= pattern.size();) {
    const std::size_t end = std::min(pattern.find('/', start), pattern.size());
    const std::string_view segment = pattern.substr(start, end - start);
    if (segment == "..") {
      return fail(ErrorKind::usage,
                  "{}: `..` leaves the directory; only files below it can be named", what);
    }
    if (!segment.empty() && segment != ".") {
      segments.emplace_back(segment);
    }
    start = end + 1;
  }
  if (segments.empty()) {
    return fail(ErrorKind::usage, "{}: names the directory itself, not a file", what);
  }
  return segments;
}

Expected<std::vector<GlobMatch>> expand_glob(std::string_view pattern, std::string_view what,
                                             const DirLister& list)
{
  FERRY_TRY_ASSIGN(const auto segments, glob_segments(pattern, what));
  std::vector<GlobMatch> current = {{"", DirEntry{"", DirEntry::Kind::dir, 0, {}}}};
  for (std::size_t i = 0; i < segments.size(); ++i) {
    std::vector<GlobMatch> next;
    for (const auto& dir : current) {
      if (dir.entry.kind != DirEntry::Kind::dir) {
        continue; // a link to a directory is never descended into
      }
      FERRY_TRY_ASSIGN(const auto entries, list(dir.path));
      if (entries) {
        match_segment(dir.path, segments[i], *entries, next);
      }
    }
    current = std::move(next);
  }
  std::sort(current.begin(), current.end(),
            [](const GlobMatch& a, const GlobMatch& b) { return a.path < b.path; });
  return current;
}

bool is_reserved_run_file(std::string_view top_level_name)
{
  return top_level_name == "launch.sh" || top_level_name == "params.json" ||
         top_level_name == "result.json" || top_level_name == k_launcher_state_file;
}

Expected<std::optional<std::vector<DirEntry>>> list_local_dir(const fs::path& dir)
{
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), ::closedir);
  if (!handle) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return std::optional<std::vector<DirEntry>>();
    }
    return fail(ErrorKind::failed, "cannot list {}: {}", dir.string(), std::strerror(errno));
  }
  std::vector<DirEntry> entries;
  while (const dirent* item = ::readdir(handle.get())) {
    const std::string name = item->d_name;
    struct stat st {};
    if (name == "." || name == ".." ||
        ::fstatat(::dirfd(handle.get()), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      continue;
    }
    DirEntry entry{name, DirEntry::Kind::other, static_cast<std::uint64_t>(st.st_size), {}};
    if (S_ISREG(st.st_mode)) {
      entry.kind = DirEntry::Kind::file;
    } else if (S_ISDIR(st.st_mode)) {
      entry.kind = DirEntry::Kind::dir;
    } else {
      entry.what = kind_name(st.st_mode);
    }
    entries.push_back(std::move(entry));
  }
  return std::optional(std::move(entries));
}

namespace {

// Files gathered for a job, each landing path once.
class Gathered {
public:
  Gathered(const Job& job, std::uint64_t max_upload) : m_job(job), m_max(max_upload) {}

  Expected<void> add(const std::string& rel, const fs::path& source, std::string_view what)
  {
    const std::string top = rel.substr(0, rel.find('/'));
    if (is_reserved_run_file(top) || top == m_job.file_name) {
      return fail(ErrorKind::usage,
                  "{}: would land at {}, a name ferry itself writes in the run directory; "
                  "rename the file",
                  what, rel);
    }
    if (const auto seen = m_sources.find(rel); seen != m_sources.end()) {
      if (seen->second == source) {
        return {};
      }
      return fail(ErrorKind::usage, "{}: {} and {} would both land at {}; rename one", what,
                  seen->second.string(), source.string(), rel);
    }
    FERRY_TRY_ASSIGN(auto bytes, read_file(source));
    m_total += bytes.size();
    if (m_total > m_max) {
      return fail(ErrorKind::usage,
                  "{}: the job's files come to more than the upload cap of {} MiB (at {}); "
                  "leave large data on the host or raise --max-upload",
                  what, m_max >> 20, rel);
    }
    m_sources.emplace(rel, source);
    m_files.push_back({rel, 0600, sha256_hex(bytes), std::move(bytes)});
    return {};
  }

  std::vector<BundleFile> take() && { return std::move(m_files); }

private:
  const Job& m_job;
  std::uint64_t m_max;
  std::uint64_t m_total = 0;
  std::map<std::string, fs::path> m_sources;
  std::vector<BundleFile> m_files;
};

Expected<void> add_declared(Gathered& gathered, const Job& job, const fs::path& job_dir,
                            const std::string& pattern)
{
  const std::string what = fmt::format("files entry \"{}\" of {}", pattern, job.source);
  const DirLister lister = [&](const std::string& rel) {
    return list_local_dir(rel.empty() ? job_dir : job_dir / rel);
  };
  FERRY_TRY_ASSIGN(const auto matches, expand_glob(pattern, what, lister));
  // A wildcard may match directories beside the files (`data/*`): those are passed over; a
  // directory named as such is a mistake worth saying.
  const bool wildcard_last = has_wildcard(pattern.substr(pattern.rfind('/') + 1));
  std::size_t sent = 0;
  for (const auto& match : matches) {
    if (match.entry.kind == DirEntry::Kind::dir && wildcard_last) {
      continue;
    }
    if (match.entry.kind == DirEntry::Kind::dir) {
      return fail(ErrorKind::usage, "{}: {} is a directory; name its files (\"{}/*\")", what,
                  match.path, match.path);
    }
    if (match.entry.kind == DirEntry::Kind::other) {
      return fail(ErrorKind::usage,
                  "{}: {} is {}; ferry sends only regular files, and follows no link out of the "
                  "job's directory",
                  what, match.path, match.entry.what);
    }
    FERRY_TRY(gathered.add(match.path, job_dir / match.path, what));
    ++sent;
  }
  if (sent == 0) {
    return fail(ErrorKind::usage, "{}: matches no file in {}; check the name, or remove the entry",
                what, job_dir.string());
  }
  return {};
}

// Where a `--file` lands: its relative path when it stays inside the current directory, else
// its file name.
Expected<std::string> landing_path(const std::string& given)
{
  const std::string what = fmt::format("--file {}", given);
  const fs::path path(given);
  if (path.is_relative()) {
    if (auto segments = glob_segments(given, what)) {
      std::string rel;
      for (const auto& segment : *segments) {
        rel += (rel.empty() ? "" : "/") + segment;
      }
      return rel;
    }
  }
  const std::string name = path.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return fail(ErrorKind::usage, "{}: names a directory; give a file", what);
  }
  return name;
}

Expected<void> add_given(Gathered& gathered, const std::string& given)
{
  const std::string what = fmt::format("--file {}", given);
  struct stat st {};
  if (::stat(given.c_str(), &st) != 0) {
    return fail(ErrorKind::usage, "{}: {}; give the path of an existing file", what,
                std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(ErrorKind::usage, "{}: not a regular file; ferry sends only regular files", what);
  }
  FERRY_TRY_ASSIGN(const auto rel, landing_path(given));
  return gathered.add(rel, fs::path(given), what);
}

} // namespace

Expected<void> resolve_job_files(Job& job, const std::vector<std::string>& extra,
                                 std::uint64_t max_upload)
{
  Gathered gathered(job, max_upload);
  if (!job.meta.files.empty()) {
    if (job.source == "built-in") {
      return fail(ErrorKind::usage, "{}: a built-in job cannot declare files", job.name);
    }
    const fs::path job_dir = fs::path(job.source).parent_path();
    for (const auto& pattern : job.meta.files) {
      FERRY_TRY(add_declared(gathered, job, job_dir.empty() ? fs::path(".") : job_dir, pattern));
    }
  }
  for (const auto& given : extra) {
    FERRY_TRY(add_given(gathered, given));
  }
  job.files = std::move(gathered).take();
  return {};
}

std::string output_dir_for(std::string_view pattern, std::string_view run_id, std::string_view host)
{
  std::string safe_host;
  for (const char c : host) {
    const bool plain = std::isalnum(static_cast<unsigned char>(c)) != 0 ||
                       std::string_view("._@:-").find(c) != std::string_view::npos;
    safe_host += plain ? c : '_';
  }
  if (safe_host.empty() || safe_host == "." || safe_host == "..") {
    safe_host = "host";
  }
  std::string dir(pattern);
  for (const auto& [key, value] : {std::pair{std::string_view("{run_id}"), std::string(run_id)},
                                   std::pair{std::string_view("{host}"), safe_host}}) {
    for (std::size_t at = dir.find(key); at != std::string::npos;
         at = dir.find(key, at + value.size())) {
      dir.replace(at, key.size(), value);
    }
  }
  return dir;
}

Expected<int> create_output_file(const fs::path& dir, const std::string& rel)
{
  std::error_code ec;
  fs::create_directories(dir, ec);
  Fd at(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!at) {
    return fail(ErrorKind::failed, "cannot open the output directory {}: {}", dir.string(),
                std::strerror(errno));
  }
  FERRY_TRY_ASSIGN(const auto segments, glob_segments(rel, "output " + rel));
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    const char* name = segments[i].c_str();
    if (::mkdirat(at.get(), name, 0700) != 0 && errno != EEXIST) {
      return fail(ErrorKind::failed, "cannot create {}/{}: {}", dir.string(), rel,
                  std::strerror(errno));
    }
    // O_NOFOLLOW: a link planted in the output directory is not passed through.
    Fd next(::openat(at.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      return fail(ErrorKind::failed, "cannot use {} in {} for {}: {} (a link is never followed)",
                  segments[i], dir.string(), rel, std::strerror(errno));
    }
    at = std::move(next);
  }
  const int fd = ::openat(at.get(), segments.back().c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return fail(ErrorKind::failed, "cannot create {}/{}: {}{}", dir.string(), rel,
                std::strerror(errno), errno == EEXIST ? "; choose an empty --out directory" : "");
  }
  return fd;
}

} // namespace ferry
