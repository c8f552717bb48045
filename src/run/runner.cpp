// One run, as phases read top to bottom: stage (run directory, job, params, launcher), exec (the
// only command a shell sees), collect (status and result), clean (a guard removes the run
// directory on every path out).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include <unistd.h>

#include "ferry/fd.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/remote/standby_boot.hpp"
#include "ferry/runner.hpp"
#include "ferry/slurm.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "ferry/version.hpp"
#include "run/detached_runs.hpp"

namespace ferry {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

RunRecord new_record(const Job& job, const json& params, const HostSession& session)
{
  RunRecord record;
  record.run_id = new_run_id();
  record.job = job.name;
  record.job_sha256 = sha256_hex(job.bytes);
  record.target = session.target();
  record.host_label = session.label();
  record.params = params;
  record.started_at = utc_iso(std::chrono::system_clock::now());
  record.ferry_version = std::string(version());
  record.script = job.bytes;
  record.script_name = job.file_name;
  return record;
}

// Where the job was read from, for `replay` to look there for today's copy: a file's absolute
// path, "built-in", or null (archived bytes being replayed).
json job_source(const Job& job)
{
  std::error_code ec;
  if (job.source == "built-in") {
    return job.source;
  }
  if (std::filesystem::is_regular_file(job.source, ec)) {
    return std::filesystem::absolute(job.source, ec).string();
  }
  return nullptr;
}

} // namespace

nlohmann::json recorded_options(const RunOptions& options, const Job& job)
{
  json recorded = {
      {"timeout_s", options.timeout_s.value_or(job.meta.timeout_s)},
      {"grace_s", options.grace_s},
      {"output_cap", options.output_cap},
      {"result_cap", options.result_cap},
      {"interpreter", job.meta.interpreter},
      {"remote_base", options.remote_base.empty() ? json(nullptr) : json(options.remote_base)},
      {"job_source", job_source(job)},
  };
  if (const int gpus = options.gpus.value_or(job.meta.gpus); gpus > 0) {
    recorded["gpus"] = gpus;
    recorded["wait_gpus_s"] = options.wait_gpus_s;
  }
  // Added here as runs gain them: "env" (the names of the variables passed, never their
  // values) and "files" (each file sent with the run, by name and sha256).
  return recorded;
}

namespace {

void add_warning(RunRecord& record, std::string_view code, std::string message)
{
  record.warnings.push_back({{"code", code}, {"message", std::move(message)}});
}

void conclude(RunRecord& record, RunStatus status, std::optional<std::string> error)
{
  record.status = status;
  if (error) {
    record.error = std::move(error);
  }
}

// Everything one run needs to know along the way.
struct Run {
  HostSession& session;
  const Job& job;
  const json& params;
  const RunOptions& options;
  RunRecord& record;
  int timeout_s = 0;
  JobSetup setup;

  void step(std::string_view name, double seconds) const
  {
    log_step(options, session.label(), job.name, name, seconds);
  }
};

Run run_of(HostSession& session, const Job& job, const json& params, const RunOptions& options,
           RunRecord& record)
{
  return Run{session,
             job,
             params,
             options,
             record,
             options.timeout_s.value_or(job.meta.timeout_s),
             job_setup(job, options, session.label())};
}

// Finishes the run when it leaves its scope, whichever way it leaves: the run directory is
// removed unless the launcher removed it or will (or --keep-remote keeps it).
class FinishGuard {
public:
  FinishGuard(const Run& run, StagedRun& staged) : m_run(run), m_staged(staged) {}
  FinishGuard(const FinishGuard&) = delete;
  FinishGuard& operator=(const FinishGuard&) = delete;
  ~FinishGuard() { finish(); }

  // The launcher removed the directory, or removes it itself when it finds nobody reading (the
  // connection is gone): nothing is left to do, not even a round trip.
  void left_to_launcher() { m_how = Finish::by_launcher; }

private:
  void finish()
  {
    if (m_how == Finish::remove && m_run.options.keep_remote) {
      m_how = Finish::keep;
      add_warning(m_run.record, "kept-remote",
                  fmt::format("run directory kept on the host: {}", m_staged.run_dir));
    }
    const auto start = Clock::now();
    if (auto finished = m_run.session.finish(m_staged, m_how); !finished) {
      add_warning(m_run.record, "cleanup-failed", finished.error().message);
    }
    if (m_how == Finish::remove) {
      m_run.step("clean", seconds_since(start));
    }
  }

