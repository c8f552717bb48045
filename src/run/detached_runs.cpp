#include "run/detached_runs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::chrono::milliseconds k_collection_lock_poll{100};

// A run id as ferry makes them (`20261130T221801Z-5ba13799`): safe as a file name.
bool is_run_id_text(std::string_view id)
{
  return !id.empty() && id.size() <= 100 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '-';
  });
}

// The lock on the file at `path`, or nullopt while another collector holds it.
Expected<std::optional<CollectionLock>> try_collection_lock(const fs::path& path)
{
  for (;;) {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) {
      return fail(ErrorKind::failed,
                  "cannot open the collection lock {}: {}; the archive's directory must be "
                  "writable to collect a run",
                  terminal_safe(path.string()), std::strerror(errno));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return std::optional<CollectionLock>();
      }
      return fail(ErrorKind::failed,
                  "cannot lock {}: {}; the archive's directory must be on a file system that "
                  "supports flock to collect a run",
                  terminal_safe(path.string()), std::strerror(errno));
    }
    // The collector before removed the file as it let go of it: the lock is on the one there now.
    struct stat held {};
    struct stat named {};
    if (::fstat(fd.get(), &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      return std::optional<CollectionLock>(CollectionLock(std::move(fd), path));
    }
  }
}

} // namespace

CollectionLock::~CollectionLock()
{
  if (m_fd) {
    ::unlink(m_path.c_str()); // before the lock goes: a collector waiting on it opens a new file
  }
}

fs::path collecting_dir(const fs::path& archive_path)
{
  return archive_path.parent_path() / "collecting";
}

Expected<std::optional<CollectionLock>> lock_collection(const fs::path& archive_path,
                                                        const std::string& run_id, bool wait,
                                                        const StopToken& stop)
{
  if (!is_run_id_text(run_id)) {
    return fail(ErrorKind::failed,
                "the archive names run id '{}', which ferry did not make; the "
                "record is damaged",
                terminal_safe(run_id));
  }
  const fs::path dir = collecting_dir(archive_path);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return fail(ErrorKind::failed, "cannot make {} for the locks of the runs being collected: {}",
                terminal_safe(dir.string()), ec.message());
  }
  const fs::path path = dir / (run_id + ".lock");
  for (;;) {
    FERRY_TRY_ASSIGN(auto lock, try_collection_lock(path));
    if (lock || !wait || stop.stop_requested()) {
      return lock;
    }
    std::this_thread::sleep_for(k_collection_lock_poll);
  }
}

Expected<RunRecord> find_detached(Archive& archive, const std::string& ref)
{
  FERRY_TRY_ASSIGN(auto runs, archive.detached_runs());
  if (runs.empty()) {
    return fail(ErrorKind::usage,
                "no detached run '{}': none waits for collection (`ferry run JOB --detach` "
                "starts one; `ferry log` lists the collected ones)",
                terminal_safe(ref));
  }
  if (ref == "last") {
    return std::move(runs.front());
  }
  std::vector<RunRecord*> matches;
  for (auto& run : runs) {
    const std::string_view id = run.run_id;
    const auto dash = id.rfind('-');
    if (id == ref) {
      return std::move(run);
    }
    if (id.starts_with(ref) ||
        (dash != std::string_view::npos && id.substr(dash + 1).starts_with(ref))) {
      matches.push_back(&run);
    }
  }
  if (matches.size() == 1) {
    return std::move(*matches.front());
  }
  std::string listed;
  for (const auto& run : runs) {
    listed += fmt::format("\n  {} {} {}", run.run_id, run.job, run.host_label);
  }
  return fail(ErrorKind::usage, "{} detached run '{}'; `ferry ps` lists them:{}",
              matches.empty() ? "no" : "more than one", terminal_safe(ref), listed);
}

RunOptions options_of(const RunRecord& run, bool verbose)
{
  RunOptions options;
  const json& recorded = run.options;
  const json& detached = run.detached;
  options.verbose = verbose;
  options.timeout_s = recorded.value("timeout_s", 300);
  options.grace_s = recorded.value("grace_s", 2);
  options.output_cap = recorded.value("output_cap", std::size_t{16} << 20);
  options.result_cap = recorded.value("result_cap", std::size_t{64} << 20);
  options.fetch = detached.value("fetch", std::vector<std::string>{});
  options.out_dir = detached.value("out_dir", std::string("ferry-out/{run_id}/{host}"));
  options.archive_outputs_max = detached.value("archive_outputs_max", std::uint64_t{16} << 20);
  options.invocation = run.invocation;
  return options;
}

Expected<Job> job_of(const RunRecord& run)
{
  const std::string name = run.detached.value("script_name", run.job);
  return parse_job(run.job, name.empty() ? run.job : name, "archive", run.script);
}

bool expired_by_now(const RunRecord& run)
{
  const long long most = run.options.value("timeout_s", 300LL) + run.options.value("grace_s", 2LL) +
                         run.detached.value("keep_for_s", 0LL);
  const auto started = seconds_since_utc(run.started_at);
  return started && *started > static_cast<double>(most);
}

