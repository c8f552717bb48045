// Shell completion: `ferry completion bash|zsh|fish` prints a small script, and that script asks
// `ferry __complete -- WORDS…` for the candidates. Everything it offers comes from the command
// line's own definitions (commands, options) and from what ferry knows (jobs, parameters,
// choices, hosts, runs), so the three shells complete alike and never go stale.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <glob.h>

#include "cli/completion_scripts.hpp"
#include "cli/targets.hpp"
#include "ferry/archive.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

namespace fs = std::filesystem;

// What each option value or positional argument stands for (by the option's long name or the
// positional's name, wherever the option is defined).
const std::map<std::string, CompletionKind, std::less<>>& kinds_by_name()
{
  static const std::map<std::string, CompletionKind, std::less<>> kinds = {
      {"param", {ValueKind::param, {}}},
      {"sweep", {ValueKind::param, {}}},
      {"env", {ValueKind::free_text, {}}},
      {"interpreter", {ValueKind::free_text, {}}},
      {"params", {ValueKind::file_or_stdin, {}}},
      {"host", {ValueKind::host, {}}},
      {"from-host", {ValueKind::host, {}}},
      {"slurm", {ValueKind::host, {}}}, // the login node, reached as a --host is
      {"hosts-file", {ValueKind::file_or_stdin, {}}},
      {"identity", {ValueKind::file, {}}},
      {"known-hosts", {ValueKind::file, {}}},
      {"ssh-config", {ValueKind::file, {}}},
      {"archive", {ValueKind::file, {}}},
      {"jobs-dir", {ValueKind::dir, {}}},
      {"dir", {ValueKind::dir, {}}},
      {"jobs", {ValueKind::dir, {}}},
      {"job", {ValueKind::job, {}}},
      {"lang", {ValueKind::choice, {"python", "sh"}}},
      {"file", {ValueKind::file, {}}},
      {"out", {ValueKind::dir, {}}},
      {"to", {ValueKind::dir, {}}},
      {"status", {ValueKind::choice, run_status_names()}},
      // Values nothing can be offered for: numbers, times, paths on the host.
      {"timeout", {ValueKind::free_text, {}}},
      {"parallel", {ValueKind::free_text, {}}},
      {"output-cap", {ValueKind::free_text, {}}},
      {"connect-timeout", {ValueKind::free_text, {}}},
      {"retries", {ValueKind::free_text, {}}},
      {"persist", {ValueKind::free_text, {}}},
      {"remote-base", {ValueKind::free_text, {}}},
      {"since", {ValueKind::free_text, {}}},
      {"invocation", {ValueKind::free_text, {}}}, // last, or an id
      {"retry-failed", {ValueKind::free_text, {}}},
      {"ignore", {ValueKind::free_text, {}}},
      {"limit", {ValueKind::free_text, {}}},
      {"older-than", {ValueKind::free_text, {}}},
      {"keep-last", {ValueKind::free_text, {}}},
      {"max-size", {ValueKind::free_text, {}}},
      {"fetch", {ValueKind::free_text, {}}},
      {"max-upload", {ValueKind::free_text, {}}},
      {"archive-outputs-max", {ValueKind::free_text, {}}},
      {"wait-gpus", {ValueKind::free_text, {}}},
      {"keep-for", {ValueKind::free_text, {}}},
      // Slurm's options: the cluster's own names, which ferry cannot know without asking it.
      {"partition", {ValueKind::free_text, {}}},
      {"gres", {ValueKind::free_text, {}}},
      {"gpus", {ValueKind::free_text, {}}},
      {"time", {ValueKind::free_text, {}}},
      {"account", {ValueKind::free_text, {}}},
      {"nodes", {ValueKind::free_text, {}}},
      {"slurm-arg", {ValueKind::free_text, {}}},
      // Positionals.
      {"JOB", {ValueKind::job, {}}},
      {"RUN", {ValueKind::run, {}}},
      {"DIR", {ValueKind::dir, {}}},
      {"COMMAND", {ValueKind::command, {}}},
      {"SHELL", {ValueKind::choice, {"bash", "zsh", "fish"}}},
      {"NAME", {ValueKind::free_text, {}}},
  };
  return kinds;
}

struct Candidate {
  std::string word;
  std::string description;
};

struct Answer {
  std::vector<Candidate> candidates;
  std::string directive = "plain"; // or "files PREFIX" / "dirs PREFIX": the shell lists files

  void add(std::string word, std::string description = {})
  {
    candidates.push_back({std::move(word), std::move(description)});
  }
};

// What the words before the one being completed say.
struct Line {
  const CLI::App* command = nullptr;
  std::vector<std::string> positionals;
  const CLI::Option* pending = nullptr; // an option still waiting for its value
  bool after_dashes = false;
  std::vector<std::string> jobs_dirs;
  std::vector<std::string> hosts_files;
  std::string archive;
  std::string ssh_config;
};