  const Run& m_run;
  StagedRun& m_staged;
  Finish m_how = Finish::remove;
};

// Room in the report for its lines around the result's bytes.
constexpr std::size_t k_report_slack = 4096;

// --gpus, else the job's `gpus` (0: none).
int gpus_wanted(const Run& run)
{
  return run.options.gpus.value_or(run.job.meta.gpus);
}

// What the run puts on its target: the launcher's fields (the run directory is the target's to
// name), the job and its files beside it.
RunBundle bundle_of(const Run& run, bool cache_refused)
{
  RunBundle bundle;
  LauncherSpec& launcher = bundle.launcher;
  launcher.job_file = staged_job_file_name(run.job);
  launcher.job_name = run.job.name;
  launcher.interpreter = run.setup.interpreter;
  launcher.env = run.setup.env;
  launcher.timeout_s = run.timeout_s;
  launcher.grace_s = run.options.grace_s;
  const std::string nonce = random_hex(12);
  launcher.sentinel = "ferry-start-" + nonce;
  launcher.end_marker = "ferry-end-" + nonce;
  launcher.params = params_file_bytes(run.params);
  launcher.result_frame_limit = std::min(run.options.result_cap, k_default_result_frame_limit);
  // Outputs are fetched after the exec: then the launcher leaves the run directory to ferry.
  launcher.keep_run_dir =
      run.options.keep_remote || !run.job.meta.outputs.empty() || !run.options.fetch.empty();
  bundle.job_bytes = run.job.bytes;
  bundle.job_sha256 = run.record.job_sha256;
  bundle.job_cache_refused = cache_refused;
  launcher.job_sha256 = run.record.job_sha256;
  for (const auto& file : run.job.files) {
    bundle.files.push_back({file.path, file.bytes, file.mode});
  }
  SlurmOptions slurm = run.job.meta.slurm;
  if (const int gpus = gpus_wanted(run); gpus > 0) {
    if (!run.options.gpus_by_scheduler) {
      launcher.env[k_launcher_gpus_var] = gpu_request(gpus, run.options.wait_gpus_s);
    } else if (!slurm.gres && !slurm.gpus) {
      slurm.gpus = std::to_string(gpus); // the scheduler allocates them
    }
  }
  if (run.options.detach_keep_for_s) {
    launcher.env[k_launcher_detach_var] =
        detach_request(*run.options.detach_keep_for_s, run.options.output_cap);
    launcher.keep_run_dir = true;
  }
  bundle.scheduler = slurm_options_json(slurm);
  return bundle;
}

// The warning for the job's entry in the host's job cache that was refused before the job ran:
// its bytes no longer matched the job's sha256 (`mismatch`), or it was not as ferry leaves it.
// Either way it was changed on the host since it appeared whole, by a rename.
std::string refused_entry_message(const Run& run, std::string_view entry, bool mismatch)
{
  return fmt::format("{}: the job cache entry {} {} (a process on the host that runs as you "
                     "changed it); ferry discarded it and sent the job again",
                     run.session.label(), entry,
                     mismatch ? "no longer matches the job's sha256"
                              : "was not as ferry leaves it, a regular file of yours of mode 0400 "
                                "and of the job's size");
}

// Phase 1: the run directory, the job and the launcher (params.json rides at its end), and the
// job's files beside it, as the target stages them. `cache_refused`: the launcher of the run's
// first attempt refused the job's entry in the host's job cache.
Expected<StagedRun> stage(const Run& run, bool cache_refused)
{
  const auto start = Clock::now();
  FERRY_TRY_ASSIGN(StagedRun staged,
                   run.session.stage(bundle_of(run, cache_refused), run.options.stop));
  for (const auto& file : run.job.files) {
    run.record.files.push_back({{"path", file.path},
                                {"mode", fmt::format("{:04o}", file.mode)},
                                {"size", file.bytes.size()},
                                {"sha256", file.sha256}});
    run.record.blobs.emplace(file.sha256, file.bytes);
  }
  run.record.timings.upload = seconds_since(start);
  if (!staged.job_cache_remade.empty()) {
    add_warning(run.record, "job-cache-refused",
                refused_entry_message(run, terminal_safe(staged.job_cache_remade), false));
  }
  run.step(staged.job_from_cache ? "upload (the job from the host's cache)" : "upload",
           run.record.timings.upload);
  return staged;
}

// Phase 2: the launcher, the only command any shell sees.
Expected<ExecOutcome> execute(const Run& run, StagedRun& staged)
{
  const auto start = Clock::now();
  LaunchRequest request;
  request.output_cap = run.options.output_cap;
  request.report_cap =
      std::min(run.options.result_cap, k_default_result_frame_limit) + k_report_slack;
  request.grace = std::chrono::seconds(run.options.grace_s);
  // The launcher may wait for free GPUs before the job's timeout starts to count.
  const bool picks_gpus = !run.options.gpus_by_scheduler && gpus_wanted(run) > 0;
  request.deadline = std::chrono::seconds(run.timeout_s + run.options.grace_s + 5 +
                                          (picks_gpus ? run.options.wait_gpus_s : 0));
  request.stop = run.options.stop;
  request.on_output = run.options.on_output;
  request.on_note = run.options.on_note;
  auto outcome = run.session.launch(staged, request);
  run.record.timings.exec = seconds_since(start);
  run.step("exec", run.record.timings.exec);
  return outcome;
}

// What ferry's python standby refused in the host's job cache before the run: its own script;
// or, staging a direct connection's only run, the job's entry, which it found there but not as
// ferry leaves it and made anew from the job's bytes. The standby said so before the launcher's
// sentinel (k_standby_entry_refused_prefix): that line is taken out of the login shell's noise.
void warn_of_refused_entries(const Run& run, ExecOutcome& outcome)
{
  if (!outcome.standby_refused.empty()) {
    add_warning(run.record, "job-cache-refused",
                fmt::format("{}: the job cache entry {}, ferry's python standby, no longer "
                            "matched its sha256 (a process on the host that runs as you changed "
                            "it); the standby refused it before this run, and ferry discarded it "
                            "and sends it again",
                            run.session.label(), terminal_safe(outcome.standby_refused)));
  }
  std::string& noise = outcome.err.before_sentinel;
  const auto at = noise.find(k_standby_entry_refused_prefix);
  if (at == std::string::npos) {
    return;
  }
  const auto end = noise.find('\n', at);
  const std::string line = noise.substr(at, end == std::string::npos ? end : end + 1 - at);
  noise.erase(at, line.size());
  std::string_view said = std::string_view(line).substr(k_standby_entry_refused_prefix.size());
  said = said.substr(0, said.find('\n'));
  const std::string_view entry = said.substr(0, said.find(' '));
  add_warning(run.record, "job-cache-refused",
              refused_entry_message(run, is_shell_neutral_token(entry) ? entry : "(unnamed)",
                                    said.ends_with(k_standby_entry_mismatch)));
}

// What the exec left in the record: output, exit code, and ferry's notes about it.
void record_output(const Run& run, ExecOutcome& outcome)
{
  RunRecord& record = run.record;
  record.stdout_text = std::move(outcome.out.bytes);
  record.stderr_text = std::move(outcome.err.bytes);
  record.stdout_truncated = outcome.out.truncated;
  record.stderr_truncated = outcome.err.truncated;
  record.exit_code = outcome.exit_code;
  if (outcome.out.truncated || outcome.err.truncated) {
    add_warning(
        record, "output-truncated",
        fmt::format("output over the {} MiB cap: the first and the last half of each stream are "
                    "kept; {} bytes of stdout and {} of stderr between them were dropped",
                    run.options.output_cap >> 20, outcome.out.dropped, outcome.err.dropped));
  }
  if (outcome.output_held_open) {
    add_warning(record, "processes-outlived-job",
                "processes started by the job outlived it and kept its output open; ferry stopped "
                "reading 1.5 s after the job exited. ferry kills the job's process group, but a "
                "process that starts a session of its own (setsid, a daemon) escapes it");
  }
  warn_of_refused_entries(run, outcome);
  const std::string noise = outcome.out.before_sentinel + outcome.err.before_sentinel;
  if (!noise.empty()) {
    add_warning(record, "login-shell-output",
                fmt::format("the login shell printed {} bytes before the job started (not part of "
                            "the job's output): {}",
                            noise.size(), last_line(std::string_view(noise).substr(0, 200))));
  }
}

struct Verdict {
  RunStatus status;
  std::string error;
};

// The login shell exited without running the launcher (no sentinel, no report): an account
// whose shell refuses commands (/bin/false, nologin), or a shell that cannot run /bin/sh.
std::optional<Verdict> launcher_never_ran(const Run& run, const ExecOutcome& outcome)
{
  if (outcome.out.saw_sentinel || outcome.err.saw_sentinel || outcome.out.launcher_report) {
    return std::nullopt;
  }
  const std::string said(trim(outcome.out.bytes + outcome.err.bytes));
  return Verdict{
      RunStatus::error,
      fmt::format("{}: the login shell did not run ferry's launcher (it exited with {}{}); "
                  "the account's shell may be /bin/false or nologin, or unable to run "
                  "/bin/sh. ferry needs an account whose login shell runs commands",
                  run.session.label(),
                  outcome.exit_code ? fmt::format("status {}", *outcome.exit_code)
                                    : std::string("no status"),
                  said.empty() ? "" : fmt::format(" and said \"{}\"", shorten(said, 200)))};
}

RunStatus status_of(ExecOutcome::Verdict::Kind kind)
{
  switch (kind) {
  case ExecOutcome::Verdict::Kind::timeout:
    return RunStatus::timeout;
  case ExecOutcome::Verdict::Kind::error:
    return RunStatus::error;
  case ExecOutcome::Verdict::Kind::failed:
    break;
  }
  return RunStatus::failed;
}

// The launcher found too few free GPUs (or no nvidia-smi) and never started the job: its line on
// stderr, after the prefix, says which GPUs were busy and why.
std::optional<Verdict> gpus_refused(const Run& run, const ExecOutcome& outcome,
                                    const std::optional<LauncherReport>& report)
{
  const std::string_view err = run.record.stderr_text;
  const auto at = err.find(k_launcher_gpus_refused_prefix);
  if (outcome.exit_code != k_launcher_gpus_refused_exit || report || at == std::string_view::npos) {
    return std::nullopt;
  }
  std::string_view why = err.substr(at + std::string_view(k_launcher_gpus_refused_prefix).size());
  why = why.substr(0, why.find('\n'));
  return Verdict{RunStatus::failed,
                 fmt::format("{}: the job did not start: {}", run.session.label(),
                             terminal_safe(shorten(std::string(why), 2000)))};
}

// How the exit reads, before the result is looked at; nullopt: the job exited 0.
std::optional<Verdict> classify_exit(const Run& run, const ExecOutcome& outcome,
                                     const std::optional<LauncherReport>& report)
{
  if (outcome.verdict) { // the target knows better than the exit status (a scheduler's verdict)
    return Verdict{status_of(outcome.verdict->kind), outcome.verdict->message};
  }
  if (auto never = launcher_never_ran(run, outcome)) {
    return never;
  }
  if ((report && report->cause == LauncherCause::timeout) || outcome.end == ExecEnd::deadline) {
    return Verdict{RunStatus::timeout,
                   fmt::format("the job ran past its {} s timeout and was killed", run.timeout_s)};
  }
  if (auto refused = gpus_refused(run, outcome, report)) {
    return refused;
  }
  if (outcome.exit_code == k_launcher_no_interpreter_exit &&
      run.record.stderr_text.find(k_launcher_no_interpreter_prefix) != std::string::npos) {
    return Verdict{RunStatus::failed,
                   fmt::format("{}: interpreter '{}' not found on the host; install it or give an "
                               "absolute path in the job's `interpreter`",
                               run.session.label(), run.setup.interpreter)};
  }
  if (!outcome.exit_code) {
    return Verdict{RunStatus::failed, "the job's launcher was killed by a signal"};
  }
  if (*outcome.exit_code != 0) {
    const std::string_view tail = last_line(run.record.stderr_text);
    return Verdict{RunStatus::failed,
                   fmt::format("the job exited with status {}{}", *outcome.exit_code,
                               tail.empty() ? "" : ": " + std::string(tail.substr(0, 300)))};
  }
  return std::nullopt;
}

// The record lists this many fetched outputs at most: a job that leaves 100,000 files gets them
// all on disk, while its record, the archive and `ferry log` stay small (issue 45).
constexpr std::size_t listed_outputs_max = 1000;

// Outputs fetched past the record's list: counted, not kept.
struct UnlistedOutputs {
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
};

// Streams one output into the output directory, hashing it on the way; listed in the record
// while its list has room, and archived (read back from disk) while the run's archive budget
// lasts too.
Expected<void> fetch_output(const Run& run, const StagedRun& staged, const fs::path& out,
                            const std::string& rel, std::uint64_t& archived,
                            UnlistedOutputs& unlisted)
{
  FERRY_TRY_ASSIGN(const int raw, create_output_file(out, rel));
  Fd fd(raw);
  Defer remove_partial([&] { ::unlink((out / rel).c_str()); });
  Sha256 hash;
  std::uint64_t size = 0;
  const ChunkSink write = [&](std::string_view chunk) -> Expected<void> {
    hash.update(chunk);
    size += chunk.size();
    if (const int e = write_all(fd.get(), chunk)) {
      return fail(ErrorKind::failed, "cannot write {}: {}", (out / rel).string(), std::strerror(e));
    }
    return {};
  };
  FERRY_TRY_ASSIGN(const auto fetched, run.session.fetch(staged, rel, write, 0));
  if (fetched.kind != FetchedFile::Kind::regular) {
    return fail(ErrorKind::failed, "{} changed while it was fetched (now {})", rel,
                fetched.kind == FetchedFile::Kind::missing ? "gone" : fetched.other);
  }
  if (const int e = fd.close()) {
    return fail(ErrorKind::failed, "cannot write {}: {}", (out / rel).string(), std::strerror(e));
  }
  remove_partial.dismiss();
  if (run.record.outputs.size() >= listed_outputs_max) {
    unlisted.files += 1;
    unlisted.bytes += size;
    return {};
  }
  std::string sha = std::move(hash).hex();
  const bool keep = archived + size <= run.options.archive_outputs_max;
  if (keep) {
    FERRY_TRY_ASSIGN(auto bytes, read_file(out / rel));
    archived += size;
    run.record.blobs.emplace(sha, std::move(bytes));
  }
  run.record.outputs.push_back(
      {{"path", rel}, {"size", size}, {"sha256", sha}, {"archived", keep}});
  return {};
}

bool wildcard_last(const std::string& pattern)
{
  return pattern.substr(pattern.rfind('/') + 1).find_first_of("*?[") != std::string::npos;
}

// What one output glob's matches need along the way.
struct OutputFetch {
  const Run& run;
  const StagedRun& staged;
  fs::path out;
  std::set<std::string> seen;
  std::uint64_t archived = 0;
  UnlistedOutputs unlisted;

