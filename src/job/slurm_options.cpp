// Checking and combining Slurm options. Names are fixed (an allow-list) and values match strict
// character classes, so nothing a user or a job writes can become an option ferry did not mean
// (an --output that hides the launcher's files, a --wrap, an --export of LD_PRELOAD).
#include "ferry/slurm_options.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace ferry {

namespace {

constexpr std::string_view k_name_chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_.-";
constexpr std::string_view k_gres_name_chars =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    "0123456789_";
// Values of --slurm-arg: node lists (n[1-4]), memory sizes (64G), constraints (a100&nvlink is
// refused: & and | would be harmless here, but nobody needs them to be).
constexpr std::string_view k_arg_value_chars =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    "0123456789_.,:+@/[]-";
constexpr std::size_t k_max_value = 256;

bool only(std::string_view value, std::string_view allowed)
{
  return !value.empty() && value.size() <= k_max_value &&
         value.find_first_not_of(allowed) == std::string_view::npos;
}

bool is_digits(std::string_view text)
{
  return !text.empty() && text.size() <= 6 &&
         text.find_first_not_of("0123456789") == std::string_view::npos;
}

std::vector<std::string_view> split_list(std::string_view text, char separator)
{
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const auto at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) {
      return parts;
    }
    start = at + 1;
  }
}

// One gres item: NAME[:TYPE][:COUNT], NAME a letter then letters, digits or '_'.
bool is_gres_item(std::string_view item)
{
  const auto parts = split_list(item, ':');
  if (parts.size() > 3 || parts[0].empty() || !std::isalpha(static_cast<unsigned char>(item[0])) ||
      parts[0].find_first_not_of(k_gres_name_chars) != std::string_view::npos) {
    return false;
  }
  return std::all_of(parts.begin() + 1, parts.end(),
                     [](std::string_view part) { return only(part, k_name_chars); });
}

enum class Takes { nothing, value, maybe };

struct AllowedArg {
  std::string_view name;
  Takes takes;
};

// The sbatch options --slurm-arg may carry: what a job needs from the scheduler. Anything that
// changes where output goes, what runs, who runs it or whether it waits is left out.
constexpr std::array k_allowed_args = {
    AllowedArg{"qos", Takes::value},
    AllowedArg{"constraint", Takes::value},
    AllowedArg{"prefer", Takes::value},
    AllowedArg{"mem", Takes::value},
    AllowedArg{"mem-per-cpu", Takes::value},
    AllowedArg{"mem-per-gpu", Takes::value},
    AllowedArg{"cpus-per-task", Takes::value},
    AllowedArg{"cpus-per-gpu", Takes::value},
    AllowedArg{"gpus-per-node", Takes::value},
    AllowedArg{"gpus-per-task", Takes::value},
    AllowedArg{"gres-flags", Takes::value},
    AllowedArg{"gpu-bind", Takes::value},
    AllowedArg{"gpu-freq", Takes::value},
    AllowedArg{"cpu-freq", Takes::value},
    AllowedArg{"reservation", Takes::value},
    AllowedArg{"nodelist", Takes::value},
    AllowedArg{"exclude", Takes::value},
    AllowedArg{"licenses", Takes::value},
    AllowedArg{"wckey", Takes::value},
    AllowedArg{"tmp", Takes::value},
    AllowedArg{"mincpus", Takes::value},
    AllowedArg{"hint", Takes::value},
    AllowedArg{"sockets-per-node", Takes::value},
    AllowedArg{"cores-per-socket", Takes::value},
    AllowedArg{"threads-per-core", Takes::value},
    AllowedArg{"time-min", Takes::value},
    AllowedArg{"nice", Takes::value},
    AllowedArg{"comment", Takes::value},
    AllowedArg{"exclusive", Takes::maybe},
    AllowedArg{"contiguous", Takes::nothing},
    AllowedArg{"no-requeue", Takes::nothing},
    AllowedArg{"oversubscribe", Takes::nothing},
    AllowedArg{"spread-job", Takes::nothing},
    AllowedArg{"use-min-nodes", Takes::nothing},
};

// Options with a flag of their own: --slurm-arg names them to a better place.
constexpr std::array<std::pair<std::string_view, std::string_view>, 9> k_own_flags = {{
    {"partition", "--partition"},
    {"gres", "--gres"},
    {"gpus", "--gpus"},
    {"time", "--time"},
    {"account", "--account"},
    {"nodes", "--nodes"},
    {"p", "--partition"},
    {"t", "--time"},
    {"N", "--nodes"},
}};

std::string allowed_arg_names()
{
  std::string names;
  for (const auto& allowed : k_allowed_args) {
    names += (names.empty() ? "" : ", ") + std::string(allowed.name);
  }
  return names;
}

std::string_view arg_name(std::string_view arg)
{
  arg.remove_prefix(std::min<std::size_t>(2, arg.size()));
  return arg.substr(0, arg.find('='));
}

Expected<std::string> string_value(const nlohmann::json& value, std::string_view key)
{
  if (!value.is_string()) {
    return fail(ErrorKind::usage, "slurm.{} must be a string", key);
  }
  return value.get<std::string>();
}

