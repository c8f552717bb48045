#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "archive/errors.hpp"
#include "archive/setup.hpp"
#include "archive/spool.hpp"
#include "archive/store.hpp"
#include "ferry/util.hpp"

namespace ferry::archive {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view run_suffix = ".run";
constexpr std::string_view temp_marker = ".tmp-";
constexpr std::string_view claim_marker = ".run.claimed-";

// The run id as a file name: ids ferry makes are safe as they are; anything else is hashed.
std::string file_stem(const std::string& run_id)
{
  const bool safe = !run_id.empty() && run_id.size() <= 100 && run_id.front() != '.' &&
                    std::all_of(run_id.begin(), run_id.end(), [](char c) {
                      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                             (c >= 'A' && c <= 'Z') || c == '-' || c == '_' || c == '.';
                    });
  return safe ? run_id : "run-" + sha256_hex(run_id).substr(0, 32);
}

Expected<void> make_private_dir(const fs::path& dir)
{
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail(ErrorKind::failed, "cannot create spool directory {}: {}", dir.string(),
                std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    return fail(ErrorKind::failed,
                "spool directory {} is not a directory of yours; move it aside so ferry can "
                "create it",
                dir.string());
  }
  if ((st.st_mode & 077) != 0) {
    ::chmod(dir.c_str(), 0700);
  }
  return {};
}

void sync_path(const fs::path& path)
{
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The spool file's schema and the run, with the same code that writes the archive.
Expected<void> write_spool_file(const fs::path& file, const RunRecord& run)
{
  FERRY_TRY_ASSIGN(auto db, open_database(file, SQLITE_OPEN_READWRITE));
  FERRY_TRY_ASSIGN(const bool ready, set_up(db, file, JournalMode::off));
  if (!ready) {
    return fail(ErrorKind::failed, "spool file {} is locked", file.string());
  }
  FERRY_TRY(explained(db.exec("BEGIN IMMEDIATE"), file, "spool run", &db));
  FERRY_TRY(insert_run(db, file, run));
  return explained(db.exec("COMMIT"), file, "spool run", &db);
}

// The process id after MARKER in NAME, or 0.
pid_t owner_pid(const std::string& name, std::string_view marker)
{
  const auto at = name.rfind(marker);
  if (at == std::string::npos) {
    return 0;
  }
  const std::string digits = name.substr(at + marker.size());
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return 0;
  }
  return static_cast<pid_t>(std::stol(digits));
}

bool process_gone(pid_t pid)
{
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

bool ends_with(const std::string& text, std::string_view suffix)
{
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files to move in, oldest name first: finished runs, and runs a ferry that died was moving
// in. Temporary files of a ferry that died while spooling are removed.
std::vector<fs::path> spooled_files(const fs::path& dir)
{
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, run_suffix) || (name.find(claim_marker) != std::string::npos &&
                                        process_gone(owner_pid(name, claim_marker)))) {
      files.push_back(it->path());
    } else if (name.find(temp_marker) != std::string::npos &&
               process_gone(owner_pid(name, temp_marker))) {
      ::unlink(it->path().c_str());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

enum class Moved { yes, left, locked };

// Copies the run in the spool file FILE into DB in one transaction.
Moved copy_in(Database& db, const fs::path& file)
{
  auto attach = db.prepare("ATTACH DATABASE ?1 AS spool");
  if (!attach || !attach->bind(1, file.string()).run()) {
    return Moved::left;
  }
  Moved moved = Moved::left;
  auto begun = retry_while_locked(db, [&] { return db.exec("BEGIN IMMEDIATE"); });
  if (!begun) {
    moved = begun.error().locked() ? Moved::locked : Moved::left;
  } else if (db.exec(
                 fmt::format("INSERT INTO scripts(sha256, name, bytes) SELECT sha256, name, bytes "
                             "FROM spool.scripts WHERE true ON CONFLICT(sha256) DO NOTHING; "
                             "INSERT INTO runs({0}) SELECT {0} FROM spool.runs WHERE true "
                             "ON CONFLICT(run_id) DO NOTHING; "
                             "INSERT INTO run_files SELECT * FROM spool.run_files WHERE true "
                             "ON CONFLICT DO NOTHING; "
                             "INSERT INTO run_invocations SELECT * FROM spool.run_invocations "
                             "WHERE true ON CONFLICT DO NOTHING; COMMIT",
                             run_columns))) {
    moved = Moved::yes;
  } else {
    (void)db.exec("ROLLBACK");
  }
  (void)db.exec("DETACH DATABASE spool");
  return moved;
}

// Brings a spool file written by an older ferry to this ferry's schema; false when it cannot
// be read here (a newer ferry's, or damaged).
bool bring_up_to_date(const fs::path& file)
{
  auto spool = Database::open(file.string(), SQLITE_OPEN_READWRITE);
  if (!spool) {
    return false;
  }
  const auto ready = set_up(*spool, file, JournalMode::off);
  return ready && *ready;
}

// Claims FILE (a rename only one process can win), moves its run in, and removes it; puts it
// back under its spooled name when the run could not be moved.
Moved ingest_file(Database& db, const fs::path& file)
{
  std::string name = file.filename().string();
  if (const auto at = name.find(claim_marker); at != std::string::npos) {
    name.resize(at + run_suffix.size());
  }
  const fs::path spooled = file.parent_path() / name;
  const fs::path claimed = file.parent_path() / fmt::format("{}.claimed-{}", name, ::getpid());
  if (::rename(file.c_str(), claimed.c_str()) != 0) {
    return Moved::left; // another ferry is moving it in
  }
  const Moved moved = bring_up_to_date(claimed) ? copy_in(db, claimed) : Moved::left;
  if (moved == Moved::yes) {
    ::unlink(claimed.c_str());
  } else {
    ::rename(claimed.c_str(), spooled.c_str());
  }
  return moved;
}

} // namespace

fs::path spool_dir(const fs::path& archive)
{
  return archive.string() + ".spool";
}

Expected<fs::path> spool_run(const fs::path& archive, const RunRecord& run)
{
  const fs::path dir = spool_dir(archive);
  FERRY_TRY(make_private_dir(dir));
  const std::string stem = file_stem(run.run_id);
  const fs::path temp = dir / fmt::format("{}{}{}", stem, temp_marker, ::getpid());
  const fs::path file = dir / (stem + std::string(run_suffix));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return fail(ErrorKind::failed, "cannot create {}: {}", temp.string(), std::strerror(errno));
  }
  ::fchmod(fd, 0600);
  ::close(fd);
  auto written = write_spool_file(temp, run);
  if (written) {
    sync_path(temp);
  }
  // link, not rename: a file already spooled under this name is never replaced.
  if (written && ::link(temp.c_str(), file.c_str()) != 0) {
    written = fail(ErrorKind::failed, "cannot create {}: {}", file.string(), std::strerror(errno));
  }
  ::unlink(temp.c_str());
  FERRY_TRY(written);
  sync_path(dir);
  return file;
}

void ingest_spool(Database& db, const fs::path& archive)
{
  std::error_code ec;
  const fs::path dir = spool_dir(archive);
  if (!fs::is_directory(dir, ec)) {
    return;
  }
  for (const auto& file : spooled_files(dir)) {
    if (ingest_file(db, file) == Moved::locked) {
      return; // the archive is busy: the rest waits for the next ferry
    }
  }
}

} // namespace ferry::archive