  void take(const std::string& pattern, const std::vector<GlobMatch>& matches)
  {
    for (const auto& match : matches) {
      if (!seen.insert(match.path).second) {
        continue;
      }
      if (match.entry.kind == DirEntry::Kind::dir && wildcard_last(pattern)) {
        continue; // `out/*` passes over the directories beside the files
      }
      if (match.entry.kind != DirEntry::Kind::file) {
        add_warning(run.record, "output-skipped",
                    fmt::format("output {} is {}; only regular files are fetched", match.path,
                                match.entry.kind == DirEntry::Kind::dir ? "a directory"
                                                                        : match.entry.what));
        continue;
      }
      if (auto fetched = fetch_output(run, staged, out, match.path, archived, unlisted); !fetched) {
        add_warning(run.record, "output-failed", fetched.error().message);
      }
    }
  }
};

// Files back: every regular file the job's `outputs` and `--fetch` globs match in the run
// directory, after the job, whatever its status. What cannot be fetched is a warning.
void fetch_outputs(const Run& run, const StagedRun& staged)
{
  std::vector<std::string> patterns = run.job.meta.outputs;
  patterns.insert(patterns.end(), run.options.fetch.begin(), run.options.fetch.end());
  if (patterns.empty()) {
    return;
  }
  const auto start = Clock::now();
  OutputFetch fetch{
      run, staged, output_dir_for(run.options.out_dir, run.record.run_id, run.session.label()),
      {},  0,      {}};
  const DirLister lister = [&](const std::string& rel) { return run.session.list(staged, rel); };
  for (const auto& pattern : patterns) {
    auto matches = expand_glob(pattern, fmt::format("output \"{}\"", pattern), lister);
    if (!matches) {
      add_warning(run.record, "output-failed", matches.error().message);
      continue;
    }
    if (matches->empty()) {
      add_warning(run.record, "output-missing",
                  fmt::format("output \"{}\" matched no file in the run directory", pattern));
    }
    fetch.take(pattern, *matches);
  }
  if (fetch.unlisted.files > 0) {
    add_warning(
        run.record, "outputs-unlisted",
        fmt::format("{} more files ({} bytes) were fetched into {}; the record lists the first "
                    "{} only",
                    fetch.unlisted.files, fetch.unlisted.bytes, fetch.out.string(),
                    listed_outputs_max));
  }
  const double took = seconds_since(start);
  run.record.timings.fetch += took;
  run.step("outputs", took);
}

// result.json as the launcher's report gave it; nullopt when ferry must fetch it.
std::optional<FetchedFile> reported_result(const std::optional<LauncherReport>& report)
{
  switch (report ? report->result : ReportedResult::unknown) {
  case ReportedResult::none:
    return FetchedFile{};
  case ReportedResult::file:
    return FetchedFile{FetchedFile::Kind::regular, report->result_bytes, {}};
  case ReportedResult::link:
    return FetchedFile{FetchedFile::Kind::other, {}, "a symbolic link"};
  case ReportedResult::directory:
    return FetchedFile{FetchedFile::Kind::other, {}, "a directory"};
  case ReportedResult::special:
    return FetchedFile{FetchedFile::Kind::other, {}, "a FIFO, socket or device"};
  case ReportedResult::unknown:
  case ReportedResult::fetch:
    break;
  }
  return std::nullopt;
}

// Phase 3: the status and the result (from the launcher's report, else fetched).
void collect(const Run& run, const ExecOutcome& outcome, const StagedRun& staged,
             const std::optional<LauncherReport>& report)
{
  RunRecord& record = run.record;
  const auto start = Clock::now();
  const auto verdict = classify_exit(run, outcome, report);
  Expected<FetchedFile> fetched = FetchedFile{};
  if (auto given = reported_result(report)) {
    fetched = std::move(*given);
  } else {
    fetched = fetch_capped(run.session, staged, "result.json", run.options.result_cap);
    record.timings.fetch += seconds_since(start);
    run.step("fetch", seconds_since(start));
  }
  if (!fetched) {
    return conclude(record, RunStatus::error, fetched.error().message);
  }
  std::optional<std::string> file;
  if (fetched->kind == FetchedFile::Kind::regular) {
    record.result_bytes = fetched->bytes;
    file = std::move(fetched->bytes);
  }
  ParsedResult parsed = parse_result(file, record.stdout_text, run.options.result_cap);
  if (fetched->kind == FetchedFile::Kind::other) {
    parsed.bad = fmt::format("result.json is {}, not a regular file; ferry reads only a file the "
                             "job wrote itself ($FERRY_RESULT)",
                             fetched->other);
  }
  if (!parsed.bad) {
    record.result = std::move(parsed.value);
  } else if (record.result_bytes.size() > run.options.result_cap) {
    record.result_bytes.resize(run.options.result_cap);
  }
  if (verdict) {
    return conclude(record, verdict->status, verdict->error);
  }
  if (parsed.bad) {
    return conclude(record, RunStatus::bad_result, *parsed.bad);
  }
  if (run.job.meta.result_required && fetched->kind == FetchedFile::Kind::missing &&
      record.result.is_null()) {
    return conclude(record, RunStatus::no_result,
                    fmt::format("the job wrote no result: it should write one JSON document to "
                                "$FERRY_RESULT ({}/result.json) or print exactly one on stdout; "
                                "a job with nothing to return says `result = \"optional\"` in its "
                                "/// ferry block",
                                staged.run_dir));
  }
  conclude(record, RunStatus::ok, std::nullopt);
}

// A phase failed: an error, or, when ferry was asked to stop meanwhile, an interruption.
void conclude_failure(const Run& run, const Error& error)
{
  if (run.options.stop.stop_requested()) {
    return conclude(run.record, RunStatus::interrupted,
                    fmt::format("interrupted before the job finished ({})", error.message));
  }
  conclude(run.record, RunStatus::error, error.message);
}

// The launcher refused the job's entry in the host's job cache: its bytes no longer match the
// job's sha256 (a process on the host that runs as the user changed them), or nothing there can
// hash them. Nothing of the run ran. The run goes again, once, with the entry discarded and the
// job sent again, and says so.
bool cache_entry_refused(const Run& run, const ExecOutcome& outcome)
{
  const std::string_view err = outcome.err.bytes;
  const auto at = err.find(k_launcher_cache_refused_prefix);
  if (outcome.exit_code != k_launcher_cache_refused_exit || outcome.out.launcher_report ||
      at == std::string_view::npos) {
    return false;
  }
  std::string_view line = err.substr(at + std::string_view(k_launcher_cache_refused_prefix).size());
  line = line.substr(0, line.find('\n'));
  const std::string_view entry = line.substr(0, line.find(' '));
  const std::string named = is_shell_neutral_token(entry) ? std::string(entry) : "(unnamed)";
  const bool mismatch = line.ends_with(" does not match its sha256");
  add_warning(run.record, "job-cache-refused",
              mismatch ? refused_entry_message(run, named, true)
                       : fmt::format("{}: the job cache entry {} cannot be checked (the host has "
                                     "no sha256sum or shasum); ferry sent the job again",
                                     run.session.label(), named));
  return true;
}

// Phase 2 and 3 once the job ran (or the launcher ended): outputs, the status and the result.
void finish_run(const Run& run, const StagedRun& staged, FinishGuard& guard, ExecOutcome& executed)
{
  record_output(run, executed);
  const auto report = executed.out.launcher_report
                          ? parse_launcher_report(*executed.out.launcher_report)
                          : std::nullopt;
  if (report && report->run_dir_removed) {
    guard.left_to_launcher();
  }
  for (const auto& gpu : report ? report->gpus : std::vector<PickedGpu>{}) {
    run.record.gpus.push_back({{"index", gpu.index}, {"uuid", gpu.uuid}});
  }
  switch (executed.end) {
  case ExecEnd::lost:
    guard.left_to_launcher();
    return conclude(run.record, RunStatus::error,
                    fmt::format("{}: connection lost while the job ran ({}); the launcher's own "
                                "deadline ({} s) stops the job",
                                run.session.label(), executed.lost_reason, run.timeout_s));
  case ExecEnd::interrupted:
    return conclude(run.record, RunStatus::interrupted, "interrupted; the job was stopped");
  case ExecEnd::no_start:
    return conclude(
        run.record, RunStatus::error,
        fmt::format("{}: the login shell did not start ferry's launcher within {:.0f} s; "
                    "its startup files (~/.zshenv, ~/.bashrc, "
                    "~/.config/fish/config.fish, ~/.tcshrc, ...) may hang or wait for "
                    "input: make them return at once for non-interactive shells",
                    run.session.label(), executed.start_limit_s));
  case ExecEnd::exited:
  case ExecEnd::deadline:
    break;
  }
  fetch_outputs(run, staged);
  collect(run, executed, staged, report);
}

// The launcher of a --detach run started itself apart from the channel and said so.
bool started_detached(const Run& run, const ExecOutcome& outcome)
{
  return run.options.detach_keep_for_s && outcome.end == ExecEnd::exited &&
         outcome.exit_code == 0 && outcome.out.saw_sentinel &&
         outcome.out.bytes.starts_with(k_detached_line);
}

// What `ferry attach` needs to find the run again and collect it as this run would have been.
void record_detached(const Run& run, const StagedRun& staged, const ExecOutcome& outcome)
{
  run.record.status = RunStatus::ok; // the JSON record says `running` while `detached` is set
  // `detached PID`: the launcher's pid, for `ps` and `attach` before its state file names it.
  const std::string_view said = std::string_view(outcome.out.bytes).substr(k_detached_line.size());
  long long pid = 0;
  std::from_chars(said.data(), said.data() + said.size(), pid);
  run.record.detached = {{"run_dir", staged.run_dir},
                         {"launcher_pid", pid},
                         {"sentinel", staged.launcher.sentinel},
                         {"end_marker", staged.launcher.end_marker},
                         {"keep_for_s", *run.options.detach_keep_for_s},
                         {"fetch", run.options.fetch},
                         // Absolute: `attach` may run in another directory.
                         {"out_dir", fs::absolute(run.options.out_dir).string()},
                         {"archive_outputs_max", run.options.archive_outputs_max},
                         {"script_name", run.job.file_name}};
}

void run_phases(Run& run)
{
  for (bool cache_refused = false;; cache_refused = true) {
    if (run.options.stop.stop_requested()) {
      return conclude(run.record, RunStatus::interrupted, "interrupted before the job started");
    }
    // A run the target could not stage leaves nothing there: the target removed what it made.
    auto staged = stage(run, cache_refused);
    if (!staged) {
      return conclude_failure(run, staged.error());
    }
    FinishGuard guard(run, *staged);
    if (run.options.stop.stop_requested()) {
      return conclude(run.record, RunStatus::interrupted, "interrupted before the job started");
    }
    auto executed = execute(run, *staged);
    if (!executed) {
      return conclude_failure(run, executed.error());
    }
    if (started_detached(run, *executed)) {
      guard.left_to_launcher(); // the directory stays for `ferry attach`
      return record_detached(run, *staged, *executed);
    }
    if (cache_refused || !cache_entry_refused(run, *executed)) {
      return finish_run(run, *staged, guard, *executed);
    }
  }
}

} // namespace

