#include "mcp/server.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "ferry/text.hpp"
#include "ferry/version.hpp"
#include "mcp/call.hpp"
#include "mcp/call_reporter.hpp"
#include "mcp/json_rpc.hpp"
#include "mcp/render.hpp"
#include "mcp/resources.hpp"
#include "mcp/run_tools.hpp"
#include "mcp/tasks.hpp"
#include "mcp/tools.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

constexpr std::chrono::milliseconds k_poll{200};

void note(std::string_view text)
{
  const std::string line = fmt::format("ferry mcp: {}\n", terminal_safe(text));
  std::fwrite(line.data(), 1, line.size(), stderr);
}

std::string joined(const std::vector<std::string>& items)
{
  std::string text;
  for (const auto& item : items) {
    text += (text.empty() ? "" : ", ") + item;
  }
  return text;
}

std::string instructions(const std::vector<std::string>& targets)
{
  return fmt::format(
      "ferry runs fixed, typed jobs on a fixed set of targets: {}. Each tool is one job: give "
      "its parameters as typed arguments and `target` to pick where it runs (\"{}\" runs it on "
      "every target). There is no tool for free-form commands or shell text, by design: "
      "nothing you send can name another host, a file path to run, an interpreter or a "
      "command, and parameters reach the host as a JSON file, never through a shell. A run "
      "that fails comes back as a tool result with isError set, its error and output "
      "excerpts. Every call is archived; recent runs are resources ferry://runs/RUN_ID. A "
      "job tool called with detach: true starts the job and returns its run id at once; {} "
      "follow that run.",
      joined(targets), k_all_targets, run_tool_names());
}

// A string the client sent, kept short: it goes into every record of its calls.
std::string client_string(const json& info, const char* key)
{
  const auto value = info.find(key);
  return value != info.end() && value->is_string() ? shorten(value->get<std::string>(), 200)
                                                   : std::string();
}

// One tools/call in flight.
struct Call {
  StopToken stop = StopToken::make();
  std::unique_ptr<CallReporter> reporter;
  std::thread worker;
  std::atomic<bool> done{false};
  std::atomic<bool> cancelled{false};
  std::optional<std::string> rpc_error; // set by the worker: answered as a JSON-RPC error
};

class Server {
public:
  Server(ServerConfig config, Writer& writer)
      : m_config(std::move(config)), m_writer(writer),
        m_pool(m_config.targets, m_config.idle_limit), m_targets(m_pool.labels())
  {
    for (const auto& job : m_config.jobs) {
      m_tools.push_back(tool_definition(job, m_targets));
      m_tools.back()["execution"] = {{"taskSupport", "optional"}};
      m_jobs[job.name] = &job;
    }
    for (auto& tool : run_tool_definitions()) {
      m_tools.push_back(std::move(tool));
    }
  }

  ExitCode run(LineReader& reader);

private:
  enum class State { awaiting_initialize, ready, shutting_down };

  void handle(const Incoming& message);
  void handle_notification(const Incoming& message);
  void handle_request(const Incoming& message);
  void answer(const Incoming& message);
  json initialize(const json& params);
  void call_tool(const Incoming& message);
  bool room_for_call(const Incoming& message);
  void start_call(const Incoming& message, const Job& job, CallPlan plan, bool as_task);
  bool task_wanted(const Incoming& message, bool run_tool, bool& as_task);
  void answer_task(const Incoming& message);
  void task_get(const Incoming& message, const std::string& id);
  void task_result(const Incoming& message, const std::string& id);
  void task_cancel(const Incoming& message, const std::string& id);
  json call_run_tool_on(RunTool tool, const std::string& id, Call& call,
                        std::optional<RunStatus>* collected = nullptr, int wait_s = 0);
  RunToolSetup run_tool_setup(Call& call, std::optional<RunStatus>* collected = nullptr);
  bool adopt_task(const std::string& id);
  json set_task(const std::string& id, std::string status, std::string message,
                json result = nullptr);
  json task_created(const json& result, Call& call);
  void start_run_tool(const Incoming& message, RunTool tool);
  void start_worker(const Incoming& message, const std::string& name, std::size_t runs,
                    std::function<json(Call&)> work);
  void answer_resource(const Incoming& message);
  void set_level(const Incoming& message);
  void cancel(const json& params);
  void housekeeping();
  void notice_interrupt();
  void stop_all();
  void reap(bool wait);
  bool reply(const json& id, json result) { return m_writer.send(result_message(id, result)); }
  bool refuse(const json& id, RpcError code, std::string_view text)
  {
    return m_writer.send(error_message(id, code, text));
  }

