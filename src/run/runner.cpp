#include <chrono>

#include "ferry/launcher.hpp"
#include "ferry/runner.hpp"
#include "ferry/shell_neutral.hpp"
#include "ferry/util.hpp"
#include "ferry/version.hpp"

namespace ferry {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

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

void add_warning(RunRecord& record, std::string_view code, std::string message)
{
  record.warnings.push_back({{"code", code}, {"message", std::move(message)}});
}

std::string last_line(std::string_view text)
{
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  const auto newline = text.rfind('\n');
  return std::string(newline == std::string_view::npos ? text : text.substr(newline + 1));
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

std::string staged_job_file_name(const Job& job)
{
  const std::string& name = job.file_name;
  const bool reserved = name == "launch.sh" || name == "params.json" || name == "result.json";
  if (!reserved && is_shell_neutral_token(name) && name.find('/') == std::string::npos &&
      name.front() != '.' && name.front() != '-') {
    return name;
  }
  return "job";
}

ParsedResult parse_result(const std::optional<std::string>& result_file, std::string_view stdout_text,
                          std::size_t cap)
{
  if (result_file) {
    if (result_file->size() > cap) {
      return {json(), fmt::format("result.json is larger than the {} MiB cap", cap >> 20)};
    }
    // Depth is bounded by nlohmann's recursion only for parsing with a callback: check it here.
    std::size_t depth = 0;
    std::size_t max_depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < result_file->size(); ++i) {
      const char c = (*result_file)[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        max_depth = std::max(max_depth, ++depth);
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
    }
    if (max_depth > 512) {
      return {json(), fmt::format("result.json nests {} levels deep (at most 512 allowed)", max_depth)};
    }
    json value = json::parse(*result_file, nullptr, false);
    if (value.is_discarded()) {
      return {json(), "result.json is not valid JSON (UTF-8 text)"};
    }
    try {
      (void)value.dump(); // strings must be valid UTF-8 to be carried as JSON
    } catch (const json::exception&) {
      return {json(), "result.json holds strings that are not valid UTF-8"};
    }
    return {std::move(value), std::nullopt};
  }
  if (stdout_text.size() <= cap) {
    const auto first = stdout_text.find_first_not_of(" \t\r\n");
    if (first != std::string_view::npos && (stdout_text[first] == '{' || stdout_text[first] == '[')) {
      json value = json::parse(stdout_text, nullptr, false);
      if (!value.is_discarded()) {
        try {
          (void)value.dump();
          return {std::move(value), std::nullopt};
        } catch (const json::exception&) {
        }
      }
    }
  }
  return {json(), std::nullopt};
}

RunRecord unstarted_run(const Job& job, const json& params, const HostSession& session,
                        RunStatus status, std::string error)
{
  RunRecord record = new_record(job, params, session);
  record.status = status;
  record.error = std::move(error);
  return record;
}

RunRecord run_job(HostSession& session, const Job& job, const json& params, const RunOptions& options)
{
  const auto start = Clock::now();
  RunRecord record = new_record(job, params, session);
  record.replay_of = options.replay_of;
  auto finish = [&](RunStatus status, std::optional<std::string> error) -> RunRecord {
    record.status = status;
    if (error) {
      record.error = std::move(error);
    }
    record.duration_s = seconds_since(start);
    return std::move(record);
  };
  if (interrupt_requested()) {
    return finish(RunStatus::interrupted, "interrupted before the job started");
  }

  // Stage: run dir, job file, params, launcher.
  auto phase = Clock::now();
  auto dir = session.create_run_dir();
  if (!dir) {
    return finish(RunStatus::error, dir.error().message);
  }
  const std::string run_dir = *dir;
  const int timeout_s = options.timeout_s.value_or(job.meta.timeout_s);
  LauncherSpec launcher;
  launcher.run_dir = run_dir;
  launcher.job_file = staged_job_file_name(job);
  launcher.job_name = job.name;
  launcher.interpreter = job.meta.interpreter;
  launcher.timeout_s = timeout_s;
  launcher.grace_s = options.grace_s;
  const std::string nonce = random_hex(12);
  launcher.sentinel = "ferry-start-" + nonce;
  launcher.end_marker = "ferry-end-" + nonce;
  auto cleanup = [&] {
    if (options.keep_remote) {
      add_warning(record, "kept-remote", fmt::format("run directory kept on the host: {}", run_dir));
      return;
    }
    const auto clean_start = Clock::now();
    if (auto removed = session.remove_run_dir(run_dir); !removed) {
      add_warning(record, "cleanup-failed", removed.error().message);
    }
    log_step(options, session.label(), job.name, "clean", seconds_since(clean_start));
  };
  const std::string params_text = params_file_bytes(params);
  const std::string launcher_text = make_launcher(launcher);
  const std::pair<std::string, std::string_view> staged[] = {
    {launcher.job_file, job.bytes}, {"params.json", params_text}, {"launch.sh", launcher_text}};
  for (const auto& [name, bytes] : staged) {
    if (auto put = session.put_file(run_dir + "/" + name, bytes); !put) {
      cleanup();
      return finish(RunStatus::error, put.error().message);
    }
  }
  record.timings.upload = seconds_since(phase);
  log_step(options, session.label(), job.name, "upload", record.timings.upload);

  // Exec: the only command any shell sees.
  phase = Clock::now();
  ExecRequest request;
  request.argv = {"/bin/sh", run_dir + "/launch.sh"};
  request.sentinel = launcher.sentinel;
  request.end_marker = launcher.end_marker;
  request.output_cap = options.output_cap;
  request.grace = std::chrono::seconds(options.grace_s);
  request.deadline = std::chrono::seconds(timeout_s + options.grace_s + 5);
  auto executed = session.exec(request);
  record.timings.exec = seconds_since(phase);
  log_step(options, session.label(), job.name, "exec", record.timings.exec);
  if (!executed) {
    cleanup();
    return finish(RunStatus::error, executed.error().message);
  }
  ExecOutcome& outcome = *executed;
  record.stdout_text = std::move(outcome.out.bytes);
  record.stderr_text = std::move(outcome.err.bytes);
  record.stdout_truncated = outcome.out.truncated;
  record.stderr_truncated = outcome.err.truncated;
  record.exit_code = outcome.exit_code;
  if (outcome.out.truncated || outcome.err.truncated) {
    add_warning(record, "output-truncated",
                fmt::format("output over the {} MiB cap was dropped: {} bytes of stdout, {} of stderr",
                            options.output_cap >> 20, outcome.out.dropped, outcome.err.dropped));
  }
  if (outcome.output_held_open) {
    add_warning(record, "processes-outlived-job",
                "processes started by the job outlived it and kept its output open; ferry stopped "
                "reading 1.5 s after the job exited. ferry kills the job's process group, but a "
                "process that starts a session of its own (setsid, a daemon) escapes it");
  }
  const std::string noise = outcome.out.before_sentinel + outcome.err.before_sentinel;
  if (!noise.empty()) {
    add_warning(record, "login-shell-output",
                fmt::format("the login shell printed {} bytes before the job started (not part of "
                            "the job's output): {}",
                            noise.size(), last_line(noise.substr(0, 200))));
  }
  if (outcome.lost) {
    return finish(RunStatus::error, fmt::format("{}: connection lost while the job ran ({}); the "
                                                "launcher's own deadline ({} s) stops the job",
                                                session.label(), *outcome.lost, timeout_s));
  }
  if (outcome.interrupted) {
    cleanup();
    return finish(RunStatus::interrupted, "interrupted; the job was stopped");
  }

  // Fetch the result.
  phase = Clock::now();
  std::optional<RunStatus> status;
  std::optional<std::string> error;
  if (outcome.exit_code == k_launcher_timeout_exit) {
    auto marker = session.file_exists(run_dir + "/" + k_launcher_timeout_marker);
    if ((marker && *marker) || outcome.deadline_passed) {
      status = RunStatus::timeout;
      error = fmt::format("the job ran past its {} s timeout and was killed", timeout_s);
    }
  } else if (outcome.deadline_passed) {
    status = RunStatus::timeout;
    error = fmt::format("the job ran past its {} s timeout and was killed", timeout_s);
  }
  if (!status && outcome.exit_code == k_launcher_no_interpreter_exit &&
      record.stderr_text.find(k_launcher_no_interpreter_prefix) != std::string::npos) {
    status = RunStatus::failed;
    error = fmt::format("{}: interpreter '{}' not found on the host; install it or give an "
                        "absolute path in the job's `interpreter`",
                        session.label(), job.meta.interpreter);
  }
  if (!status && !outcome.exit_code) {
    status = RunStatus::failed;
    error = "the job's launcher was killed by a signal";
  }
  if (!status && *outcome.exit_code != 0) {
    status = RunStatus::failed;
    const std::string tail = last_line(record.stderr_text);
    error = fmt::format("the job exited with status {}{}", *outcome.exit_code,
                        tail.empty() ? "" : ": " + tail.substr(0, 300));
  }
  auto fetched = session.fetch_file(run_dir + "/result.json", options.result_cap);
  record.timings.fetch = seconds_since(phase);
  log_step(options, session.label(), job.name, "fetch", record.timings.fetch);
  if (!fetched) {
    cleanup();
    return finish(RunStatus::error, fetched.error().message);
  }
  if (*fetched) {
    record.result_bytes = **fetched;
  }
  ParsedResult parsed = parse_result(*fetched, record.stdout_text, options.result_cap);
  if (parsed.bad) {
    if (record.result_bytes.size() > options.result_cap) {
      record.result_bytes.resize(options.result_cap);
    }
  } else {
    record.result = std::move(parsed.value);
  }
  cleanup();
  if (status) {
    return finish(*status, error);
  }
  if (parsed.bad) {
    return finish(RunStatus::bad_result, *parsed.bad);
  }
  return finish(RunStatus::ok, std::nullopt);
}

} // namespace ferry