void log_step(const RunOptions& options, std::string_view host, std::string_view job,
              std::string_view step, double seconds)
{
  if (options.verbose) {
    // One write per line, so lines from parallel hosts never mix.
    const std::string line = fmt::format("ferry: {} {}: {} {:.3f} s\n", host, job, step, seconds);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

JobSetup job_setup(const Job& job, const RunOptions& options, std::string_view host)
{
  JobSetup setup{job.meta.env, job.meta.interpreter};
  const HostSettings settings =
      options.host_settings ? options.host_settings(host) : HostSettings{};
  for (const auto& [name, value] : settings.env) {
    setup.env[name] = value;
  }
  for (const auto& [name, value] : options.env) {
    setup.env[name] = value;
  }
  if (const auto own = options.interpreters.find(job.meta.interpreter);
      own != options.interpreters.end()) {
    setup.interpreter = own->second;
  } else if (const auto mapped = settings.interpreters.find(job.meta.interpreter);
             mapped != settings.interpreters.end()) {
    setup.interpreter = mapped->second;
  }
  return setup;
}

std::string staged_job_file_name(const Job& job)
{
  const std::string& name = job.file_name;
  const bool reserved = name == k_launcher_file || name == "params.json" || name == "result.json";
  if (!reserved && is_shell_neutral_token(name) && name.find('/') == std::string::npos &&
      name.front() != '.' && name.front() != '-') {
    return name;
  }
  return "job";
}

RunRecord unstarted_run(const Job& job, const json& params, const HostSession& session,
                        RunStatus status, std::string error)
{
  RunRecord record = new_record(job, params, session);
  conclude(record, status, std::move(error));
  return record;
}

StagedRun detached_staged(const RunRecord& record, const StopToken& stop)
{
  const json& detached = record.detached;
  StagedRun staged;
  staged.run_dir = detached.value("run_dir", "");
  staged.launcher.run_dir = staged.run_dir;
  staged.launcher.sentinel = detached.value("sentinel", "");
  staged.launcher.end_marker = detached.value("end_marker", "");
  staged.stop = stop;
  return staged;
}

namespace {

// A detached run on a scheduler is stopped by its scheduler: scancel of its job (the launcher's
// TERM path, as a live Ctrl-C's); nothing on the host is staged or executed.
Expected<void> send_scheduled_stop(const Run& run)
{
  FERRY_TRY_ASSIGN(const std::string said, cancel_detached_slurm_job(run.session));
  run.step(fmt::format("stop: {}", terminal_safe(said)), 0);
  return {};
}

// `ferry stop`: a launcher of its own, staged as a run's is (a new private run directory, through
// the same checks of the run base), runs as `launch.sh stop RUN_DIR`: TERM to the detached
// launcher named in RUN_DIR's state file, which stops the job (KILL after the grace) and writes
// its done file. Never the detached run's own launch.sh: its job can rewrite that file, and ferry
// executes only files it has just put in place (issue 45). Its answer, "stop
// sent|finished|gone", is only for -v.
Expected<void> send_stop(const Run& run, const StagedRun& detached)
{
  if (run.record.target.contains("slurm")) {
    return send_scheduled_stop(run);
  }
  if (!is_shell_neutral_token(detached.run_dir) || !detached.run_dir.starts_with('/')) {
    return fail(ErrorKind::failed,
                "the archive names run directory '{}' for this run, which ferry did not make; "
                "the record is damaged",
                terminal_safe(detached.run_dir));
  }
  RunBundle bundle;
  LauncherSpec& launcher = bundle.launcher;
  launcher.job_file = "job";
  launcher.job_name = run.job.name;
  launcher.interpreter = "sh";
  launcher.sentinel = detached.launcher.sentinel;
  launcher.end_marker = detached.launcher.end_marker;
  launcher.params = "{}\n";
  // Never the python standby: `launch.sh stop` runs as launch.sh.
  launcher.env[k_launcher_detach_var] = "0";
  FERRY_TRY_ASSIGN(StagedRun stopper, run.session.stage(bundle, run.options.stop));
  stopper.launcher_args = {k_launcher_stop_arg, detached.run_dir};
  LaunchRequest request;
  request.deadline = std::chrono::seconds(30);
  auto sent = run.session.launch(stopper, request);
  if (auto removed = run.session.finish(stopper, Finish::remove); !removed) {
    add_warning(run.record, "cleanup-failed", removed.error().message);
  }
  FERRY_TRY_ASSIGN(const ExecOutcome outcome, std::move(sent));
  run.step(fmt::format("stop: {}", terminal_safe(trim(outcome.out.bytes))), 0);
  return {};
}

// A detached run on a scheduler (its record's target says `slurm`): the target follows its job
// again as for a live run (docs/slurm.md, "Detached runs"), with its verdict on how it ended.
Expected<Followed> follow_scheduled(const Run& run, StagedRun& staged)
{
  FERRY_TRY_ASSIGN(const auto listed, run.session.list(staged, ""));
  if (!listed) {
    return Followed{FollowEnd::gone, {}};
  }
  FERRY_TRY_ASSIGN(ExecOutcome outcome, execute(run, staged));
  if (outcome.end == ExecEnd::interrupted && run.options.stop.stop_requested()) {
    return Followed{FollowEnd::stopped, {}}; // Ctrl-C: the job goes on
  }
  return Followed{FollowEnd::done, std::move(outcome)};
}

// The detached launcher is gone without a done file: what was read of the output is the record's,
// the run failed, and its directory goes.
void conclude_lost(const Run& run, const StagedRun& staged, ExecOutcome& outcome)
{
  StagedRun owned = staged;
  FinishGuard guard(run, owned);
  record_output(run, outcome);
  conclude(run.record, RunStatus::failed,
           fmt::format("{}: the detached launcher died without an exit status (killed, or the "
                       "host restarted); the output read so far is kept in this record and the "
                       "run directory was removed",
                       terminal_safe(run.session.label())));
}

} // namespace

Expected<Attached> attach_run(HostSession& session, const Job& job, RunRecord record,
                              const RunOptions& options, bool stop)
{
  const json params = record.params;
  Run run = run_of(session, job, params, options, record);
  StagedRun staged = detached_staged(record, options.stop);
  const auto start = Clock::now();
  if (stop) {
    FERRY_TRY(send_stop(run, staged));
  }
  FollowRequest follow;
  follow.launcher_pid = record.detached.value("launcher_pid", 0LL);
  follow.output_cap = options.output_cap;
  follow.report_cap = std::min(options.result_cap, k_default_result_frame_limit) + k_report_slack;
  follow.stop = options.stop;
  follow.on_output = options.on_output;
  const bool scheduled = record.target.contains("slurm");
  FERRY_TRY_ASSIGN(Followed followed, scheduled ? follow_scheduled(run, staged)
                                                : follow_detached(session, staged, follow));
  if (followed.end == FollowEnd::stopped) {
    return Attached{Attached::End::detached, std::move(record)};
  }
  if (followed.end == FollowEnd::gone) {
    return Attached{Attached::End::gone, std::move(record)};
  }
  record.detached = nullptr;
  record.timings.exec = seconds_since(start);
  if (followed.end == FollowEnd::lost) {
    conclude_lost(run, staged, followed.outcome);
    record.duration_s = seconds_since_utc(record.started_at).value_or(record.duration_s);
    return Attached{Attached::End::collected, std::move(record)};
  }
  {
    FinishGuard guard(run, staged);
    finish_run(run, staged, guard, followed.outcome);
  }
  if (scheduled) { // what the target learnt: the job's node and final state
    record.target = session.target();
    record.host_label = session.label();
  }
  if (stop) {
    conclude(record, RunStatus::interrupted, "stopped by `ferry stop`; the job was stopped");
  }
  if (!job.meta.summary.empty() && !record.result.is_null()) {
    record.summary = result_summary(record.result, job.meta.summary);
  }
  record.duration_s = seconds_since_utc(record.started_at).value_or(record.duration_s);
  return Attached{Attached::End::collected, std::move(record)};
}

RunRecord run_job(HostSession& session, const Job& job, const json& params,
                  const RunOptions& options)
{
  const auto start = Clock::now();
  RunRecord record = new_record(job, params, session);
  record.replay_of = options.replay_of;
  record.invocation = options.invocation;
  record.options = recorded_options(options, job);
  Run run = run_of(session, job, params, options, record);
  for (const auto& [name, value] : run.setup.env) {
    record.env.push_back(name);
  }
  record.interpreter = run.setup.interpreter;
  if (!run.setup.interpreter.empty()) {
    record.options["interpreter"] =
        run.setup.interpreter; // after the config file and --interpreter
  }
  run_phases(run);
  if (!job.meta.summary.empty() && !record.result.is_null()) {
    record.summary = result_summary(record.result, job.meta.summary);
  }
  // What the target learnt while the job ran (a scheduler's job id, node and final state).
  record.target = session.target();
  record.host_label = session.label();
  record.duration_s = seconds_since(start);
  return record;
}

} // namespace ferry
