#pragma once
// Every run kept in SQLite: WAL, one transaction per run, script bytes stored once per sha256,
// safe for many ferry processes writing at once; a run the lock keeps out is spooled, not lost.
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/run_record.hpp"

namespace ferry {

struct LogFilter {
  std::optional<std::string> job;
  std::optional<std::string> host;   // matches the target's host or the name the user gave
  std::optional<std::string> status; // "ok", "failed", ...
  std::optional<std::string> since;  // ISO 8601 date or time; runs started at or after it
  int limit = 20;                    // 0: no limit
  // false: leave stdout, stderr and the result bytes out (a one-line-per-run listing).
  bool with_output = true;
};

struct ArchiveOptions {
  // How long one operation waits in all for other processes' locks on the archive. A run that
  // still cannot be written then is spooled (see RecordOutcome).
  std::chrono::milliseconds lock_wait{10'000};
};

// Where record() put the run.
struct RecordOutcome {
  // Set when another process held the archive's lock for all of the wait: the run is in this
  // file (0600, in the 0700 directory "<archive>.spool"), byte for byte, and the next ferry that
  // opens the archive for writing moves it in.
  std::optional<std::filesystem::path> spooled_to;
  std::string why; // "archive PATH stayed locked by another process for 10.0 s"
};

// One run as `ferry log` lists it, read from small columns only.
struct RunSummary {
  RunRecord run;           // without params, result, stdout, stderr, script and result bytes
  std::string result_head; // the result as one JSON line, cut to its first 256 characters;
                           // empty when there is no result
};

struct LoadOptions {
  // Check every archived blob the run uses (its script) against the sha256 it is filed under;
  // a mismatch or a missing blob is an error. For `replay`, which runs them.
  bool verify_blobs = false;
};

class Archive {
public:
  // $FERRY_ARCHIVE, else $XDG_DATA_HOME/ferry/archive.db, else ~/.local/share/ferry/archive.db.
  [[nodiscard]] static std::filesystem::path default_path();

  // Opens or creates the archive (directory 0700, file 0600), migrating older schemas. A schema
  // from a newer ferry, a corrupt or unreadable file: an error naming the path and what to do.
  // Runs spooled while the archive was locked are moved in. A lock that outlasts the wait here
  // is no error: record() tries again, and spools the run if it must.
  [[nodiscard]] static Expected<Archive> open(const std::filesystem::path& path,
                                              const ArchiveOptions& options = {});

  // For `log`, `show`, `export`: never creates, migrates or changes anything, and works on a
  // read-only file. A missing file reads as an archive with no runs (see exists()).
  [[nodiscard]] static Expected<Archive> open_read_only(const std::filesystem::path& path,
                                                        const ArchiveOptions& options = {});

  Archive(Archive&&) noexcept;
  Archive& operator=(Archive&&) noexcept;
  ~Archive();

  // Stores the run, its script bytes (once per sha256) and raw outputs in one transaction,
  // or, when another process holds the lock past the wait, in a spool file (see RecordOutcome).
  // Safe to call from several threads (calls on one Archive are serialized).
  [[nodiscard]] Expected<RecordOutcome> record(const RunRecord& run);

  // Newest first; records carry everything but the script bytes.
  [[nodiscard]] Expected<std::vector<RunRecord>> log(const LogFilter& filter);

  // Newest first, for a listing: reads none of params, results and outputs, so it costs the
  // same whatever the runs hold. `with_output` is not used.
  [[nodiscard]] Expected<std::vector<RunSummary>> list(const LogFilter& filter);

  // A run by its id, a unique prefix of it, or "last"; with script and raw result bytes.
  // No such run, or an ambiguous prefix: ErrorKind::usage.
  [[nodiscard]] Expected<RunRecord> load(std::string_view ref, const LoadOptions& options = {});

  [[nodiscard]] const std::filesystem::path& path() const;

  // false when open_read_only found no archive file.
  [[nodiscard]] bool exists() const;

private:
  struct Impl;
  explicit Archive(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> m_impl;
};

// `--since`: an ISO 8601 UTC date or time ("2026-11-29", "2026-11-29T14:12",
// "2026-11-29 14:12:15Z") or an age ("90m", "12h", "7d", "2w") before `now`, as the
// "YYYY-MM-DDTHH:MM:SS.mmmZ" form that run records' started_at uses. Anything else:
// ErrorKind::usage.
[[nodiscard]] Expected<std::string>
normalize_since(std::string_view text,
                std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

} // namespace ferry