  ServerConfig m_config;
  Writer& m_writer;
  SessionPool m_pool;
  std::vector<std::string> m_targets;
  json m_tools = json::array();
  std::map<std::string, const Job*> m_jobs;
  State m_state = State::awaiting_initialize;
  json m_client = json::object();
  std::atomic<LogLevel> m_level{LogLevel::info};
  std::map<std::string, std::unique_ptr<Call>> m_calls; // by id (its JSON text); main thread
  TaskTable m_tasks;
};

ExitCode Server::run(LineReader& reader)
{
  std::string line;
  for (;;) {
    const auto status = reader.next(line, k_poll);
    if (status == LineReader::Status::eof) {
      break;
    }
    if (status == LineReader::Status::line) {
      handle(parse_message(line));
    } else if (status == LineReader::Status::oversized) {
      refuse(nullptr, RpcError::invalid_request,
             fmt::format("message larger than {} bytes refused unread", k_max_message_bytes));
    }
    housekeeping();
    if (m_writer.closed() || (m_state == State::shutting_down && m_calls.empty())) {
      break;
    }
  }
  // The input ended or the client went away: nobody waits for these runs any more.
  stop_all();
  reap(true);
  m_pool.clear();
  return interrupt_requested() ? ExitCode::interrupted : ExitCode::ok;
}

void Server::notice_interrupt()
{
  if (interrupt_requested() && m_state != State::shutting_down) {
    note("interrupted: stopping the running calls");
    m_state = State::shutting_down;
    stop_all();
  }
}

void Server::housekeeping()
{
  notice_interrupt();
  reap(false);
  for (auto& [id, call] : m_calls) {
    call->reporter->heartbeat();
  }
  m_pool.expire_idle();
}

void Server::handle(const Incoming& message)
{
  switch (message.kind) {
  case Incoming::Kind::invalid:
    refuse(message.id, message.problem_code, message.problem);
    return;
  case Incoming::Kind::response:
    return; // ferry sends no requests, so there is nothing to match
  case Incoming::Kind::notification:
    return handle_notification(message);
  case Incoming::Kind::request:
    return handle_request(message);
  }
}

void Server::handle_notification(const Incoming& message)
{
  if (message.method == "notifications/cancelled") {
    cancel(message.params);
  }
  // notifications/initialized and anything else need no action (unknown ones are ignored).
}

void Server::handle_request(const Incoming& message)
{
  if (message.method == "ping") {
    reply(message.id, json::object());
    return;
  }
  notice_interrupt(); // a signal that arrived with this request counts before it
  if (m_state == State::shutting_down) {
    refuse(message.id, RpcError::invalid_request,
           "ferry mcp is shutting down (interrupted); it takes no more requests");
    return;
  }
  if (message.method == "initialize") {
    if (m_state != State::awaiting_initialize) {
      refuse(message.id, RpcError::invalid_request, "already initialized");
      return;
    }
    json result = initialize(message.params);
    if (result.contains("protocolVersion")) {
      m_state = State::ready;
    }
    reply(message.id, std::move(result));
    return;
  }
  if (m_state == State::awaiting_initialize) {
    refuse(message.id, RpcError::invalid_request,
           fmt::format("not initialized: send initialize before {}", shorten(message.method, 80)));
    return;
  }
  answer(message);
}

void Server::answer(const Incoming& message)
{
  const std::string& method = message.method;
  if (method == "tools/list") {
    reply(message.id, {{"tools", m_tools}});
  } else if (method == "tools/call") {
    call_tool(message);
  } else if (method == "resources/list" || method == "resources/read") {
    answer_resource(message);
  } else if (method == "resources/templates/list") {
    reply(message.id, run_templates());
  } else if (method.rfind("tasks/", 0) == 0) {
    answer_task(message);
  } else if (method == "logging/setLevel") {
    set_level(message);
  } else {
    refuse(message.id, RpcError::method_not_found,
           fmt::format("Method not found: {}", shorten(method, 80)));
  }
}

