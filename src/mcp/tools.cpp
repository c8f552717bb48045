#include "mcp/tools.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "ferry/params.hpp"
#include "ferry/run_record.hpp"
#include "ferry/text.hpp"
#include "mcp/run_tools.hpp"

namespace ferry::mcp {

using nlohmann::json;

namespace {

// What clients accept as a tool name (MCP 2025-11-25, "Tool Names").
bool is_tool_name(std::string_view name)
{
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::string_view schema_type(ParamType type)
{
  switch (type) {
  case ParamType::integer:
    return "integer";
  case ParamType::floating:
    return "number";
  case ParamType::boolean:
    return "boolean";
  case ParamType::string:
    return "string";
  case ParamType::list:
    return "array";
  case ParamType::json:
    return "";
  }
  return "";
}

// One parameter's schema: its type (none for json: any JSON value), the list's element type,
// choices as enum (on the elements for a list), default and help.
json param_schema(const ParamSpec& spec)
{
  json schema = json::object();
  if (const auto type = schema_type(spec.type); !type.empty()) {
    schema["type"] = type;
  }
  if (spec.type == ParamType::list) {
    schema["items"] = {{"type", schema_type(spec.items)}};
    if (spec.choices) {
      schema["items"]["enum"] = *spec.choices;
    }
  } else if (spec.choices) {
    schema["enum"] = *spec.choices;
  }
  if (spec.pattern) {
    // JSON Schema's pattern is not anchored; ferry's is matched whole.
    (spec.type == ParamType::list ? schema["items"] : schema)["pattern"] =
        fmt::format("^(?:{})$", *spec.pattern);
  }
  if (spec.default_value) {
    schema["default"] = *spec.default_value;
  }
  std::string description = spec.help;
  if (spec.type == ParamType::json) {
    description += std::string(description.empty() ? "" : " ") + "(any JSON value)";
  }
  if (!description.empty()) {
    schema["description"] = description;
  }
  return schema;
}

// One target, "all", or a list of targets.
json target_schema(const std::vector<std::string>& targets)
{
  json choices = targets;
  choices.push_back(k_all_targets);
  json schema = {
      {"anyOf",
       {{{"type", "string"}, {"enum", choices}},
        {{"type", "array"},
         {"items", {{"type", "string"}, {"enum", targets}}},
         {"minItems", 1},
         {"uniqueItems", true}}}},
      {"description",
       fmt::format("where the job runs: one of the targets this server was started with, a list "
                   "of them, or \"{}\" for every one of them",
                   k_all_targets)}};
  if (targets.size() == 1) {
    schema["default"] = targets.front();
  }
  return schema;
}

std::string param_line(const ParamSpec& spec)
{
  std::string type = spec.type == ParamType::list ? fmt::format("list of {}", to_string(spec.items))
                                                  : std::string(to_string(spec.type));
  if (spec.default_value) {
    type += ", default " +
            shorten(spec.default_value->dump(-1, ' ', false, json::error_handler_t::replace), 80);
  } else if (spec.required) {
    type += ", required";
  }
  return fmt::format("- {} ({}){}", spec.name, type, spec.help.empty() ? "" : ": " + spec.help);
}

std::string tool_description(const Job& job, const std::vector<std::string>& targets)
{
  std::string text = job.meta.description.empty() ? "ferry job " + job.name : job.meta.description;
  if (!job.meta.params.empty()) {
    text += "\n\nParameters:";
    for (const auto& spec : job.meta.params) {
      text += "\n" + param_line(spec);
    }
  }
  std::string names;
  for (const auto& target : targets) {
    names += (names.empty() ? "" : ", ") + target;
  }
  text += fmt::format("\n\nRuns on: {} (argument `target`, or \"{}\"). Timeout {} s. The job "
                      "file and its parameters travel as files; no shell parses them. With "
                      "`detach: true` the call returns the run id at once.",
                      names, k_all_targets, job.meta.timeout_s);
  return text;
}

std::string target_list(const std::vector<std::string>& targets)
{
  std::string names;
  for (const auto& target : targets) {
    names += target + ", ";
  }
  return names + std::string(k_all_targets);
}

std::string shown_value(const json& value)
{
  return shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), 60);
}

// `target` as a list: each a target of the server, once; they run in the server's order.
Expected<std::vector<std::string>> listed_targets(const json& given,
                                                  const std::vector<std::string>& targets)
{
  if (given.empty()) {
    return fail(ErrorKind::usage, "argument '{}' is an empty list; name at least one of {}",
                k_target_argument, fmt::join(targets, ", "));
  }
  std::vector<bool> picked(targets.size(), false);
  for (const auto& item : given) {
    const auto at = item.is_string() ? std::find(targets.begin(), targets.end(),
                                                 item.get_ref<const std::string&>())
                                     : targets.end();
    if (at == targets.end()) {
      return fail(ErrorKind::usage,
                  "argument '{}' lists {}, which is not a target; the targets "
                  "are {}",
                  k_target_argument, shown_value(item), fmt::join(targets, ", "));
    }
    const auto index = static_cast<std::size_t>(at - targets.begin());
    if (picked[index]) {
      return fail(ErrorKind::usage, "argument '{}' lists {} twice", k_target_argument,
                  shown_value(item));
    }
    picked[index] = true;
  }
  std::vector<std::string> chosen;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (picked[i]) {
      chosen.push_back(targets[i]);
    }
  }
  return chosen;
}

