#include <cstdio>
#include <exception>
#include <functional>

#include <fmt/ranges.h>

#include "cli/cli.hpp"
#include "ferry/suggest.hpp"
#include "ferry/text.hpp"
#include "ferry/version.hpp"

namespace ferry::cli {

Reporter& Context::reporter()
{
  if (!m_reporter) {
    m_reporter = make_terminal_reporter();
  }
  return *m_reporter;
}

void Context::use_json(bool json, TerminalOptions terminal)
{
  m_reporter = json ? make_json_reporter(stdout, stderr, terminal.stream)
                    : make_terminal_reporter(stdout, stderr, terminal);
}

void on_chosen(CLI::App& command, Context& ctx, Action action)
{
  command.callback([&ctx, action = std::move(action)] { ctx.action = action; });
}

std::vector<const CLI::App*> visible_commands(const CLI::App& app)
{
  return app.get_subcommands([](const CLI::App* sub) { return !sub->get_group().empty(); });
}

const CLI::App* find_command(const CLI::App& app, std::string_view name)
{
  for (const auto* sub : visible_commands(app)) {
    if (sub->check_name(std::string(name))) {
      return sub;
    }
  }
  return nullptr;
}

bool takes_value(const CLI::Option& option)
{
  return !option.get_positional() && option.get_items_expected_max() > 0;
}

std::string version_text()
{
  return fmt::format("ferry {} (libssh {}, SQLite {})", version(), ssh_library_version(),
                     sqlite_library_version());
}

namespace {

std::vector<std::string> command_names(const CLI::App& app)
{
  std::vector<std::string> names;
  for (const auto* sub : visible_commands(app)) {
    names.push_back(sub->get_name());
  }
  return names;
}

// "Usage: …" and the commands, one line each: what bare `ferry` prints.
std::string short_usage(const CLI::App& app)
{
  std::string text = "Usage: ferry [--archive PATH] [--jobs-dir DIR] [-v] COMMAND [ARGS]\n\n"
                     "Commands:\n";
  for (const auto* sub : visible_commands(app)) {
    text += fmt::format("  {:<11} {}\n", sub->get_name(), sub->get_description());
  }
  return text + "\nEvery option: ferry help; one command's: ferry help COMMAND (or COMMAND "
                "--help).\nExample: ferry run host_facts --host gpu1\n";
}

void add_help_command(CLI::App& app, Context& ctx)
{
  auto name = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("help", "Show every command and option, or one command's");
  sub->add_option("COMMAND", *name, "the command to explain");
  on_chosen(*sub, ctx, [name, &app]() -> Expected<ExitCode> {
    if (name->empty()) {
      // Not app.help(): that explains the chosen subcommand, which is `help` itself here.
      const auto text = app.get_formatter()->make_help(&app, "ferry", CLI::AppFormatMode::Normal);
      std::fputs(text.c_str(), stdout);
      return ExitCode::ok;
    }
    const auto* command = find_command(app, *name);
    if (command == nullptr) {
      return fail(ErrorKind::usage, "'{}' is not a ferry command{} (the commands are {})",
                  terminal_safe(*name), did_you_mean(*name, command_names(app)),
                  fmt::join(command_names(app), ", "));
    }
    std::fputs(command->help("ferry").c_str(), stdout);
    return ExitCode::ok;
  });
}

} // namespace

void add_commands(CLI::App& app, Context& ctx)
{
  // Computed only when asked for: the libssh version would open libssh (libssh_loader.cpp).
  app.set_version_flag("--version", std::function<std::string()>(version_text));
  app.add_option("--archive", ctx.global.archive_path,
                 "archive database (default $FERRY_ARCHIVE, $XDG_DATA_HOME/ferry/archive.db, "
                 "~/.local/share/ferry/archive.db)");
  app.add_option("--jobs-dir", ctx.global.jobs_dirs, "look for jobs here first (repeatable)");
  app.add_flag("-v,--verbose", ctx.global.verbose, "show each step with its time");
  app.require_subcommand(1);
  app.fallthrough();
  app.footer(R"(Examples:
  ferry run kv_calc -p model=qwen3.5-397b-a17b -p tp=8 -p kv_memory_gib=17.4
  ferry run gpu_probe --host gpu1,gpu2 --json
  ferry jobs kv_calc
  ferry check --host gpu1
  ferry log --job kv_calc --limit 5
  ferry replay last)");
  add_run_command(app, ctx);
  add_jobs_command(app, ctx);
  add_new_command(app, ctx);
  add_check_command(app, ctx);
  add_log_command(app, ctx);
  add_show_command(app, ctx);
  add_export_command(app, ctx);
  add_replay_command(app, ctx);
  add_prune_command(app, ctx);
  add_mcp_command(app, ctx);
  add_connect_command(app, ctx);
  add_disconnect_command(app, ctx);
  add_detached_commands(app, ctx);
  add_help_command(app, ctx);
  add_completion_command(app, ctx);
}

namespace {

// The command the user named: the first argument that is neither one of ferry's own options
// nor such an option's value. Empty when there is none; `asked` when -h or --version is there.
struct CommandWord {
  std::optional<std::string> name;
  bool asked = false;
};

CommandWord command_word(const CLI::App& app, const std::vector<std::string>& args)
{
  CommandWord word;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg.front() != '-') {
      word.name = arg == "--" ? (i + 1 < args.size() ? args[i + 1] : "") : arg;
      return word;
    }
    const std::string flag = arg.substr(0, arg.find('='));
    const auto* option = app.get_option_no_throw(flag);
    word.asked |=
        option != nullptr && (option == app.get_help_ptr() || option == app.get_version_ptr());
    if (option != nullptr && takes_value(*option) && flag == arg) {
      ++i; // its value
    }
  }
  return word;
}

