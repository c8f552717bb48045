#include "mcp/run_tools.hpp"

#include <algorithm>
#include <array>
#include <thread>

#include "ferry/text.hpp"
#include "mcp/render.hpp"
#include "run/archiving.hpp"
#include "run/detached_runs.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

struct RunToolInfo {
  RunTool tool;
  std::string_view name;
  std::string_view description;
};

// Names no job can take: tool_refusal leaves out a job that has one.
constexpr std::array k_run_tools = {
    RunToolInfo{RunTool::state, "ferry_run_state",
                "The state of a detached run (one started by a job tool with detach: true), "
                "looked at on its host: running, finished (its result waits to be collected), "
                "gone, or expired (its host removed it after its retention)."},
    RunToolInfo{RunTool::output, "ferry_run_output",
                "The output of a detached run so far, read from its host (the last lines of "
                "stdout and stderr); the run goes on."},
    RunToolInfo{RunTool::result, "ferry_run_result",
                "The result of a detached run. When it has finished, it is collected as the job "
                "tool's call would have returned it (fetched files, archived, its run directory "
                "removed); while it runs, says so, after waiting up to wait_s seconds for it to "
                "end."},
    RunToolInfo{RunTool::stop, "ferry_run_stop",
                "Stops a detached run (TERM, KILL after the grace) and returns its record, "
                "archived as interrupted."},
};

constexpr std::chrono::milliseconds k_result_poll{500};

json run_argument_schema()
{
  return {{"type", "string"},
          {"minLength", 1},
          {"maxLength", 200},
          {"description", "the run id a call with detach: true returned, a unique prefix of it, "
                          "or \"last\" for the newest detached run"}};
}

json input_schema_of(RunTool tool)
{
  json properties = {{"run", run_argument_schema()}};
  if (tool == RunTool::result) {
    properties["wait_s"] = {{"type", "integer"},
                            {"minimum", 0},
                            {"maximum", k_max_result_wait_s},
                            {"default", 0},
                            {"description", "seconds to wait for a running run to end"}};
  }
  return {{"type", "object"},
          {"properties", properties},
          {"required", {"run"}},
          {"additionalProperties", false}};
}

std::string_view name_of(RunTool tool)
{
  return std::find_if(k_run_tools.begin(), k_run_tools.end(),
                      [tool](const RunToolInfo& info) { return info.tool == tool; })
      ->name;
}

std::string shown(std::string_view text)
{
  return terminal_safe(text, Newlines::keep);
}

json text_result(std::string text, json structured)
{
  return {{"content", json::array({{{"type", "text"}, {"text", std::move(text)}}})},
          {"structuredContent", std::move(structured)},
          {"isError", false}};
}

struct RunArguments {
  std::string run;
  int wait_s = 0;
};

Expected<RunArguments> run_arguments(RunTool tool, const json& arguments)
{
  const std::string_view name = name_of(tool);
  if (!arguments.is_object()) {
    return fail(ErrorKind::usage, "{}: arguments must be a JSON object with \"run\"", name);
  }
  RunArguments parsed;
  for (const auto& [key, value] : arguments.items()) {
    if (key == "run" && value.is_string() && !value.get_ref<const std::string&>().empty() &&
        value.get_ref<const std::string&>().size() <= 200) {
      parsed.run = value.get<std::string>();
    } else if (key == "wait_s" && tool == RunTool::result && value.is_number_integer() &&
               value.get<long long>() >= 0 && value.get<long long>() <= k_max_result_wait_s) {
      parsed.wait_s = value.get<int>();
    } else if (key == "run" || (key == "wait_s" && tool == RunTool::result)) {
      return fail(ErrorKind::usage, "{}: argument '{}' must be {}, not {}", name, key,
                  key == "run"
                      ? "a run id (1 to 200 characters), a prefix of one, or \"last\""
                      : fmt::format("a whole number of seconds from 0 to {}", k_max_result_wait_s),
                  shorten(value.dump(-1, ' ', true, json::error_handler_t::replace), 60));
    } else {
      return fail(ErrorKind::usage, "{}: unknown argument '{}'", name, shorten(key, 60));
    }
  }
  if (parsed.run.empty()) {
    return fail(ErrorKind::usage,
                "{}: argument 'run' is required: the run id a call with "
                "detach: true returned, a unique prefix of it, or \"last\"",
                name);
  }
  return parsed;
}

// New connected sessions to the server's targets, by the label the run's record has.
DetachedSessionFor sessions_of(const std::vector<PoolTarget>& targets)
{
  return [&targets](const RunRecord& run) -> Expected<std::unique_ptr<HostSession>> {
    const auto target = std::find_if(targets.begin(), targets.end(), [&run](const PoolTarget& t) {
      return t.label == run.host_label;
    });
    if (target == targets.end()) {
      return fail(ErrorKind::usage, "run {} ran on {}, which is not a target of this ferry mcp",
                  run.run_id, terminal_safe(run.host_label));
    }
    auto session = target->make();
    FERRY_TRY(session->connect());
    return session;
  };
}

