// The `/// ferry` block: TOML in comment lines, like PEP 723's inline script metadata.
#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>

#include <toml++/toml.h>

#include "ferry/job.hpp"
#include "ferry/json_diff.hpp"
#include "ferry/params.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/run_env.hpp"
#include "ferry/text.hpp"

namespace ferry {
namespace {

constexpr std::string_view k_block_example = "# /// ferry\n"
                                             "# description = \"what this job tells you\"\n"
                                             "# interpreter = \"python3\"\n"
                                             "# timeout = 60\n"
                                             "# ///";

struct Block {
  std::string toml;
  int first_line = 0; // 1-based line of the file where the TOML text starts
  // Per line of `toml`: the characters its file line has before it ("#" or "# "), so that a
  // column in the TOML is a column in the file.
  std::vector<int> prefix_chars;
};

// "# /// ferry" → "/// ferry"; nullopt when the line is not a comment.
std::optional<std::string_view> comment_body(std::string_view line)
{
  if (line.empty() || line.front() != '#') {
    return std::nullopt;
  }
  line.remove_prefix(1);
  if (!line.empty() && line.front() == ' ') {
    line.remove_prefix(1);
  }
  return line;
}

Expected<Block> find_block(std::string_view bytes, std::string_view label)
{
  const auto lines = split_lines(bytes);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto body = comment_body(lines[i]);
    if (!body || trim(*body) != "/// ferry") {
      continue;
    }
    Block block;
    block.first_line = static_cast<int>(i) + 2;
    for (std::size_t j = i + 1; j < lines.size(); ++j) {
      const auto inner = comment_body(lines[j]);
      if (!inner) {
        return fail(ErrorKind::usage,
                    "{}:{}: the `/// ferry` block that starts on line {} ends without its closing "
                    "`# ///` line; every line of the block must start with `#`",
                    label, j + 1, i + 1);
      }
      if (trim(*inner) == "///") {
        return block;
      }
      block.toml.append(*inner);
      block.toml.push_back('\n');
      block.prefix_chars.push_back(static_cast<int>(lines[j].size() - inner->size()));
    }
    return fail(ErrorKind::usage, "{}:{}: the `/// ferry` block has no closing `# ///` line", label,
                i + 1);
  }
  return fail(ErrorKind::usage,
              "{}: no `/// ferry` metadata block; add one at the top of the file, e.g.\n{}", label,
              k_block_example);
}

// TOML has inf and nan; JSON (and so params.json) does not.
bool has_non_finite(const toml::node& node)
{
  if (const auto* f = node.as_floating_point()) {
    return !std::isfinite(f->get());
  }
  if (const auto* a = node.as_array()) {
    return std::any_of(a->begin(), a->end(), [](const toml::node& n) { return has_non_finite(n); });
  }
  if (const auto* t = node.as_table()) {
    return std::any_of(t->begin(), t->end(),
                       [](const auto& kv) { return has_non_finite(kv.second); });
  }
  return false;
}

nlohmann::json to_json(const toml::node& node)
{
  if (const auto* t = node.as_table()) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& [key, value] : *t) {
      object[std::string(key.str())] = to_json(value);
    }
    return object;
  }
  if (const auto* a = node.as_array()) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& value : *a) {
      array.push_back(to_json(value));
    }
    return array;
  }
  if (const auto* s = node.as_string()) {
    return s->get();
  }
  if (const auto* i = node.as_integer()) {
    return i->get();
  }
  if (const auto* f = node.as_floating_point()) {
    return f->get();
  }
  if (const auto* b = node.as_boolean()) {
    return b->get();
  }
  // Dates and times have no JSON type; keep their TOML text.
  std::ostringstream text;
  node.visit([&](const auto& value) { text << value; });
  return text.str();
}

std::optional<ParamType> param_type_from(std::string_view name)
{
  if (name == "int")
    return ParamType::integer;
  if (name == "float")
    return ParamType::floating;
  if (name == "bool")
    return ParamType::boolean;
  if (name == "string")
    return ParamType::string;
  if (name == "list")
    return ParamType::list;
  if (name == "json")
    return ParamType::json;
  return std::nullopt;
}

// Where a metadata value sits, for error messages: "FILE:LINE: ...".
struct Source {
  std::string_view label;
  const Block& block;