Expected<long long> integer_value(const nlohmann::json& value, std::string_view key)
{
  if (!value.is_number_integer()) {
    return fail(ErrorKind::usage, "slurm.{} must be a whole number", key);
  }
  return value.get<long long>();
}

Expected<std::vector<std::string>> args_value(const nlohmann::json& value)
{
  if (!value.is_array()) {
    return fail(ErrorKind::usage, "slurm.args must be an array of strings like \"--qos=high\"");
  }
  std::vector<std::string> args;
  for (const auto& item : value) {
    if (!item.is_string()) {
      return fail(ErrorKind::usage, "slurm.args must be an array of strings like \"--qos=high\"");
    }
    FERRY_TRY_ASSIGN(auto arg, check_slurm_arg(item.get<std::string>(), "slurm.args"));
    args.push_back(std::move(arg));
  }
  return args;
}

Expected<void> set_text_option(SlurmOptions& options, std::string_view key,
                               const nlohmann::json& value)
{
  FERRY_TRY_ASSIGN(const auto text, value.is_number_integer() && key == "gpus"
                                        ? Expected<std::string>(std::to_string(value.get<long>()))
                                        : string_value(value, key));
  const std::string what = "slurm." + std::string(key);
  if (key == "partition") {
    FERRY_TRY_ASSIGN(options.partition, check_slurm_partition(text, what));
  } else if (key == "gres") {
    FERRY_TRY_ASSIGN(options.gres, check_slurm_gres(text, what));
  } else if (key == "gpus") {
    FERRY_TRY_ASSIGN(options.gpus, check_slurm_gpus(text, what));
  } else {
    FERRY_TRY_ASSIGN(options.account, check_slurm_account(text, what));
  }
  if (options.gres && options.gpus) {
    return fail(ErrorKind::usage,
                "slurm.gres and slurm.gpus exclude each other: ask for GPUs per node with gres "
                "(\"gpu:8\") or for the whole job with gpus");
  }
  return {};
}

} // namespace

bool SlurmOptions::empty() const
{
  return !partition && !gres && !gpus && !time_min && !account && !nodes && args.empty();
}

Expected<std::string> check_slurm_partition(std::string_view value, std::string_view what)
{
  const auto names = split_list(value, ',');
  if (std::all_of(names.begin(), names.end(),
                  [](std::string_view name) { return only(name, k_name_chars); })) {
    return std::string(value);
  }
  return fail(ErrorKind::usage,
              "{} '{}': a partition name is made of letters, digits, '_', '.' and '-' (several "
              "separated by commas)",
              what, value);
}

Expected<std::string> check_slurm_gres(std::string_view value, std::string_view what)
{
  const auto items = split_list(value, ',');
  if (value.size() <= k_max_value && std::all_of(items.begin(), items.end(), is_gres_item)) {
    return std::string(value);
  }
  return fail(ErrorKind::usage,
              "{} '{}': give NAME[:TYPE][:COUNT] per node, e.g. gpu:8 or gpu:a100:2 (several "
              "separated by commas)",
              what, value);
}

Expected<std::string> check_slurm_gpus(std::string_view value, std::string_view what)
{
  const auto colon = value.rfind(':');
  const bool typed = colon != std::string_view::npos;
  const std::string_view count = typed ? value.substr(colon + 1) : value;
  if (is_digits(count) && count.find_first_not_of('0') != std::string_view::npos &&
      (!typed || only(value.substr(0, colon), k_name_chars))) {
    return std::string(value);
  }
  return fail(ErrorKind::usage,
              "{} '{}': give the number of GPUs for the whole job, N or TYPE:N (e.g. 8 or "
              "a100:8); for GPUs per node use --gres gpu:N",
              what, value);
}

Expected<std::string> check_slurm_account(std::string_view value, std::string_view what)
{
  if (only(value, k_name_chars)) {
    return std::string(value);
  }
  return fail(ErrorKind::usage,
              "{} '{}': an account name is made of letters, digits, '_', '.' "
              "and '-'",
              what, value);
}

Expected<int> check_slurm_time(long long minutes, std::string_view what)
{
  if (minutes < 1 || minutes > k_slurm_max_time_min) {
    return fail(ErrorKind::usage, "{} {}: give whole minutes between 1 and {}", what, minutes,
                k_slurm_max_time_min);
  }
  return static_cast<int>(minutes);
}

Expected<int> check_slurm_nodes(long long nodes, std::string_view what)
{
  if (nodes < 1 || nodes > k_slurm_max_nodes) {
    return fail(ErrorKind::usage, "{} {}: give a number of nodes between 1 and {}", what, nodes,
                k_slurm_max_nodes);
  }
  return static_cast<int>(nodes);
}