json Server::initialize(const json& params)
{
  const auto requested = params.find("protocolVersion");
  const bool newer = requested != params.end() && *requested == k_newer_protocol_version;
  if (const auto info = params.find("clientInfo"); info != params.end() && info->is_object()) {
    m_client = {{"name", client_string(*info, "name")},
                {"version", client_string(*info, "version")}};
  } else {
    m_client = {{"name", ""}, {"version", ""}};
  }
  json server = {{"name", "ferry"}, {"title", "ferry"}, {"version", version()}};
  if (newer) {
    server["description"] = "typed, archived jobs on remote hosts instead of a shell";
  }
  note(fmt::format("client {} {} connected (protocol {})", m_client["name"].get<std::string>(),
                   m_client["version"].get<std::string>(),
                   newer ? k_newer_protocol_version : k_protocol_version));
  return {{"protocolVersion", newer ? k_newer_protocol_version : k_protocol_version},
          {"capabilities",
           {{"tools", {{"listChanged", false}}},
            {"resources", {{"listChanged", false}}},
            {"logging", json::object()},
            {"tasks",
             {{"list", json::object()},
              {"cancel", json::object()},
              {"requests", {{"tools", {{"call", json::object()}}}}}}}}},
          {"serverInfo", server},
          {"instructions", instructions(m_targets)}};
}

void Server::call_tool(const Incoming& message)
{
  const auto name = message.params.find("name");
  if (name == message.params.end() || !name->is_string()) {
    refuse(message.id, RpcError::invalid_params, "tools/call needs \"name\", a string");
    return;
  }
  const auto arguments = message.params.find("arguments");
  const json given = arguments == message.params.end() ? json(nullptr) : *arguments;
  bool as_task = false;
  if (!task_wanted(message, is_run_tool(name->get<std::string>()), as_task)) {
    return;
  }
  if (const auto tool = run_tool(name->get<std::string>())) {
    if (room_for_call(message)) {
      start_run_tool(message, *tool);
    }
    return;
  }
  const auto job = m_jobs.find(name->get<std::string>());
  if (job == m_jobs.end()) {
    refuse(message.id, RpcError::invalid_params,
           fmt::format("Unknown tool: {}", shorten(name->get<std::string>(), 80)));
    return;
  }
  auto plan = plan_call(*job->second, given, m_targets);
  if (!plan) {
    reply(message.id, error_result(plan.error().message));
    return;
  }
  if (as_task && plan->targets.size() != 1) {
    refuse(message.id, RpcError::invalid_params,
           fmt::format("{} as a task runs on one target: name one in `target` (a task is one "
                       "detached run)",
                       job->first));
    return;
  }
  if (room_for_call(message)) {
    start_call(message, *job->second, std::move(plan).value(), as_task);
  }
}

// Whether the call may go on (else it is refused); `as_task`: it carries `task` (MCP tasks).
bool Server::task_wanted(const Incoming& message, bool run_tool, bool& as_task)
{
  const auto task = message.params.find("task");
  if (task == message.params.end()) {
    return true;
  }
  if (run_tool) {
    refuse(message.id, RpcError::method_not_found,
           fmt::format("{} is not offered as a task (its taskSupport is forbidden); call it "
                       "without `task`",
                       message.params["name"].get<std::string>()));
    return false;
  }
  if (!task->is_object()) {
    refuse(message.id, RpcError::invalid_params,
           "tools/call: \"task\" must be an object ({\"ttl\": MILLISECONDS} or {})");
    return false;
  }
  as_task = true;
  return true;
}

// Whether a call with this request id may start now; else it is answered.
bool Server::room_for_call(const Incoming& message)
{
  if (m_calls.count(message.id.dump()) != 0) {
    refuse(message.id, RpcError::invalid_request,
           fmt::format("request id {} belongs to a call still running", message.id.dump()));
    return false;
  }
  if (m_calls.size() >= m_config.max_calls) {
    reply(message.id, error_result(fmt::format("{} calls are running already, the most ferry mcp "
                                               "runs at once; wait for one to finish",
                                               m_config.max_calls)));
    return false;
  }
  return true;
}