  [[nodiscard]] int line(const toml::node& node) const
  {
    return block.first_line + static_cast<int>(node.source().begin.line) - 1;
  }

  template <typename... Args>
  [[nodiscard]] Unexpected<Error> refuse(const toml::node& at, fmt::format_string<Args...> format,
                                         Args&&... args) const
  {
    return fail(ErrorKind::usage, "{}:{}: {}", label, line(at),
                fmt::format(format, std::forward<Args>(args)...));
  }
};

bool is_param_name(std::string_view name)
{
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

Expected<void> set_param_type(ParamSpec& spec, std::string_view key, const toml::node& value,
                              const Source& source)
{
  const auto type_name = value.value<std::string>();
  const auto type = type_name ? param_type_from(*type_name) : std::nullopt;
  const bool scalar =
      type && *type != ParamType::list && *type != ParamType::json && *type != ParamType::boolean;
  if (!type || (key == "items" && !scalar)) {
    return source.refuse(value, "params.{}.{} must be one of {}", spec.name, key,
                         key == "type"
                             ? "\"int\", \"float\", \"bool\", \"string\", \"list\", \"json\""
                             : "\"int\", \"float\", \"string\"");
  }
  (key == "type" ? spec.type : spec.items) = *type;
  return {};
}

Expected<void> set_param_value(ParamSpec& spec, std::string_view key, const toml::node& value,
                               const Source& source)
{
  if (key == "choices" && !value.is_array()) {
    return source.refuse(value, "params.{}.choices must be an array", spec.name);
  }
  if (has_non_finite(value)) {
    return source.refuse(value,
                         "params.{}.{} holds inf or nan, which JSON cannot carry; use a finite "
                         "number",
                         spec.name, key);
  }
  (key == "default" ? spec.default_value : spec.choices) = to_json(value);
  return {};
}

// `pattern`: a regular expression (ECMAScript) that string values must match whole.
Expected<void> set_param_pattern(ParamSpec& spec, const toml::node& value, const Source& source)
{
  const auto pattern = value.value<std::string>();
  if (!pattern || pattern->empty()) {
    return source.refuse(value,
                         "params.{}.pattern must be a non-empty string, a regular "
                         "expression such as \"[A-Za-z0-9@._-]+\"",
                         spec.name);
  }
  try {
    std::regex compiled(*pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return source.refuse(value, "params.{}.pattern is not a regular expression: {}", spec.name,
                         e.what());
  }
  spec.pattern = *pattern;
  return {};
}

Expected<void> set_param_key(ParamSpec& spec, std::string_view key, const toml::node& value,
                             const Source& source)
{
  if (key == "type" || key == "items") {
    return set_param_type(spec, key, value, source);
  }
  if (key == "default" || key == "choices") {
    return set_param_value(spec, key, value, source);
  }
  if (key == "required") {
    const auto flag = value.value<bool>();
    if (!flag) {
      return source.refuse(value, "params.{}.required must be true or false", spec.name);
    }
    spec.required = *flag;
    return {};
  }
  if (key == "pattern") {
    return set_param_pattern(spec, value, source);
  }
  if (key == "program") {
    const auto flag = value.value_exact<bool>(); // 1 is not true here: a program is at stake
    if (!flag) {
      return source.refuse(value, "params.{}.program must be true or false", spec.name);
    }
    spec.program = *flag;
    return {};
  }
  if (key == "help") {
    const auto help = value.value<std::string>();
    if (!help) {
      return source.refuse(value, "params.{}.help must be a string", spec.name);
    }
    spec.help = *help;
    return {};
  }
  return source.refuse(value,
                       "params.{} has an unknown key '{}' (known: type, items, default, "
                       "required, choices, program, pattern, help)",
                       spec.name, key);
}

// A program a parameter may name: a plain name (what PATH finds), never a path or an option.
bool is_program_name(const nlohmann::json& choice)
{
  if (!choice.is_string()) {
    return false;
  }
  const std::string& name = choice.get_ref<const std::string&>();
  return !name.empty() && name.size() <= 64 && name.front() != '-' && name.front() != '.' &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
                  c == '+';
         });
}

