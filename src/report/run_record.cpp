#include <charconv>
#include <chrono>

#include "ferry/run_record.hpp"
#include "ferry/util.hpp"

namespace ferry {

using Json = nlohmann::json; // not `json`: ParamType::json is a name in ferry

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

std::string_view to_string(Unreached failure)
{
  switch (failure) {
  case Unreached::none:
    return "";
  case Unreached::unreachable:
    return "unreachable";
  case Unreached::refused:
    return "refused";
  case Unreached::timeout:
    return "timeout";
  case Unreached::host_key:
    return "host-key";
  case Unreached::auth:
    return "auth";
  }
  return "";
}

std::optional<Unreached> unreached_from(std::string_view text)
{
  for (const auto failure : {Unreached::unreachable, Unreached::refused, Unreached::timeout,
                             Unreached::host_key, Unreached::auth}) {
    if (to_string(failure) == text) {
      return failure;
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

namespace {

// "~1" -> "/", "~0" -> "~": a JSON Pointer token as the member name it stands for.
std::string unescaped(std::string_view token)
{
  std::string name;
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      name += token[++i] == '1' ? '/' : '~';
    } else {
      name += token[i];
    }
  }
  return name;
}

std::vector<std::string> tokens_of(std::string_view pointer)
{
  std::vector<std::string> tokens;
  while (!pointer.empty()) {
    pointer.remove_prefix(1); // the '/'
    const auto slash = std::min(pointer.find('/'), pointer.size());
    tokens.push_back(unescaped(pointer.substr(0, slash)));
    pointer.remove_prefix(slash);
  }
  return tokens;
}

// TOKEN as an index of the array NODE, when it is one and NODE has that element.
std::optional<std::size_t> array_index(const Json& node, const std::string& token)
{
  std::size_t index = 0;
  const auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), index);
  if (!node.is_array() || token.empty() || error != std::errc() ||
      end != token.data() + token.size() || index >= node.size()) {
    return std::nullopt;
  }
  return index;
}

// Walks TOKENS from NODE, adding every value reached to OUT under the names "*" matched.
void collect_summary(const Json& node, const std::vector<std::string>& tokens, std::size_t at,
                     const std::string& matched, Json& out)
{
  if (at == tokens.size()) {
    // "/kv/*" names each member by its key alone.
    const std::string last = tokens.empty() ? "result" : tokens.back();
    out.push_back({{"name", last == "*" ? matched.substr(0, matched.size() - 1) : matched + last},
                   {"value", node}});
    return;
  }
  const std::string& token = tokens[at];
  if (token == "*" && (node.is_object() || node.is_array())) {
    for (const auto& [key, child] : node.items()) {
      collect_summary(child, tokens, at + 1, matched + key + "/", out);
    }
  } else if (node.is_object() && node.contains(token)) {
    collect_summary(node[token], tokens, at + 1, matched, out);
  } else if (const auto index = array_index(node, token)) {
    collect_summary(node[*index], tokens, at + 1, matched, out);
  }
}

} // namespace

Json result_summary(const Json& result, const std::vector<std::string>& pointers)
{
  Json summary = Json::array();
  for (const auto& pointer : pointers) {
    collect_summary(result, tokens_of(pointer), 0, "", summary);
  }
  return summary;
}

std::string summary_text(const Json& summary)
{
  std::string text;
  for (const auto& item : summary) {
    const auto name = item.is_object() ? item.find("name") : item.end();
    if (name == item.end() || !name->is_string()) {
      continue; // not what ferry writes: an archive changed by hand
    }
    const Json value = item.value("value", Json());
    text += fmt::format("{}{}={}", text.empty() ? "" : " ", name->get<std::string>(),
                        value.is_string() ? value.get<std::string>() : to_json_line(value));
  }
  return text;
}

std::string new_run_id()
{
  return utc_compact(std::chrono::system_clock::now()) + "-" + random_hex(4);
}