void Server::start_call(const Incoming& message, const Job& job, CallPlan plan, bool as_task)
{
  CallSetup setup;
  setup.job = &job;
  setup.params = std::move(plan.params);
  setup.targets = std::move(plan.targets);
  setup.options = m_config.run_options;
  setup.client = m_client;
  // A task is a detached run: its id is the task's, and tasks/result collects it.
  if (plan.detach || as_task) { // as `run --detach`: started, recorded `running`, answered at once
    setup.options.detach_keep_for_s = k_detach_keep_for_s;
  }
  const std::size_t runs = setup.targets.size();
  start_worker(message, job.name, runs,
               [this, setup = std::move(setup), &job, as_task](Call& call) {
                 CallSetup mine = setup;
                 mine.options.stop = call.stop;
                 CallOutcome outcome = run_call(m_pool, m_config.archive, mine, *call.reporter);
                 json result =
                     call_result(job, outcome.runs, outcome.archived, m_config.run_options.out_dir);
                 return as_task ? task_created(result, call) : result;
               });
}

void Server::start_run_tool(const Incoming& message, RunTool tool)
{
  const auto arguments = message.params.find("arguments");
  json given = arguments == message.params.end() ? json(nullptr) : *arguments;
  const std::string name = message.params["name"].get<std::string>();
  start_worker(message, name, 1, [this, tool, given = std::move(given)](Call& call) {
    std::optional<RunStatus> collected;
    json result = call_run_tool(tool, given, run_tool_setup(call, &collected), *call.reporter);
    const auto id = only_run_id(result);
    if (collected && id && m_tasks.find(*id)) { // a task's run, collected by a run tool
      set_task(*id, task_status_of(*collected), "", result);
    }
    return result;
  });
}

// The call's work on a worker of its own; its result is the response (none once cancelled).
void Server::start_worker(const Incoming& message, const std::string& name, std::size_t runs,
                          std::function<json(Call&)> work)
{
  auto call = std::make_unique<Call>();
  json token;
  if (const auto meta = message.params.find("_meta");
      meta != message.params.end() && meta->is_object() && meta->contains("progressToken")) {
    token = (*meta)["progressToken"];
  }
  call->reporter = std::make_unique<CallReporter>(m_writer, token, m_level, name, runs);
  Call& running = *call;
  running.worker = std::thread([this, id = message.id, &running, work = std::move(work)] {
    json result;
    try {
      result = work(running);
    } catch (const std::exception& e) {
      result = error_result(fmt::format("ferry mcp: internal error: {}", e.what()));
    }
    running.reporter->close();
    // A cancelled request gets no response (MCP, "Cancellation").
    if (!running.cancelled) {
      running.rpc_error ? (void)refuse(id, RpcError::internal_error, *running.rpc_error)
                        : (void)reply(id, std::move(result));
    }
    running.done = true;
  });
  m_calls[message.id.dump()] = std::move(call);
}

// A task call's answer: its run started detached, the task is that run (CreateTaskResult).
json Server::task_created(const json& result, Call& call)
{
  const auto id = only_run_id(result);
  if (!id || result["structuredContent"]["runs"][0].value("status", "") != "running") {
    call.rpc_error = "the job could not start as a task: " + text_of(result);
    return result;
  }
  m_tasks.add(*id, "working", "", nullptr);
  return {{"task", task_json(*id, *m_tasks.find(*id))}};
}

RunToolSetup Server::run_tool_setup(Call& call, std::optional<RunStatus>* collected)
{
  RunToolSetup setup;
  setup.archive = &m_config.archive;
  setup.targets = &m_config.targets;
  setup.client = m_client;
  setup.stop = call.stop;
  setup.collected = collected;
  return setup;
}

json Server::call_run_tool_on(RunTool tool, const std::string& id, Call& call,
                              std::optional<RunStatus>* collected, int wait_s)
{
  json arguments = {{"run", id}};
  if (wait_s > 0) {
    arguments["wait_s"] = wait_s;
  }
  return call_run_tool(tool, arguments, run_tool_setup(call, collected), *call.reporter);
}