// `program = true`: a string (or list of strings) with an allow-list of plain program names.
Expected<void> check_program_param(const ParamSpec& spec, const toml::node& at,
                                   const Source& source)
{
  const bool strings = spec.type == ParamType::string ||
                       (spec.type == ParamType::list && spec.items == ParamType::string);
  if (!strings) {
    return source.refuse(at,
                         "params.{}: a parameter that names programs (program = true) must "
                         "be a string or a list of strings",
                         spec.name);
  }
  if (!spec.choices || spec.choices->empty()) {
    return source.refuse(at,
                         "params.{}: a parameter that names programs (program = true) needs "
                         "choices, the programs it allows, e.g. choices = [\"python3\", "
                         "\"perl\"]",
                         spec.name);
  }
  for (const auto& choice : *spec.choices) {
    if (!is_program_name(choice)) {
      return source.refuse(
          at,
          "params.{}.choices: {} is not a plain program name; allow names "
          "that PATH finds ([A-Za-z0-9._+-], not starting with '-' or "
          "'.'), never a path",
          spec.name,
          shorten(choice.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 80));
    }
  }
  return {};
}

// Choices and the default must themselves be values the parameter accepts.
Expected<void> check_declared_values(ParamSpec& spec, const toml::node& at, const Source& source)
{
  if (spec.choices) {
    ParamSpec element = spec;
    element.choices.reset();
    if (spec.type == ParamType::list) {
      element.type = spec.items;
    }
    for (const auto& choice : *spec.choices) {
      if (auto checked = check_param_value(element, choice, "choices"); !checked) {
        return source.refuse(at, "{}", checked.error().message);
      }
    }
  }
  if (spec.default_value) {
    auto checked = check_param_value(spec, *spec.default_value, "its default");
    if (!checked) {
      return source.refuse(at, "{}", checked.error().message);
    }
    spec.default_value = std::move(checked).value();
  }
  return {};
}

Expected<ParamSpec> parse_param(const std::string& name, const toml::node& node,
                                const Source& source)
{
  const auto* table = node.as_table();
  if (table == nullptr) {
    return source.refuse(node, "params.{} must be a table ([params.{}])", name, name);
  }
  if (!is_param_name(name)) {
    return source.refuse(node, "parameter name '{}' may use only letters, digits, '_' and '-'",
                         name);
  }
  ParamSpec spec;
  spec.name = name;
  for (const auto& [key, value] : *table) {
    FERRY_TRY(set_param_key(spec, key.str(), value, source));
  }
  if (spec.program) {
    FERRY_TRY(check_program_param(spec, node, source));
  }
  const bool strings = spec.type == ParamType::string ||
                       (spec.type == ParamType::list && spec.items == ParamType::string);
  if (spec.pattern && !strings) {
    return source.refuse(node, "params.{}.pattern applies to a string or a list of strings",
                         spec.name);
  }
  FERRY_TRY(check_declared_values(spec, node, source));
  return spec;
}

Expected<void> set_params(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto* params = value.as_table();
  if (params == nullptr) {
    return source.refuse(value, "params must be a table of [params.NAME] tables");
  }
  for (const auto& [name, node] : *params) {
    FERRY_TRY_ASSIGN(auto spec, parse_param(std::string(name.str()), node, source));
    meta.params.push_back(std::move(spec));
  }
  // In the order the file declares them (toml++ keeps a table sorted by key).
  std::sort(meta.params.begin(), meta.params.end(), [&](const ParamSpec& a, const ParamSpec& b) {
    return source.line(*params->get(a.name)) < source.line(*params->get(b.name));
  });
  return {};
}

Expected<void> set_interpreter(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto interpreter = value.value<std::string>();
  if (!interpreter || !is_shell_neutral_token(*interpreter)) {
    return source.refuse(value,
                         "interpreter must be a program name or absolute path made only of "
                         "[A-Za-z0-9/._-] (got {}); put arguments in the job itself",
                         interpreter ? "'" + *interpreter + "'" : "a non-string");
  }
  meta.interpreter = *interpreter;
  return {};
}

Expected<void> set_timeout(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto timeout = value.value_exact<std::int64_t>(); // exact: no float-to-int conversion
  if (!timeout || *timeout <= 0 || *timeout > 7 * 24 * 3600) {
    return source.refuse(value, "timeout must be a whole number of seconds between 1 and 604800");
  }
  meta.timeout_s = static_cast<int>(*timeout);
  return {};
}