Expected<std::vector<std::string>> chosen_targets(const json& arguments,
                                                  const std::vector<std::string>& targets)
{
  const auto given = arguments.find(k_target_argument);
  if (given == arguments.end()) {
    if (targets.size() == 1) {
      return targets;
    }
    return fail(ErrorKind::usage, "argument '{}' is required: one of {}", k_target_argument,
                target_list(targets));
  }
  if (given->is_string() && *given == k_all_targets) {
    return targets;
  }
  if (given->is_string() &&
      std::find(targets.begin(), targets.end(), given->get<std::string>()) != targets.end()) {
    return std::vector<std::string>{given->get<std::string>()};
  }
  if (given->is_array()) {
    return listed_targets(*given, targets);
  }
  return fail(ErrorKind::usage, "argument '{}' must be one of {} or a list of targets, not {}",
              k_target_argument, target_list(targets), shown_value(*given));
}

} // namespace

std::optional<std::string> tool_refusal(const Job& job)
{
  if (!is_tool_name(job.name)) {
    return fmt::format("its name is not a valid MCP tool name (1 to 128 of [A-Za-z0-9_.-]); "
                       "rename the file");
  }
  if (is_run_tool(job.name)) {
    return fmt::format("ferry mcp has a tool of that name for detached runs; rename the file");
  }
  if (job.param(k_target_argument) != nullptr) {
    return fmt::format("it declares a parameter named '{}', which is the argument that picks the "
                       "target; rename the parameter",
                       k_target_argument);
  }
  if (job.param(k_detach_argument) != nullptr) {
    return fmt::format("it declares a parameter named '{}', which is the argument that detaches "
                       "the run; rename the parameter",
                       k_detach_argument);
  }
  return std::nullopt;
}

json input_schema(const Job& job, const std::vector<std::string>& targets)
{
  json properties = json::object();
  json required = json::array();
  for (const auto& spec : job.meta.params) {
    properties[spec.name] = param_schema(spec);
    if (spec.required && !spec.default_value) {
      required.push_back(spec.name);
    }
  }
  properties[std::string(k_target_argument)] = target_schema(targets);
  properties[std::string(k_detach_argument)] = {
      {"type", "boolean"},
      {"default", false},
      {"description", fmt::format("true: start the job, return its run id at once and leave it "
                                  "running; {} follow it by that id",
                                  run_tool_names())}};
  if (targets.size() != 1) {
    required.push_back(k_target_argument);
  }
  json schema = {{"type", "object"}, {"properties", properties}, {"additionalProperties", false}};
  if (!required.empty()) {
    schema["required"] = required;
  }
  return schema;
}

std::optional<json> output_schema(const Job& job)
{
  if (!job.meta.result_schema) {
    return std::nullopt;
  }
  json status = run_status_names();
  status.push_back("running"); // a detached run, just started
  json run = {{"type", "object"},
              {"properties",
               {{"target", {{"type", "string"}}},
                {"status", {{"type", "string"}, {"enum", status}}},
                {"exit_code", {{"type", {"integer", "null"}}}},
                {"run_id", {{"type", "string"}}},
                {"error", {{"type", {"string", "null"}}}},
                {"duration_s", {{"type", "number"}}},
                {"result", *job.meta.result_schema}}},
              {"required", {"target", "status", "exit_code", "run_id", "error", "duration_s"}}};
  return json{{"type", "object"},
              {"properties", {{"runs", {{"type", "array"}, {"items", run}}}}},
              {"required", {"runs"}}};
}

json tool_definition(const Job& job, const std::vector<std::string>& targets)
{
  json tool = {{"name", job.name},
               {"title", job.name},
               {"description", tool_description(job, targets)},
               {"inputSchema", input_schema(job, targets)}};
  if (auto schema = output_schema(job)) {
    tool["outputSchema"] = std::move(*schema);
  }
  return tool;
}

Expected<CallPlan> plan_call(const Job& job, const json& arguments,
                             const std::vector<std::string>& targets)
{
  if (!arguments.is_null() && !arguments.is_object()) {
    return fail(ErrorKind::usage, "{}: arguments must be a JSON object of parameters, not {}",
                job.name, arguments.type_name());
  }
  json given = arguments.is_null() ? json::object() : arguments;
  given.erase(std::string(k_target_argument));
  bool detach = false;
  if (const auto flag = given.find(k_detach_argument); flag != given.end()) {
    if (!flag->is_boolean()) {
      return fail(ErrorKind::usage, "{}: argument '{}' must be true or false, not {}", job.name,
                  k_detach_argument, shown_value(*flag));
    }
    detach = flag->get<bool>();
    given.erase(flag);
  }
  auto params = resolve_params(job, {}, given, "arguments");
  if (!params) {
    return fail(ErrorKind::usage, "{}: {}", job.name, params.error().message);
  }
  auto chosen = chosen_targets(arguments.is_null() ? json::object() : arguments, targets);
  if (!chosen) {
    return fail(ErrorKind::usage, "{}: {}", job.name, chosen.error().message);
  }
  return CallPlan{std::move(chosen).value(), std::move(params).value(), detach};
}

} // namespace ferry::mcp