// A task this server did not start: a detached run of exactly that id that waits for collection
// on one of its targets (another ferry mcp, before a restart, started it as a task) becomes one
// of its tasks. Whether it did.
bool Server::adopt_task(const std::string& id)
{
  if (m_config.archive.archive == nullptr) {
    return false;
  }
  RunToolSetup setup;
  setup.archive = &m_config.archive;
  setup.targets = &m_config.targets;
  const auto run = detached_run_of(setup, id);
  if (run) {
    m_tasks.add(id, "working", "", nullptr, run->started_at);
  }
  return run.has_value();
}

// Sets the task's status; a change is told the client (notifications/tasks/status, which MCP
// lets a server send and no client may rely on). The Task as it is now.
json Server::set_task(const std::string& id, std::string status, std::string message, json result)
{
  const auto updated = m_tasks.update(id, std::move(status), std::move(message), std::move(result));
  json task = task_json(id, updated.entry);
  if (updated.changed) {
    m_writer.send(notification("notifications/tasks/status", task));
  }
  return task;
}

void Server::answer_task(const Incoming& message)
{
  if (message.method == "tasks/list") {
    reply(message.id, m_tasks.list()); // every task: no cursor is needed
    return;
  }
  if (message.method != "tasks/get" && message.method != "tasks/result" &&
      message.method != "tasks/cancel") {
    refuse(message.id, RpcError::method_not_found,
           fmt::format("Method not found: {}", shorten(message.method, 80)));
    return;
  }
  const auto id = message.params.find("taskId");
  if (id == message.params.end() || !id->is_string()) {
    refuse(message.id, RpcError::invalid_params,
           fmt::format("{} needs \"taskId\", a string", message.method));
    return;
  }
  const std::string task = id->get<std::string>();
  if (!m_tasks.find(task) && !adopt_task(task)) {
    refuse(message.id, RpcError::invalid_params,
           fmt::format("no task '{}' on this ferry mcp: neither a task it started nor a detached "
                       "run waiting for collection on one of its targets; tasks/list lists its "
                       "tasks",
                       shorten(task, 80)));
    return;
  }
  if (message.method == "tasks/get") {
    task_get(message, task);
  } else if (message.method == "tasks/result") {
    task_result(message, task);
  } else {
    task_cancel(message, task);
  }
}

// The task's status: its run's state, asked of its host (as ferry_run_state asks) until it ends.
void Server::task_get(const Incoming& message, const std::string& id)
{
  const TaskEntry known = *m_tasks.find(id);
  if (task_ended(known.status)) {
    reply(message.id, task_json(id, known));
    return;
  }
  if (!room_for_call(message)) {
    return;
  }
  start_worker(message, "tasks/get", 1, [this, id](Call& call) {
    const json state = call_run_tool_on(RunTool::state, id, call);
    if (state.value("isError", false)) { // collected or stopped meanwhile, or its host is away
      std::optional<RunStatus> collected;
      if (auto done = collected_run_result(run_tool_setup(call, &collected), id)) {
        return set_task(id, task_status_of(*collected), "", std::move(*done));
      }
      return task_json(id, *m_tasks.find(id));
    }
    const auto word = state["structuredContent"].value("state", std::string());
    const std::string status = task_status_of_state(word);
    const std::string detail = state["structuredContent"].value("detail", std::string());
    return set_task(id, status,
                    status == "completed" ? "finished: tasks/result collects its result"
                                          : (status == "failed" ? detail : ""));
  });
}

// The tool's result: the run waited for and collected as ferry_run_result collects it.
void Server::task_result(const Incoming& message, const std::string& id)
{
  const TaskEntry known = *m_tasks.find(id);
  if (!known.result.is_null()) {
    reply(message.id, with_related_task(known.result, id));
    return;
  }
  if (!room_for_call(message)) {
    return;
  }
  start_worker(message, "tasks/result", 1, [this, id](Call& call) {
    json result;
    std::optional<RunStatus> collected;
    do { // until it is collected (or cannot be): ferry_run_result answers `running` till then
      result = call_run_tool_on(RunTool::result, id, call, &collected, k_max_result_wait_s);
    } while (!collected && !call.stop.stop_requested() && !result.value("isError", false));
    if (collected) { // the task ends as the run did
      set_task(id, task_status_of(*collected), "", result);
    }
    const TaskEntry now = *m_tasks.find(id); // a tasks/cancel may have collected it first
    return with_related_task(now.result.is_null() ? result : now.result, id);
  });
}