Expected<void> set_gpus(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto gpus = value.value_exact<std::int64_t>();
  if (!gpus || *gpus < 1 || *gpus > k_max_gpus) {
    return source.refuse(value, "gpus must be a whole number of GPUs between 1 and {}", k_max_gpus);
  }
  meta.gpus = static_cast<int>(*gpus);
  return {};
}

Expected<void> set_slurm(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto* table = value.as_table();
  if (table == nullptr) {
    return source.refuse(value, "slurm must be a table ([slurm])");
  }
  for (const auto& [key, option] : *table) {
    if (auto set = set_slurm_option(meta.slurm, key.str(), to_json(option)); !set) {
      return source.refuse(option, "{}", set.error().message);
    }
  }
  return {};
}

// A JSON Schema for the result: a table, so that it is a schema object (MCP requires one).
Expected<void> set_result_schema(JobMeta& meta, const toml::node& value, const Source& source)
{
  if (!value.is_table()) {
    return source.refuse(value, "result_schema must be a table (a JSON Schema object), e.g. "
                                "[result_schema] with type = \"object\"");
  }
  if (has_non_finite(value)) {
    return source.refuse(value, "result_schema holds inf or nan, which JSON cannot carry");
  }
  meta.result_schema = to_json(value);
  return {};
}

Expected<void> set_description(JobMeta& meta, const toml::node& value, const Source&)
{
  meta.description = value.value<std::string>().value_or("");
  return {};
}

Expected<void> set_result(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto mode = value.value<std::string>();
  if (!mode || (*mode != "required" && *mode != "optional")) {
    return source.refuse(value, "result must be \"required\" (the default) or \"optional\"");
  }
  meta.result_required = *mode == "required";
  return {};
}

// `[env]`: NAME = "value" pairs, each checked like `--env`.
Expected<void> set_env(JobMeta& meta, const toml::node& value, const Source& source)
{
  const auto* table = value.as_table();
  if (table == nullptr) {
    return source.refuse(value, "env must be a table of NAME = \"value\" ([env])");
  }
  for (const auto& [key, item] : *table) {
    const auto text = item.value_exact<std::string>();
    const std::string where = fmt::format("{}:{}: env", source.label, source.line(item));
    if (!text) {
      return source.refuse(item, "env.{} must be a string (quote numbers: {} = \"1\")",
                           terminal_safe(key.str()), terminal_safe(key.str()));
    }
    FERRY_TRY(check_env_var(key.str(), *text, where));
    meta.env[std::string(key.str())] = *text;
  }
  return {};
}

// `files` and `outputs`: lists of globs relative to a directory (checked lexically here; matched
// when the job runs).
Expected<void> set_glob_list(std::vector<std::string>& into, std::string_view key,
                             const toml::node& value, const Source& source)
{
  const auto* array = value.as_array();
  if (array == nullptr) {
    return source.refuse(value,
                         "{} must be a list of relative paths or globs, e.g. "
                         "[\"helpers.py\", \"data/*.csv\"]",
                         key);
  }
  for (const auto& item : *array) {
    const auto text = item.value<std::string>();
    if (!text) {
      return source.refuse(item, "{} entries must be strings", key);
    }
    if (auto checked = glob_segments(*text, fmt::format("{} entry \"{}\"", key, *text)); !checked) {
      return source.refuse(item, "{}", checked.error().message);
    }
    into.push_back(*text);
  }
  return {};
}

// A list of JSON Pointers into the result (`volatile`, `summary`), each checked.
Expected<void> set_pointer_list(std::vector<std::string>& pointers, std::string_view key,
                                std::string_view example, const toml::node& value,
                                const Source& source)
{
  const auto* list = value.as_array();
  if (list == nullptr) {
    return source.refuse(value, "{} must be a list of JSON Pointers into the result, e.g. {}", key,
                         example);
  }
  for (const auto& item : *list) {
    const auto pointer = item.value<std::string>();
    if (!pointer || !is_json_pointer(*pointer)) {
      return source.refuse(item,
                           "{}: {} is not a JSON Pointer; each entry is \"\" (the whole "
                           "result) or starts with '/', with '~' only as ~0 or ~1",
                           key, pointer ? "'" + *pointer + "'" : "a non-string entry");
    }
    pointers.push_back(*pointer);
  }
  return {};
}