const CLI::Option* find_flag(const CLI::App& app, const CLI::App* command, const std::string& flag)
{
  if (command != nullptr) {
    if (const auto* option = command->get_option_no_throw(flag)) {
      return option;
    }
  }
  return app.get_option_no_throw(flag);
}

bool has_long_name(const CLI::Option& option, std::string_view name)
{
  const auto& names = option.get_lnames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

void note_value(Line& line, const CLI::Option& option, const std::string& value)
{
  if (has_long_name(option, "jobs-dir")) {
    line.jobs_dirs.push_back(value);
  } else if (has_long_name(option, "hosts-file")) {
    line.hosts_files.push_back(value);
  } else if (has_long_name(option, "archive")) {
    line.archive = value;
  } else if (has_long_name(option, "ssh-config")) {
    line.ssh_config = value;
  }
}

void read_option(const CLI::App& app, Line& line, const std::string& word)
{
  const bool long_form = word.starts_with("--");
  const auto eq = word.find('=');
  const std::string flag = long_form ? word.substr(0, eq) : word.substr(0, 2);
  const auto* option = find_flag(app, line.command, flag);
  if (option == nullptr || !takes_value(*option)) {
    return;
  }
  if (long_form ? eq == std::string::npos : word.size() == 2) {
    line.pending = option;
  } else {
    note_value(line, *option, long_form ? word.substr(eq + 1) : word.substr(2));
  }
}

Line read_line(const CLI::App& app, std::span<const std::string> words)
{
  Line line;
  for (const auto& word : words) {
    if (line.pending != nullptr) {
      note_value(line, *std::exchange(line.pending, nullptr), word);
    } else if (!line.after_dashes && word == "--") {
      line.after_dashes = true;
    } else if (!line.after_dashes && word.size() > 1 && word.front() == '-') {
      read_option(app, line, word);
    } else if (line.command == nullptr) {
      line.command = find_command(app, word);
    } else {
      line.positionals.push_back(word);
    }
  }
  return line;
}

JobPath job_path_of(const Line& line)
{
  return JobPath::from_environment(line.jobs_dirs);
}

// Words and descriptions travel one per line, tab-separated: nothing else may be in them.
std::string one_line(std::string_view text)
{
  std::string safe = terminal_safe(text);
  std::replace(safe.begin(), safe.end(), '\t', ' ');
  return safe;
}

void job_candidates(const Line& line, Answer& answer)
{
  for (const auto& job : list_jobs(job_path_of(line))) {
    answer.add(job.name, job.description);
  }
}

void run_candidates(const Line& line, Answer& answer)
{
  answer.add("last", "the newest run");
  auto archive = Archive::open_read_only(line.archive.empty() ? Archive::default_path()
                                                              : fs::path(line.archive));
  if (!archive || !archive->exists()) {
    return;
  }
  LogFilter filter;
  filter.limit = 100;
  filter.with_output = false;
  const auto runs = archive->log(filter);
  for (const auto& run : runs ? *runs : std::vector<RunRecord>()) {
    answer.add(run.run_id, fmt::format("{} @ {}, {}", run.job, run.target.value("host", "local"),
                                       to_string(run.status)));
  }
}

std::string choice_text(const nlohmann::json& choice)
{
  return choice.is_string() ? choice.get<std::string>() : choice.dump();
}

// `-p KEY=VALUE`: the parameters of the jobs named so far, then the choices of one.
void param_candidates(const Line& line, const std::string& text, Answer& answer)
{
  std::vector<Job> jobs;
  for (const auto& spec : line.positionals) {
    if (auto job = find_job(spec, job_path_of(line))) {
      jobs.push_back(std::move(job).value());
    }
  }
  const auto eq = text.find('=');
  for (const auto& job : jobs) {
    for (const auto& spec : job.meta.params) {
      if (eq == std::string::npos) {
        answer.add(spec.name + "=", fmt::format("{}: {}", to_string(spec.type), spec.help));
      }
    }
  }
  if (eq == std::string::npos) {
    return;
  }
  const std::string key = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  if (value.starts_with('@')) {
    answer.directive = "files " + key + "=@";
    return;
  }
  const ParamSpec* spec = nullptr;
  for (const auto& job : jobs) {
    spec = spec != nullptr ? spec : job.param(key);
  }
  if (spec == nullptr) {
    return;
  }
  // A list takes its elements one after another, comma-separated.
  const std::string head =
      spec->type == ParamType::list ? value.substr(0, value.rfind(',') + 1) : std::string();
  const nlohmann::json choices = spec->choices                      ? *spec->choices
                                 : spec->type == ParamType::boolean ? nlohmann::json{true, false}
                                                                    : nlohmann::json::array();
  for (const auto& choice : choices) {
    answer.add(key + "=" + head + choice_text(choice));
  }
}

std::string expand_home(const std::string& path)
{
  return path.starts_with("~/") ? home_dir() + path.substr(1) : path;
}

void ssh_config_hosts(const fs::path& file, int depth, std::vector<std::string>& hosts);

// `Include PATTERN`: relative to ~/.ssh in a user's config, to /etc/ssh in the system's.
void included_hosts(const fs::path& from, std::string pattern, int depth,
                    std::vector<std::string>& hosts)
{
  pattern = expand_home(pattern);
  if (pattern.front() != '/') {
    const bool system = from.string().starts_with("/etc/ssh/");
    pattern = (system ? std::string("/etc/ssh/") : home_dir() + "/.ssh/") + pattern;
  }
  glob_t matches{};
  if (::glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
    for (std::size_t i = 0; i < matches.gl_pathc; ++i) {
      ssh_config_hosts(matches.gl_pathv[i], depth + 1, hosts);
    }
  }
  ::globfree(&matches);
}

// `Host` names of an ssh config (patterns left out), following `Include`.
void ssh_config_hosts(const fs::path& file, int depth, std::vector<std::string>& hosts)
{
  std::ifstream in(file);
  std::string raw;
  while (depth < 8 && std::getline(in, raw)) {
    const std::string line(trim(raw));
    const auto end = line.find_first_of(" \t=");
    if (line.empty() || line.front() == '#' || end == std::string::npos) {
      continue;
    }
    std::string keyword = line.substr(0, end);
    std::transform(keyword.begin(), keyword.end(), keyword.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::istringstream values(line.substr(line.find_first_not_of(" \t=", end)));
    for (std::string value; values >> value;) {
      if (keyword == "include") {
        included_hosts(file, value, depth, hosts);
      } else if (keyword == "host" && value.find_first_of("*?!") == std::string::npos) {
        hosts.push_back(value);
      }
    }
  }
}

// Hosts from the hosts files on the line, the config file's @groups and the ssh config;
// `host1,ho` completes the last one.
void host_candidates(const Line& line, const std::string& text, Answer& answer)
{
  const auto loaded = load_user_config(default_user_config_path());
  const UserConfig config = loaded ? *loaded : UserConfig{}; // its mistakes show when it runs
  std::vector<std::string> hosts;
  for (const auto& file : line.hosts_files) {
    if (file == "-") {
      continue; // standard input is the user's terminal here, not a hosts file
    }
    TargetOptions target;
    target.hosts_file = expand_home(file);
    if (auto listed = target_hosts(target, config)) {
      hosts.insert(hosts.end(), listed->begin(), listed->end());
    }
  }
  for (const auto& [name, entries] : config.groups) {
    hosts.push_back("@" + name);
  }
  if (!line.ssh_config.empty()) {
    ssh_config_hosts(expand_home(line.ssh_config), 0, hosts);
  } else {
    ssh_config_hosts(home_dir() + "/.ssh/config", 0, hosts);
    ssh_config_hosts("/etc/ssh/ssh_config", 0, hosts);
  }
  if (line.command != nullptr && line.command->get_name() == "log") {
    hosts.emplace_back("local");
  }
  const std::string head = text.substr(0, text.rfind(',') + 1);
  for (const auto& host : hosts) {
    answer.add(head + host);
  }
}

void command_candidates(const CLI::App& app, Answer& answer)
{
  for (const auto* command : visible_commands(app)) {
    answer.add(command->get_name(), command->get_description());
  }
}

void value_candidates(const CLI::App& app, const CompletionKind& kind, const Line& line,
                      const std::string& text, Answer& answer)
{
  switch (kind.kind) {
  case ValueKind::job:
    return job_candidates(line, answer);
  case ValueKind::run:
    return run_candidates(line, answer);
  case ValueKind::param:
    return param_candidates(line, text, answer);
  case ValueKind::host:
    return host_candidates(line, text, answer);
  case ValueKind::command:
    return command_candidates(app, answer);
  case ValueKind::file_or_stdin:
    answer.add("-", "read standard input");
    answer.directive = "files";
    return;
  case ValueKind::file:
    answer.directive = "files";
    return;
  case ValueKind::dir:
    answer.directive = "dirs";
    return;
  case ValueKind::choice:
    for (const auto& choice : kind.choices) {
      answer.add(choice);
    }
    return;
  case ValueKind::free_text:
  case ValueKind::unknown:
    return;
  }
}

void option_candidates(const CLI::App& app, const CLI::App* command, Answer& answer)
{
  for (const auto* owner : {command, &app}) {
    for (const auto* option : owner ? owner->get_options() : std::vector<const CLI::Option*>()) {
      for (const auto& name : option->get_lnames()) {
        answer.add("--" + name, option->get_description());
      }
      for (const auto& name : option->get_snames()) {
        answer.add("-" + name, option->get_description());
      }
    }
  }
}

// The positional that the next plain word fills, if any.
const CLI::Option* next_positional(const Line& line)
{
  std::size_t filled = line.positionals.size();
  for (const auto* option :
       line.command->get_options([](const CLI::Option* o) { return o->get_positional(); })) {
    const auto takes = static_cast<std::size_t>(option->get_items_expected_max());
    if (filled < takes) {
      return option;
    }
    filled -= takes;
  }
  return nullptr;
}

Answer answer_for(const CLI::App& app, const std::vector<std::string>& words)
{
  const std::string current = words.empty() ? std::string() : words.back();
  const Line line = read_line(app, std::span(words).first(words.empty() ? 0 : words.size() - 1));
  Answer answer;
  const auto eq = current.find('=');
  const bool option_word =
      !line.after_dashes && line.pending == nullptr && current.starts_with('-') && current != "-";
  if (line.pending != nullptr) {
    value_candidates(app, completion_kind(*line.pending), line, current, answer);
  } else if (option_word && current.starts_with("--") && eq != std::string::npos) {
    const auto* option = find_flag(app, line.command, current.substr(0, eq));
    if (option != nullptr && takes_value(*option)) {
      Answer values;
      value_candidates(app, completion_kind(*option), line, current.substr(eq + 1), values);
      for (auto& candidate : values.candidates) {
        answer.add(current.substr(0, eq + 1) + candidate.word, candidate.description);
      }
      answer.directive = values.directive == "plain"
                             ? "plain"
                             : values.directive + " " + current.substr(0, eq + 1);
    }
  } else if (option_word) {
    option_candidates(app, line.command, answer);
  } else if (line.command == nullptr) {
    command_candidates(app, answer);
  } else if (const auto* positional = next_positional(line)) {
    value_candidates(app, completion_kind(*positional), line, current, answer);
  }
  std::erase_if(answer.candidates,
                [&](const Candidate& c) { return !c.word.starts_with(current); });
  return answer;
}

int print_completions(const CLI::App& app, std::vector<std::string> words)
{
  if (!words.empty() && words.front() == "--") {
    words.erase(words.begin());
  }
  const Answer answer = answer_for(app, words);
  std::string out;
  for (const auto& candidate : answer.candidates) {
    if (candidate.word.find_first_of("\t\n") != std::string::npos ||
        terminal_safe(candidate.word) != candidate.word) {
      continue; // cannot be told apart from the next line, or would reach the terminal raw
    }
    out += candidate.word;
    if (!candidate.description.empty()) {
      out += "\t" + one_line(candidate.description);
    }
    out += "\n";
  }
  out += ":" + answer.directive + "\n";
  std::fputs(out.c_str(), stdout);
  return to_int(ExitCode::ok);
}

} // namespace

CompletionKind completion_kind(const CLI::Option& option)
{
  const auto& kinds = kinds_by_name();
  const auto& names = option.get_lnames();
  const std::string name = option.get_positional() ? option.get_name()
                           : names.empty()         ? std::string()
                                                   : names.front();
  const auto found = kinds.find(name);
  return found != kinds.end() ? found->second : CompletionKind{ValueKind::unknown, {}};
}

std::optional<int> run_internal_command(const CLI::App& app, const std::vector<std::string>& args)
{
  if (args.empty()) {
    return std::nullopt;
  }
  if (args.front() == "__complete") {
    return print_completions(app, {args.begin() + 1, args.end()});
  }
  if (args.front() == "__man") {
    return write_man_page(app, args.size() > 1 ? args[1] : std::string());
  }
  return std::nullopt;
}

void add_completion_command(CLI::App& app, Context& ctx)
{
  auto shell = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("completion", "Print the shell completion script for bash, zsh "
                                               "or fish");
  sub->add_option("SHELL", *shell, "bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish"}));
  sub->footer(R"(Load it in the current shell:
  source <(ferry completion bash)   # or save it as /etc/bash_completion.d/ferry
  source <(ferry completion zsh)    # after compinit; or save it as _ferry in a $fpath directory
  ferry completion fish | source    # or save it as ~/.config/fish/completions/ferry.fish)");
  on_chosen(*sub, ctx, [shell]() -> Expected<ExitCode> {
    for (const auto& file : completion_script_files()) {
      if (file.file_name == "ferry." + *shell) {
        std::fwrite(file.bytes.data(), 1, file.bytes.size(), stdout);
        return ExitCode::ok;
      }
    }
    return fail(ErrorKind::usage, "no completion script for {}", *shell);
  });
}

} // namespace ferry::cli