// Bare `ferry` and a mistyped command, answered before CLI11 parses (it would only say that a
// subcommand is required).
std::optional<int> answer_without_command(const CLI::App& app, const std::vector<std::string>& args)
{
  const CommandWord word = command_word(app, args);
  if (word.asked) {
    return std::nullopt;
  }
  if (!word.name) {
    std::fputs(short_usage(app).c_str(), stderr);
    return to_int(ExitCode::usage);
  }
  if (find_command(app, *word.name) == nullptr) {
    std::fputs(fmt::format("ferry: error: '{}' is not a ferry command{} (`ferry help` lists the "
                           "commands)\n",
                           terminal_safe(*word.name), did_you_mean(*word.name, command_names(app)))
                   .c_str(),
               stderr);
    return to_int(ExitCode::usage);
  }
  return std::nullopt;
}

// "--hots" → "; did you mean '--host'?" among the options of the command named in `args`.
std::string option_hint(const CLI::App& app, const std::vector<std::string>& args)
{
  const CommandWord word = command_word(app, args);
  const CLI::App* command = word.name ? find_command(app, *word.name) : nullptr;
  std::vector<std::string> names;
  for (const auto* owner : {&app, command}) {
    for (const auto* option : owner ? owner->get_options() : std::vector<const CLI::Option*>()) {
      for (const auto& lname : option->get_lnames()) {
        names.push_back("--" + lname);
      }
    }
  }
  for (const auto& arg : args) {
    const std::string flag = arg.substr(0, arg.find('='));
    const bool known = app.get_option_no_throw(flag) != nullptr ||
                       (command != nullptr && command->get_option_no_throw(flag) != nullptr);
    if (flag.starts_with("--") && !known) {
      return did_you_mean(flag, names);
    }
  }
  return "";
}

int parse_error(const CLI::App& app, const std::vector<std::string>& args,
                const CLI::ParseError& error)
{
  std::string message = error.what();
  const CommandWord word = command_word(app, args);
  const std::string help = word.name ? "ferry help " + *word.name : "ferry help";
  std::fputs(fmt::format("ferry: error: {}{} (`{}` lists the options)\n", terminal_safe(message),
                         option_hint(app, args), help)
                 .c_str(),
             stderr);
  return to_int(ExitCode::usage);
}

// The command's outcome as the process's exit status; an error is printed once, here.
int finish(Context& ctx, const Expected<ExitCode>& outcome)
{
  if (outcome) {
    return to_int(*outcome);
  }
  ctx.reporter().error(outcome.error());
  return to_int(exit_code_for(outcome.error().kind));
}

} // namespace

int cli_main(int argc, char** argv)
{
  CLI::App app{"ferry: run calculations and probes on remote hosts without a remote shell.\n"
               "A job is a file, its parameters are a file; both travel over SFTP, and the only "
               "thing a shell ever sees is `/bin/sh RUN_DIR/launch.sh`.",
               "ferry"};
  Context ctx;
  add_commands(app, ctx);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (const auto internal = run_internal_command(app, args)) {
    return *internal;
  }
  if (const auto answered = answer_without_command(app, args)) {
    return *answered;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help and the version itself.
    return e.get_exit_code() == 0 ? app.exit(e) : parse_error(app, args, e);
  }
  try {
    return finish(ctx, ctx.action ? ctx.action() : Expected<ExitCode>(ExitCode::ok));
  } catch (const std::exception& e) {
    return finish(ctx, Unexpected{Error{ErrorKind::failed, e.what()}});
  }
}

} // namespace ferry::cli