Expected<void> set_volatile(JobMeta& meta, const toml::node& value, const Source& source)
{
  return set_pointer_list(meta.volatile_pointers, "volatile", "[\"/cwd\", \"/hostname\"]", value,
                          source);
}

Expected<void> set_summary(JobMeta& meta, const toml::node& value, const Source& source)
{
  return set_pointer_list(meta.summary, "summary", "[\"/tp\", \"/kv/*/max_tokens\"]", value,
                          source);
}

Expected<void> set_files(JobMeta& meta, const toml::node& value, const Source& source)
{
  return set_glob_list(meta.files, "files", value, source);
}

Expected<void> set_outputs(JobMeta& meta, const toml::node& value, const Source& source)
{
  return set_glob_list(meta.outputs, "outputs", value, source);
}

// The keys of the `/// ferry` block, each with what reads it.
using MetaSetter = Expected<void> (*)(JobMeta&, const toml::node&, const Source&);
constexpr std::pair<std::string_view, MetaSetter> k_meta_keys[] = {
    {"description", set_description},
    {"interpreter", set_interpreter},
    {"timeout", set_timeout},
    {"result", set_result},
    {"result_schema", set_result_schema},
    {"params", set_params},
    {"env", set_env},
    {"volatile", set_volatile},
    {"summary", set_summary},
    {"files", set_files},
    {"outputs", set_outputs},
    {"slurm", set_slurm},
    {"gpus", set_gpus},
};

Expected<void> set_meta_key(JobMeta& meta, std::string_view key, const toml::node& value,
                            const Source& source)
{
  for (const auto& [name, setter] : k_meta_keys) {
    if (name == key) {
      return setter(meta, value, source);
    }
  }
  std::string known;
  for (const auto& [name, setter] : k_meta_keys) {
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  return source.refuse(value, "unknown key '{}' in the `/// ferry` block (known: {})", key, known);
}

} // namespace

std::string_view to_string(ParamType type)
{
  switch (type) {
  case ParamType::integer:
    return "int";
  case ParamType::floating:
    return "float";
  case ParamType::boolean:
    return "bool";
  case ParamType::string:
    return "string";
  case ParamType::list:
    return "list";
  case ParamType::json:
    return "json";
  }
  return "?";
}

bool has_job_block(std::string_view bytes)
{
  const auto lines = split_lines(bytes);
  return std::any_of(lines.begin(), lines.end(), [](std::string_view line) {
    const auto body = comment_body(line);
    return body && trim(*body) == "/// ferry";
  });
}

Expected<JobMeta> parse_job_meta(std::string_view bytes, std::string_view label)
{
  FERRY_TRY_ASSIGN(const auto block, find_block(bytes, label));
  toml::table table;
  try {
    table = toml::parse(block.toml, std::string(label));
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    const std::size_t index = at.line > 0 ? at.line - 1 : 0;
    const int prefix = index < block.prefix_chars.size() ? block.prefix_chars[index] : 0;
    return fail(ErrorKind::usage, "{}:{}:{}: invalid TOML in the `/// ferry` block: {}", label,
                block.first_line + static_cast<int>(index), static_cast<int>(at.column) + prefix,
                e.description());
  }
  const Source source{label, block};
  JobMeta meta;
  for (const auto& [key, value] : table) {
    FERRY_TRY(set_meta_key(meta, key.str(), value, source));
  }
  if (meta.interpreter.empty()) {
    return fail(ErrorKind::usage,
                "{}: the `/// ferry` block does not say which interpreter runs the job; add e.g. "
                "`# interpreter = \"python3\"`",
                label);
  }
  return meta;
}

const ParamSpec* Job::param(std::string_view wanted) const
{
  for (const auto& spec : meta.params) {
    if (spec.name == wanted) {
      return &spec;
    }
  }
  return nullptr;
}

Expected<Job> parse_job(std::string name, std::string file_name, std::string source,
                        std::string bytes)
{
  const std::string label = source == "built-in" ? "built-in job " + file_name : source;
  FERRY_TRY_ASSIGN(auto meta, parse_job_meta(bytes, label));
  return Job{std::move(name),  std::move(source), std::move(file_name),
             std::move(bytes), std::move(meta),   {}};
}

} // namespace ferry