std::string host_state(const DetachedSessionFor& session_for, const RunRecord& run)
{
  auto session = session_for(run);
  if (!session) {
    return "unreachable: " + session.error().message;
  }
  auto state =
      detached_state(**session, detached_staged(run), run.detached.value("launcher_pid", 0LL));
  if (!state) {
    return "unknown: " + state.error().message;
  }
  switch (*state) {
  case DetachedState::gone:
    return expired_by_now(run) ? "expired" : "gone";
  case DetachedState::lost:
    return "lost: its launcher died without an exit status (killed, or the host restarted); "
           "`ferry attach` records it failed";
  case DetachedState::finished:
    return "finished";
  case DetachedState::running:
    break;
  }
  return "running";
}

namespace {

// The final record another collector archived of `run_id`; nullopt while the run still waits
// for collection.
Expected<std::optional<RunRecord>> collected_meanwhile(Archive& archive, const std::string& run_id)
{
  FERRY_TRY_ASSIGN(const auto runs, archive.detached_runs());
  if (std::any_of(runs.begin(), runs.end(),
                  [&run_id](const RunRecord& run) { return run.run_id == run_id; })) {
    return std::optional<RunRecord>();
  }
  auto archived = archive.load(run_id);
  if (!archived) {
    return fail(ErrorKind::failed,
                "run {} was collected by another ferry meanwhile, but its final record is not in "
                "the archive ({}); `ferry show {}` shows it once it is",
                run_id, archived.error().message, run_id);
  }
  return std::optional<RunRecord>(std::move(archived).value());
}

// The run's collection lock; nullopt when interrupted while another collector held it.
Expected<std::optional<CollectionLock>> take_collection(const Archive& archive,
                                                        const RunRecord& running,
                                                        const CollectRequest& request,
                                                        RunObserver& observer)
{
  FERRY_TRY_ASSIGN(auto lock, lock_collection(archive.path(), running.run_id, false, {}));
  if (lock) {
    return lock;
  }
  if (request.stop) {
    return fail(ErrorKind::failed,
                "run {} is being collected by another ferry on this machine (a `ferry attach`, or "
                "a `ferry mcp` collecting its result); it was not stopped: stop that one (Ctrl-C "
                "detaches an attach) and `ferry stop {}` again, or let it collect the run",
                running.run_id, running.run_id);
  }
  observer.run_note({running.host_label, running.job},
                    "another ferry on this machine is collecting this run; waiting for it to "
                    "finish");
  return lock_collection(archive.path(), running.run_id, true, request.interrupt);
}

} // namespace

Expected<Collected> collect_detached(Archive& archive, HostSession& session, const Job& job,
                                     RunRecord running, const CollectRequest& request,
                                     RunObserver& observer)
{
  const std::string host = running.host_label;
  const std::string job_name = running.job;
  observer.batch_started({1, 1, {}});
  observer.run_started({host, job_name});
  FERRY_TRY_ASSIGN(const auto lock, take_collection(archive, running, request, observer));
  if (!lock) { // interrupted while waiting: the run goes on
    return Collected{{Attached::End::detached, std::move(running)}, false};
  }
  FERRY_TRY_ASSIGN(auto archived, collected_meanwhile(archive, running.run_id));
  if (archived) {
    if (request.view != nullptr) {
      request.view->run_finished(*archived);
    }
    observer.batch_finished();
    return Collected{{Attached::End::collected, std::move(*archived)}, true};
  }
  RunOptions options = options_of(running, request.verbose);
  options.stop = request.interrupt;
  if (request.show_output) {
    options.on_output = [&observer, &host, &job_name](OutputStream stream, std::string_view bytes) {
      observer.run_output({host, job_name}, stream, bytes);
    };
  }
  options.on_note = [&observer, &host, &job_name](std::string_view text) {
    observer.run_note({host, job_name}, text); // a scheduler's: the job pending
  };
  const std::string run_id = running.run_id;
  FERRY_TRY_ASSIGN(Attached attached,
                   attach_run(session, job, std::move(running), options, request.stop));
  if (attached.end == Attached::End::detached) {
    return Collected{std::move(attached), false};
  }
  if (attached.end == Attached::End::gone) {
    return fail(ErrorKind::failed,
                "run {} is gone from {}: its run directory {} is not there (collected by another "
                "ferry, or removed by the host's sweep after --keep-for {} s); `ferry ps` says "
                "which",
                run_id, terminal_safe(host),
                terminal_safe(attached.record.detached.value("run_dir", std::string())),
                attached.record.detached.value("keep_for_s", 0LL));
  }
  observer.run_finished(attached.record);
  observer.batch_finished();
  if (auto forgotten = archive.forget_detached(run_id); !forgotten && request.on_error) {
    request.on_error(forgotten.error());
  }
  return Collected{std::move(attached), false};
}

} // namespace ferry
