#include <chrono>

#include "ferry/run_record.hpp"
#include "ferry/util.hpp"

namespace ferry {

using nlohmann::json;

std::string_view to_string(RunStatus status)
{
  switch (status) {
  case RunStatus::ok:
    return "ok";
  case RunStatus::failed:
    return "failed";
  case RunStatus::timeout:
    return "timeout";
  case RunStatus::bad_result:
    return "bad-result";
  case RunStatus::no_result:
    return "no-result";
  case RunStatus::error:
    return "error";
  case RunStatus::interrupted:
    return "interrupted";
  }
  return "error";
}

std::optional<RunStatus> run_status_from(std::string_view text)
{
  for (const auto status : k_run_statuses) {
    if (to_string(status) == text) {
      return status;
    }
  }
  return std::nullopt;
}

std::vector<std::string> run_status_names()
{
  std::vector<std::string> names;
  for (const auto status : k_run_statuses) {
    names.emplace_back(to_string(status));
  }
  return names;
}

std::string new_run_id()
{
  return utc_compact(std::chrono::system_clock::now()) + "-" + random_hex(4);
}

json to_json(const RunRecord& r, bool with_streams)
{
  json j;
  j["run_id"] = r.run_id;
  j["job"] = r.job;
  j["job_sha256"] = r.job_sha256;
  j["target"] = r.target;
  j["params"] = r.params;
  j["status"] = to_string(r.status);
  j["exit_code"] = r.exit_code ? json(*r.exit_code) : json(nullptr);
  j["error"] = r.error ? json(*r.error) : json(nullptr);
  j["result"] = r.result;
  if (with_streams) {
    j["stdout"] = r.stdout_text;
    j["stderr"] = r.stderr_text;
  }
  j["stdout_truncated"] = r.stdout_truncated;
  j["stderr_truncated"] = r.stderr_truncated;
  j["started_at"] = r.started_at;
  j["duration_s"] = r.duration_s;
  j["timings"] = {{"connect", r.timings.connect},
                  {"upload", r.timings.upload},
                  {"exec", r.timings.exec},
                  {"fetch", r.timings.fetch}};
  j["replay_of"] = r.replay_of ? json(*r.replay_of) : json(nullptr);
  j["ferry_version"] = r.ferry_version;
  if (!r.warnings.empty()) {
    j["warnings"] = r.warnings;
  }
  if (!r.files.empty()) {
    j["files"] = r.files;
  }
  if (!r.outputs.empty()) {
    j["outputs"] = r.outputs;
  }
  if (!r.client.is_null()) {
    j["client"] = r.client;
  }
  j["env"] = r.env;
  if (!r.interpreter.empty()) {
    j["interpreter"] = r.interpreter;
  }
  if (!r.options.empty()) {
    j["options"] = r.options;
  }
  return j;
}

Expected<RunRecord> run_record_from_json(const json& j)
{
  if (!j.is_object()) {
    return fail(ErrorKind::failed, "a run record must be a JSON object, not {}", j.type_name());
  }
  RunRecord r;
  try {
    r.run_id = j.at("run_id").get<std::string>();
    r.job = j.at("job").get<std::string>();
    r.job_sha256 = j.value("job_sha256", "");
    r.target = j.value("target", json::object());
    r.params = j.value("params", json::object());
    const auto status = run_status_from(j.at("status").get<std::string>());
    if (!status) {
      return fail(ErrorKind::failed, "run record {}: unknown status '{}'", r.run_id,
                  j.at("status").get<std::string>());
    }
    r.status = *status;
    if (j.contains("exit_code") && j["exit_code"].is_number_integer()) {
      r.exit_code = j["exit_code"].get<int>();
    }
    if (j.contains("error") && j["error"].is_string()) {
      r.error = j["error"].get<std::string>();
    }
    r.result = j.value("result", json());
    r.stdout_text = j.value("stdout", "");
    r.stderr_text = j.value("stderr", "");
    r.stdout_truncated = j.value("stdout_truncated", false);
    r.stderr_truncated = j.value("stderr_truncated", false);
    r.started_at = j.value("started_at", "");
    r.duration_s = j.value("duration_s", 0.0);
    if (const auto t = j.find("timings"); t != j.end() && t->is_object()) {
      r.timings = {t->value("connect", 0.0), t->value("upload", 0.0), t->value("exec", 0.0),
                   t->value("fetch", 0.0)};
    }
    if (j.contains("replay_of") && j["replay_of"].is_string()) {
      r.replay_of = j["replay_of"].get<std::string>();
    }
    r.ferry_version = j.value("ferry_version", "");
    r.warnings = j.value("warnings", json::array());
    r.files = j.value("files", json::array());
    r.outputs = j.value("outputs", json::array());
    if (const auto client = j.find("client"); client != j.end() && client->is_object()) {
      r.client = *client;
    }
    if (const auto env = j.find("env"); env != j.end() && env->is_array()) {
      for (const auto& name : *env) {
        if (name.is_string()) {
          r.env.push_back(name.get<std::string>());
        }
      }
    }
    r.interpreter = j.value("interpreter", "");
    if (const auto options = j.find("options"); options != j.end() && options->is_object()) {
      r.options = *options;
    }
  } catch (const json::exception& e) {
    return fail(ErrorKind::failed, "malformed run record: {}", e.what());
  }
  return r;
}

std::string params_file_bytes(const json& params)
{
  return to_json_line(params) + "\n";
}

std::string to_json_line(const json& j)
{
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

} // namespace ferry