// Stops the run as ferry_run_stop does: archived as interrupted, the task cancelled.
void Server::task_cancel(const Incoming& message, const std::string& id)
{
  const TaskEntry known = *m_tasks.find(id);
  if (task_ended(known.status)) {
    refuse(message.id, RpcError::invalid_params,
           fmt::format("task {} has ended already ({}): there is nothing to cancel", id,
                       known.status));
    return;
  }
  if (!room_for_call(message)) {
    return;
  }
  start_worker(message, "tasks/cancel", 1, [this, id](Call& call) {
    std::optional<RunStatus> collected;
    const json stopped = call_run_tool_on(RunTool::stop, id, call, &collected);
    if (collected) {
      return set_task(id, "cancelled", "stopped by tasks/cancel", stopped);
    }
    const TaskEntry now = *m_tasks.find(id);
    if (!task_ended(now.status)) {
      call.rpc_error = fmt::format("task {} could not be cancelled: {}", id, text_of(stopped));
    }
    return task_json(id, now);
  });
}

void Server::answer_resource(const Incoming& message)
{
  Archive* archive = m_config.archive.archive;
  if (archive == nullptr) {
    refuse(message.id, RpcError::internal_error, "no archive is open");
    return;
  }
  if (message.method == "resources/list") {
    auto listed = list_runs(*archive);
    listed ? (void)reply(message.id, std::move(listed).value())
           : (void)refuse(message.id, RpcError::internal_error, listed.error().message);
    return;
  }
  const auto uri = message.params.find("uri");
  if (uri == message.params.end() || !uri->is_string()) {
    refuse(message.id, RpcError::invalid_params, "resources/read needs \"uri\", a string");
    return;
  }
  auto read = read_run(*archive, uri->get<std::string>(), m_config.run_options.out_dir);
  if (read) {
    reply(message.id, std::move(read).value());
  } else {
    refuse(message.id,
           read.error().kind == ErrorKind::usage ? RpcError::resource_not_found
                                                 : RpcError::internal_error,
           read.error().message);
  }
}

void Server::set_level(const Incoming& message)
{
  const auto level = message.params.find("level");
  const auto parsed = level != message.params.end() && level->is_string()
                          ? log_level_from(level->get<std::string>())
                          : std::nullopt;
  if (!parsed) {
    refuse(message.id, RpcError::invalid_params,
           "logging/setLevel needs \"level\": one of debug, info, notice, warning, error, "
           "critical, alert, emergency");
    return;
  }
  m_level = *parsed;
  reply(message.id, json::object());
}

void Server::cancel(const json& params)
{
  const auto id = params.find("requestId");
  if (id == params.end()) {
    return; // malformed: ignored, as MCP asks
  }
  const auto call = m_calls.find(id->dump());
  if (call == m_calls.end() || call->second->done) {
    return; // unknown or finished: ignored
  }
  const auto reason = params.find("reason");
  note(fmt::format("call {} cancelled by the client{}", id->dump(),
                   reason != params.end() && reason->is_string()
                       ? ": " + shorten(reason->get<std::string>(), 200)
                       : ""));
  call->second->cancelled = true;
  call->second->reporter->close();
  call->second->stop.request_stop();
}

void Server::stop_all()
{
  for (auto& [id, call] : m_calls) {
    call->stop.request_stop();
  }
}

void Server::reap(bool wait)
{
  for (auto it = m_calls.begin(); it != m_calls.end();) {
    if (wait || it->second->done) {
      it->second->worker.join();
      it = m_calls.erase(it);
    } else {
      ++it;
    }
  }
}

} // namespace

ExitCode serve(ServerConfig config, int in_fd, int out_fd)
{
  Writer writer(out_fd);
  LineReader reader(in_fd, k_max_message_bytes);
  Server server(std::move(config), writer);
  return server.run(reader);
}

} // namespace ferry::mcp