Expected<std::string> check_slurm_arg(std::string_view arg, std::string_view what)
{
  const std::string_view name = arg_name(arg);
  if (arg.substr(0, 2) != "--" || name.empty()) {
    return fail(ErrorKind::usage,
                "{} '{}': give one sbatch option in its long form, --NAME or --NAME=VALUE (e.g. "
                "--qos=high)",
                what, arg);
  }
  for (const auto& [own, flag] : k_own_flags) {
    if (name == own) {
      return fail(ErrorKind::usage, "{} '{}': use ferry's own {} option for this", what, arg, flag);
    }
  }
  const auto allowed = std::find_if(k_allowed_args.begin(), k_allowed_args.end(),
                                    [&](const AllowedArg& a) { return a.name == name; });
  if (allowed == k_allowed_args.end()) {
    return fail(ErrorKind::usage, "{} '{}': ferry does not pass --{} to sbatch; allowed: {}", what,
                arg, name, allowed_arg_names());
  }
  const bool has_value = arg.size() > 2 + name.size();
  const std::string_view value = has_value ? arg.substr(3 + name.size()) : std::string_view();
  if ((allowed->takes == Takes::value && !has_value) ||
      (allowed->takes == Takes::nothing && has_value)) {
    return fail(ErrorKind::usage, "{} '{}': --{} {}", what, arg, name,
                allowed->takes == Takes::value ? "needs a value (--NAME=VALUE)" : "takes no value");
  }
  if (has_value && !only(value, k_arg_value_chars)) {
    return fail(ErrorKind::usage,
                "{} '{}': the value may use only letters, digits and _ . , : + @ / [ ] - (at most "
                "{} characters)",
                what, arg, k_max_value);
  }
  return std::string(arg);
}

Expected<void> set_slurm_option(SlurmOptions& options, std::string_view key,
                                const nlohmann::json& value)
{
  if (key == "partition" || key == "gres" || key == "gpus" || key == "account") {
    return set_text_option(options, key, value);
  }
  if (key == "time") {
    FERRY_TRY_ASSIGN(const auto minutes, integer_value(value, key));
    FERRY_TRY_ASSIGN(options.time_min, check_slurm_time(minutes, "slurm.time"));
    return {};
  }
  if (key == "nodes") {
    FERRY_TRY_ASSIGN(const auto nodes, integer_value(value, key));
    FERRY_TRY_ASSIGN(options.nodes, check_slurm_nodes(nodes, "slurm.nodes"));
    return {};
  }
  if (key == "args") {
    FERRY_TRY_ASSIGN(options.args, args_value(value));
    return {};
  }
  return fail(ErrorKind::usage,
              "unknown key '{}' in the [slurm] table (known: partition, gres, gpus, time, "
              "account, nodes, args)",
              key);
}

SlurmOptions merge_slurm_options(const SlurmOptions& high, const SlurmOptions& low)
{
  SlurmOptions merged = high;
  merged.partition = high.partition ? high.partition : low.partition;
  if (!high.gres && !high.gpus) {
    merged.gres = low.gres;
    merged.gpus = low.gpus;
  }
  merged.time_min = high.time_min ? high.time_min : low.time_min;
  merged.account = high.account ? high.account : low.account;
  merged.nodes = high.nodes ? high.nodes : low.nodes;
  for (const auto& arg : low.args) {
    const bool overridden = std::any_of(high.args.begin(), high.args.end(), [&](const auto& h) {
      return arg_name(h) == arg_name(arg);
    });
    if (!overridden) {
      merged.args.push_back(arg);
    }
  }
  return merged;
}

nlohmann::json slurm_options_json(const SlurmOptions& options)
{
  nlohmann::json json = nlohmann::json::object();
  const auto put = [&](std::string_view key, const auto& field) {
    if (field) {
      json[std::string(key)] = *field;
    }
  };
  put("partition", options.partition);
  put("gres", options.gres);
  put("gpus", options.gpus);
  put("time", options.time_min);
  put("account", options.account);
  put("nodes", options.nodes);
  if (!options.args.empty()) {
    json["args"] = options.args;
  }
  return json;
}

Expected<SlurmOptions> slurm_options_from_json(const nlohmann::json& json)
{
  if (!json.is_object()) {
    return fail(ErrorKind::usage, "the archived Slurm options are not an object");
  }
  SlurmOptions options;
  for (const auto& [key, value] : json.items()) {
    FERRY_TRY(set_slurm_option(options, key, value));
  }
  return options;
}

std::vector<std::string> sbatch_options(const SlurmOptions& options)
{
  std::vector<std::string> args;
  const auto add = [&](std::string_view flag, const auto& field) {
    if (field) {
      args.push_back(fmt::format("--{}={}", flag, *field));
    }
  };
  add("partition", options.partition);
  add("gres", options.gres);
  add("gpus", options.gpus);
  add("time", options.time_min);
  add("account", options.account);
  add("nodes", options.nodes);
  args.insert(args.end(), options.args.begin(), options.args.end());
  return args;
}

int slurm_minutes_for(int timeout_s, int grace_s)
{
  // The launcher stops the job at its timeout and kills it `grace` later; Slurm's limit comes
  // after both, so a job ferry times out is never Slurm's TIMEOUT.
  constexpr int margin_s = 15;
  const long long seconds = static_cast<long long>(timeout_s) + grace_s + margin_s;
  return static_cast<int>(std::clamp<long long>((seconds + 59) / 60, 1, k_slurm_max_time_min));
}

} // namespace ferry