// The detached run the arguments name, on one of the server's targets.
Expected<RunRecord> named_run(const RunToolSetup& setup, const RunArguments& args)
{
  FERRY_TRY_ASSIGN(RunRecord run, find_detached(*setup.archive->archive, args.run));
  const auto& targets = *setup.targets;
  if (std::none_of(targets.begin(), targets.end(),
                   [&run](const PoolTarget& t) { return t.label == run.host_label; })) {
    return fail(ErrorKind::usage,
                "run {} ran on {}, which is not a target of this ferry mcp; `ferry attach {}` "
                "collects it",
                run.run_id, terminal_safe(run.host_label), run.run_id);
  }
  return run;
}

std::string run_heading(const RunRecord& run)
{
  return fmt::format("run {} ({} on {}, started {})", run.run_id, run.job, shown(run.host_label),
                     run.started_at);
}

std::string state_hint(std::string_view word)
{
  if (word == "running") {
    return "ferry_run_output shows its output so far; ferry_run_result returns its result once "
           "it has finished";
  }
  if (word == "finished") {
    return "ferry_run_result collects it and returns its result";
  }
  if (word == "gone" || word == "expired") {
    return "its run directory is not on its host any more: its result cannot be collected";
  }
  return "its host could not be asked; try again";
}

Expected<json> run_state(const RunToolSetup& setup, const RunArguments& args)
{
  FERRY_TRY_ASSIGN(const RunRecord run, named_run(setup, args));
  const std::string detail = host_state(sessions_of(*setup.targets), run);
  const std::string word = detail.substr(0, detail.find(':'));
  return text_result(fmt::format("{}: {}\n{}\n", run_heading(run), shown(detail), state_hint(word)),
                     {{"run_id", run.run_id},
                      {"job", run.job},
                      {"target", run.host_label},
                      {"started_at", run.started_at},
                      {"state", word},
                      {"detail", detail}});
}

// The last `k_output_bytes` (and a little more) of one stream, as it is read.
void keep_tail(std::string& kept, std::string_view bytes)
{
  kept.append(bytes);
  if (kept.size() > 2 * k_output_bytes) {
    kept.erase(0, kept.size() - k_output_bytes - 4);
  }
}

void add_output(std::string& text, std::string_view name, std::string_view bytes)
{
  if (bytes.empty()) {
    text += fmt::format("{}: (nothing yet)\n", name);
    return;
  }
  const std::string excerpt = tail_excerpt(bytes, k_output_lines, k_output_bytes);
  text += fmt::format("{}{}:\n{}", name, excerpt.size() == bytes.size() ? "" : " (last lines)",
                      shown(excerpt));
  if (excerpt.back() != '\n') {
    text += '\n';
  }
}

Expected<json> run_output(const RunToolSetup& setup, const RunArguments& args)
{
  FERRY_TRY_ASSIGN(const RunRecord run, named_run(setup, args));
  FERRY_TRY_ASSIGN(auto session, sessions_of (*setup.targets)(run));
  const StagedRun staged = detached_staged(run);
  std::string out;
  std::string err;
  FollowRequest request;
  request.output_cap = options_of(run, false).output_cap;
  request.stop = StopToken::make();
  request.stop.request_stop(); // one look: what is there now
  request.on_output = [&out, &err](OutputStream stream, std::string_view bytes) {
    keep_tail(stream == OutputStream::out ? out : err, bytes);
  };
  FERRY_TRY_ASSIGN(const Followed followed, follow_detached(*session, staged, request));
  if (followed.end == FollowEnd::gone) {
    return fail(ErrorKind::failed, "{}: gone: its run directory is not on its host any more",
                run_heading(run));
  }
  const bool finished = followed.end == FollowEnd::done;
  std::string text = fmt::format("{}: {}; its output so far:\n", run_heading(run),
                                 finished ? "finished (ferry_run_result collects it)" : "running");
  add_output(text, "stdout", out);
  add_output(text, "stderr", err);
  return text_result(std::move(text),
                     {{"run_id", run.run_id},
                      {"state", finished ? "finished" : "running"},
                      {"stdout", shown(tail_excerpt(out, k_output_lines, k_output_bytes))},
                      {"stderr", shown(tail_excerpt(err, k_output_lines, k_output_bytes))}});
}

// Waits up to `wait_s` for the run to finish; whether it has.
Expected<bool> wait_finished(HostSession& session, const RunRecord& run, int wait_s,
                             const StopToken& stop)
{
  const StagedRun staged = detached_staged(run);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  for (;;) {
    FERRY_TRY_ASSIGN(const auto state,
                     detached_state(session, staged, run.detached.value("launcher_pid", 0LL)));
    // Gone or lost: collecting says so, and why.
    const bool ended = state != DetachedState::running;
    if (ended || std::chrono::steady_clock::now() >= until || stop.stop_requested()) {
      return ended;
    }
    std::this_thread::sleep_for(k_result_poll);
  }
}