Json to_json(const RunRecord& r, bool with_streams)
{
  Json j;
  j["run_id"] = r.run_id;
  j["job"] = r.job;
  j["job_sha256"] = r.job_sha256;
  j["target"] = r.target;
  j["params"] = r.params;
  // A detached run not yet collected is `running` (docs/record.md, "The life of a run").
  j["status"] = r.detached.is_null() ? to_string(r.status) : std::string_view("running");
  j["exit_code"] = r.exit_code ? Json(*r.exit_code) : Json(nullptr);
  j["error"] = r.error ? Json(*r.error) : Json(nullptr);
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
  j["replay_of"] = r.replay_of ? Json(*r.replay_of) : Json(nullptr);
  if (r.failure != Unreached::none) {
    j["failure"] = to_string(r.failure);
  }
  if (r.invocation) {
    j["invocation"] = *r.invocation;
  }
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
  if (!r.summary.is_null()) {
    j["summary"] = r.summary;
  }
  if (!r.gpus.empty()) {
    j["gpus"] = r.gpus;
  }
  if (!r.client.is_null()) {
    j["client"] = r.client;
  }
  if (!r.detached.is_null()) {
    j["detached"] = r.detached;
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

namespace {

// KEY's value when it is there as a T (an integer for int, a string for std::string).
template <typename T> std::optional<T> optional_of(const Json& j, const char* key)
{
  const auto it = j.find(key);
  if (it == j.end()) {
    return std::nullopt;
  }
  if constexpr (std::is_same_v<T, int>) {
    return it->is_number_integer() ? std::optional<T>(it->get<int>()) : std::nullopt;
  } else {
    return it->is_string() ? std::optional<T>(it->get<std::string>()) : std::nullopt;
  }
}

} // namespace

Expected<RunRecord> run_record_from_json(const Json& j)
{
  if (!j.is_object()) {
    return fail(ErrorKind::failed, "a run record must be a JSON object, not {}", j.type_name());
  }
  RunRecord r;
  try {
    r.run_id = j.at("run_id").get<std::string>();
    r.job = j.at("job").get<std::string>();
    r.job_sha256 = j.value("job_sha256", "");
    r.target = j.value("target", Json::object());
    r.params = j.value("params", Json::object());
    const auto detached = j.find("detached");
    if (detached != j.end() && detached->is_object()) {
      r.detached = *detached;
    }
    const auto status = r.detached.is_null() ? run_status_from(j.at("status").get<std::string>())
                                             : std::optional<RunStatus>(RunStatus::error);
    if (!status) {
      return fail(ErrorKind::failed, "run record {}: unknown status '{}'", r.run_id,
                  j.at("status").get<std::string>());
    }
    r.status = *status;
    r.exit_code = optional_of<int>(j, "exit_code");
    r.error = optional_of<std::string>(j, "error");
    r.result = j.value("result", Json());
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
    r.invocation = optional_of<std::string>(j, "invocation");
    r.replay_of = optional_of<std::string>(j, "replay_of");
    r.failure = unreached_from(j.value("failure", "")).value_or(Unreached::none);
    r.ferry_version = j.value("ferry_version", "");
    r.warnings = j.value("warnings", Json::array());
    r.files = j.value("files", Json::array());
    r.outputs = j.value("outputs", Json::array());
    if (const auto gpus = j.find("gpus"); gpus != j.end() && gpus->is_array()) {
      r.gpus = *gpus;
    }
    if (const auto summary = j.find("summary"); summary != j.end() && summary->is_array()) {
      r.summary = *summary;
    }
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
  } catch (const Json::exception& e) {
    return fail(ErrorKind::failed, "malformed run record: {}", e.what());
  }
  return r;
}

std::string params_file_bytes(const Json& params)
{
  return to_json_line(params) + "\n";
}

std::string to_json_line(const Json& j)
{
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

} // namespace ferry
