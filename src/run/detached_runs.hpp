#pragma once
// Detached runs (docs/record.md, "The life of a run") for every front end: `ferry attach`,
// `stop` and `ps` (src/cli/cmd_detached.cpp) and `ferry mcp`'s run tools find them in the
// archive, look at them on their host, and collect them as runs that were never detached.
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ferry/archive.hpp"
#include "ferry/fd.hpp"
#include "ferry/fleet.hpp"
#include "ferry/runner.hpp"
#include "ferry/transport.hpp"

namespace ferry {

// The detached run REF names: its id, a unique prefix of it (or of its random part), or `last`.
[[nodiscard]] Expected<RunRecord> find_detached(Archive& archive, const std::string& ref);

// The options the run was made with, as its record kept them.
[[nodiscard]] RunOptions options_of(const RunRecord& run, bool verbose);

// The job the record carries (its script, as it ran).
[[nodiscard]] Expected<Job> job_of(const RunRecord& run);

// Whether a detached run's directory would have been swept by now, had it finished in time: its
// timeout, grace and --keep-for have all passed since it started. `ps` then says `expired` of a
// run directory that is gone, rather than `gone`.
[[nodiscard]] bool expired_by_now(const RunRecord& run);

// The detached run as its record tells it: enough of a staged run to follow it, read its files
// and remove them (`ferry attach`, `stop`, `ps`, and `ferry mcp`'s run tools alike).
[[nodiscard]] StagedRun detached_staged(const RunRecord& record, const StopToken& stop = {});

// A new, connected session to the run's target.
using DetachedSessionFor =
    std::function<Expected<std::unique_ptr<HostSession>>(const RunRecord& run)>;

// What `ps` says of one run, looked at on its host: `running`, `finished`, `gone`, `expired`,
// or `unreachable: WHY` / `unknown: WHY`.
[[nodiscard]] std::string host_state(const DetachedSessionFor& session_for, const RunRecord& run);

// One collector per detached run on this machine: an exclusive lock (flock) on the file
// COLLECTING_DIR/RUN_ID.lock beside the archive, held while a collector follows and collects the
// run. The kernel lets go of it when its process ends, however it ends: a killed collector never
// holds up the next one. Its file goes when it is let go.
class CollectionLock {
public:
  CollectionLock(Fd fd, std::filesystem::path path) : m_fd(std::move(fd)), m_path(std::move(path))
  {
  }
  CollectionLock(CollectionLock&&) noexcept = default;
  CollectionLock& operator=(CollectionLock&&) noexcept = default;
  CollectionLock(const CollectionLock&) = delete;
  CollectionLock& operator=(const CollectionLock&) = delete;
  ~CollectionLock();

private:
  Fd m_fd;
  std::filesystem::path m_path;
};

// The folder of the lock files, beside the archive at `archive_path`.
[[nodiscard]] std::filesystem::path collecting_dir(const std::filesystem::path& archive_path);

// The lock on collecting `run_id`; nullopt when another collector holds it and `wait` is false,
// or when `stop` was asked for while waiting for it.
[[nodiscard]] Expected<std::optional<CollectionLock>>
lock_collection(const std::filesystem::path& archive_path, const std::string& run_id, bool wait,
                const StopToken& stop);

// How to collect a detached run.
struct CollectRequest {
  bool stop = false;       // `ferry stop`: TERM (KILL after the grace) first
  bool show_output = true; // the observer hears the output as it is read
  bool verbose = false;    // `-v`
  StopToken interrupt;     // stopped: following ends and the run goes on (Attached::detached)
  std::function<void(const Error&)> on_error; // the archive could not forget the detached entry
  // Shows, never archives: hears the final record when another collector archived it.
  RunObserver* view = nullptr;
};

// A collected run, or one that another collector on this machine collected meanwhile.
struct Collected {
  Attached attached;
  bool by_another = false; // `attached.record` is the final record the other one archived
};

// Follows `running` to its end on `session` and collects it (or stops it first): `observer` (an
// ArchivingObserver, which puts the final record into the archive) hears it as one batch of one
// run, and the archive forgets the detached entry. A run whose directory is gone is an error
// that says why it may be. It holds the run's CollectionLock throughout: while another collector
// holds it, attach waits for that one (a note says so) and then answers with the final record it
// archived (`request.view` hears it), or collects the run itself when the other let go of it
// uncollected; stop does not wait: it is an error that says who holds the run.
[[nodiscard]] Expected<Collected> collect_detached(Archive& archive, HostSession& session,
                                                   const Job& job, RunRecord running,
                                                   const CollectRequest& request,
                                                   RunObserver& observer);

} // namespace ferry