// ferry_run_result and ferry_run_stop: the run collected, as its job call would have returned it.
Expected<json> collect_run(RunTool tool, const RunToolSetup& setup, const RunArguments& args,
                           RunObserver& view)
{
  auto named = named_run(setup, args);
  if (!named && tool == RunTool::result) { // asked again: the run as it was collected
    if (auto collected = collected_run_result(setup, args.run)) {
      return std::move(*collected);
    }
  }
  FERRY_TRY_ASSIGN(RunRecord running, std::move(named));
  FERRY_TRY_ASSIGN(const Job job, job_of(running));
  FERRY_TRY_ASSIGN(auto session, sessions_of (*setup.targets)(running));
  const bool stop = tool == RunTool::stop;
  if (!stop) {
    FERRY_TRY_ASSIGN(const bool finished,
                     wait_finished(*session, running, args.wait_s, setup.stop));
    if (!finished) {
      return text_result(
          fmt::format("{}: still running{}; ferry_run_output shows its output so far, "
                      "ferry_run_result with wait_s waits for it\n",
                      run_heading(running),
                      args.wait_s > 0 ? fmt::format(" after {} s", args.wait_s) : ""),
          {{"run_id", running.run_id}, {"state", "running"}});
    }
  }
  const std::string out_dir = options_of(running, false).out_dir;
  const std::string run_id = running.run_id;
  ArchivingObserver archiving(archiving_settings(*setup.archive, setup.client), view);
  const auto on_error = archiving_settings(*setup.archive, setup.client).on_error;
  CollectRequest request;
  request.stop = stop;
  request.show_output = false; // the result carries it
  request.interrupt = setup.stop;
  request.on_error = on_error;
  request.view = &view;
  FERRY_TRY_ASSIGN(Collected collected, collect_detached(*setup.archive->archive, *session, job,
                                                         std::move(running), request, archiving));
  const RunRecord& record = collected.attached.record;
  if (collected.attached.end == Attached::End::detached) {
    return fail(ErrorKind::failed, "{}: the call was cancelled; the run goes on", run_id);
  }
  if (setup.collected != nullptr) {
    *setup.collected = record.status;
  }
  if (setup.archive->max_size && !collected.by_another) {
    archiving.keep_within(*setup.archive->max_size, setup.archive->config_file);
  }
  return call_result(job, {record}, {collected.by_another || archiving.archived(run_id)}, out_dir);
}

} // namespace

std::optional<RunRecord> detached_run_of(const RunToolSetup& setup, const std::string& run_id)
{
  auto run = named_run(setup, {run_id, 0});
  if (!run || run->run_id != run_id) {
    return std::nullopt;
  }
  return std::move(run).value();
}

std::optional<json> collected_run_result(const RunToolSetup& setup, const std::string& run_id)
{
  auto record = setup.archive->archive->load(run_id);
  if (!record || record->run_id != run_id) {
    return std::nullopt;
  }
  // A final record has no `detached` member: job_of and options_of read that of a waiting run.
  const std::string name = record->script_name.empty() ? record->job : record->script_name;
  auto job = parse_job(record->job, name, "archive", record->script);
  if (!job) {
    return std::nullopt;
  }
  if (setup.collected != nullptr) {
    *setup.collected = record->status;
  }
  return call_result(*job, {*record}, {true}, RunOptions{}.out_dir);
}

std::optional<RunTool> run_tool(std::string_view name)
{
  for (const auto& info : k_run_tools) {
    if (info.name == name) {
      return info.tool;
    }
  }
  return std::nullopt;
}

std::string run_tool_names()
{
  std::string names;
  for (std::size_t i = 0; i < k_run_tools.size(); ++i) {
    names += (i == 0 ? "" : i + 1 == k_run_tools.size() ? " and " : ", ");
    names += k_run_tools[i].name;
  }
  return names;
}

json run_tool_definitions()
{
  json tools = json::array();
  for (const auto& info : k_run_tools) {
    tools.push_back({{"name", info.name},
                     {"title", info.name},
                     {"description", info.description},
                     {"inputSchema", input_schema_of(info.tool)}});
  }
  return tools;
}

json call_run_tool(RunTool tool, const json& arguments, const RunToolSetup& setup,
                   RunObserver& view)
{
  auto args = run_arguments(tool, arguments.is_null() ? json::object() : arguments);
  if (!args) {
    return error_result(args.error().message);
  }
  Expected<json> result = [&]() -> Expected<json> {
    switch (tool) {
    case RunTool::state:
      return run_state(setup, *args);
    case RunTool::output:
      return run_output(setup, *args);
    case RunTool::result:
    case RunTool::stop:
      return collect_run(tool, setup, *args, view);
    }
    return fail(ErrorKind::usage, "unknown run tool");
  }();
  return result ? std::move(result).value() : error_result(result.error().message);
}

} // namespace ferry::mcp
