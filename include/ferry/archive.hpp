#pragma once
// Every run kept in SQLite: WAL, one transaction per run, script bytes stored once per sha256,
// safe for many ferry processes writing at once; a run the lock keeps out is spooled, not lost.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/expected.hpp"
#include "ferry/run_record.hpp"

namespace ferry {

struct LogFilter {
  std::optional<std::string> job;
  std::optional<std::string> host;       // matches the target's host or the name the user gave
  std::optional<std::string> status;     // "ok", "failed", ...
  std::optional<std::string> since;      // ISO 8601 date or time; runs started at or after it
  std::optional<std::string> invocation; // an invocation id (resolve_invocation)
  int limit = 20;                        // 0: no limit
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

// Which runs `last` and `last~N` count (`--job`, `--host`): only this job's, only this host's
// (its name or the alias given).
struct RunNarrowing {
  std::optional<std::string> job;
  std::optional<std::string> host;
};

struct LoadOptions {
  // Check every archived blob the run uses (its script) against the sha256 it is filed under;
  // a mismatch or a missing blob is an error. For `replay`, which runs them.
  bool verify_blobs = false;
  RunNarrowing narrow;
};

// `ferry prune`: which runs go. Runs that `job`/`host` leave out are never removed.
struct PruneOptions {
  std::optional<std::string> started_before; // "YYYY-MM-DDTHH:MM:SS.mmmZ" (normalize_since)
  std::optional<int> keep_last;              // the N newest runs are kept whatever else says
  std::optional<std::uint64_t> max_size;     // bytes: oldest runs go until the runs fit in it
  std::optional<std::string> job;
  std::optional<std::string> host; // the target's host or the name the user gave
  bool dry_run = false;            // say what would go, change nothing
};

// One run as `prune` and `log --stats` count it: its columns' bytes.
struct RunSize {
  std::string run_id;
  std::string job;
  std::string host_label;
  std::string started_at;
  std::uint64_t bytes = 0;
};

struct PruneOutcome {
  std::vector<RunSize> removed; // oldest first (with dry_run: what would be removed)
  std::uint64_t removed_bytes = 0;
  // Blobs no remaining run refers to any more, by the role they had: a run's script, a file
  // sent with it (`files`, --file), an output fetched from it.
  std::int64_t scripts_removed = 0;
  std::int64_t files_removed = 0;
  std::int64_t outputs_removed = 0;
  std::uint64_t file_bytes_before = 0;
  std::uint64_t file_bytes_after = 0;
};

// `ferry log --stats`.
struct ArchiveStats {
  std::uint64_t file_bytes = 0; // the file and its -wal
  std::uint64_t used_bytes = 0; // pages in use (the rest is free space a prune left)
  std::int64_t runs = 0;
  std::int64_t scripts = 0;
  std::string oldest; // started_at of the oldest run; empty when there are none
  std::string newest;
  std::vector<RunSize> largest; // biggest first
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

  // Detached runs not yet collected (`ferry run --detach`, docs/record.md "The life of a run"):
  // kept apart from the finished runs, with the job's bytes, until `attach` or `stop` records the
  // final run (record()) and forgets the detached one.
  [[nodiscard]] Expected<void> record_detached(const RunRecord& run);
  // Newest first, each with its script bytes.
  [[nodiscard]] Expected<std::vector<RunRecord>> detached_runs();
  [[nodiscard]] Expected<void> forget_detached(std::string_view run_id);

  // Newest first; records carry everything but the script bytes.
  [[nodiscard]] Expected<std::vector<RunRecord>> log(const LogFilter& filter);
  // log(), one run at a time: `each` gets each run as it is read, so that memory holds one run
  // whatever the archive holds. An error `each` returns ends the read, and is returned. `each`
  // must not call this Archive.
  [[nodiscard]] Expected<void> log_each(const LogFilter& filter,
                                        const std::function<Expected<void>(RunRecord&&)>& each);

  // Newest first, for a listing: reads none of params, results and outputs, so it costs the
  // same whatever the runs hold. `with_output` is not used.
  [[nodiscard]] Expected<std::vector<RunSummary>> list(const LogFilter& filter);

  // The id of the run REF names: a run id, a unique prefix of one or of its random part (after
  // the timestamp), "last", or "last~N" (N runs before the last, among those `narrow` lets
  // through). No such run, or an ambiguous prefix (the error lists up to 10 candidates):
  // ErrorKind::usage.
  [[nodiscard]] Expected<std::string> resolve(std::string_view ref,
                                              const RunNarrowing& narrow = {});

  // The invocation REF names: "last" (the newest run's invocation), an id, or a unique prefix
  // of one; ErrorKind::usage when none or several match.
  [[nodiscard]] Expected<std::string> resolve_invocation(std::string_view ref);

  // The run resolve() names, with script and raw result bytes.
  [[nodiscard]] Expected<RunRecord> load(std::string_view ref, const LoadOptions& options = {});

  // Removes the runs OPTIONS select, then the scripts no run refers to, in one transaction
  // taken with the bounded lock wait (other ferry processes may be writing), then returns the
  // freed pages to the file system (incremental vacuum; an archive made before ferry set that
  // up is vacuumed whole once). Needs an archive opened with open().
  [[nodiscard]] Expected<PruneOutcome> prune(const PruneOptions& options);

  // Size, run count and the LARGEST biggest runs.
  [[nodiscard]] Expected<ArchiveStats> stats(int largest = 5);

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

// "2GiB", "500MiB", "1.5GB", "4096": a size in bytes. KiB/MiB/GiB/TiB (and K/M/G/T) are
// powers of 1024, KB/MB/GB/TB powers of 1000; case does not matter. Anything else:
// ErrorKind::usage naming WHAT.
[[nodiscard]] Expected<std::uint64_t> parse_size(std::string_view text, std::string_view what);

// A size for people: "1.5 GiB", "320 KiB", "12 B".
[[nodiscard]] std::string size_text(std::uint64_t bytes);

} // namespace ferry
