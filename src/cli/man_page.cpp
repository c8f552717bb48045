// ferry(1): the manual page, generated at build time (`ferry __man FILE`) from the same command
// and option definitions that `--help` prints, so the two cannot disagree.
#include <cstdio>

#include "cli/cli.hpp"
#include "ferry/util.hpp"
#include "ferry/version.hpp"

namespace ferry::cli {

namespace {

// Text as roff prints it literally: backslashes and hyphens escaped, and no line that starts
// with a control character.
std::string roff(std::string_view text)
{
  std::string out;
  bool line_start = true;
  for (const char c : text) {
    if (line_start && (c == '.' || c == '\'')) {
      out += "\\&";
    }
    out += c == '\\' ? "\\e" : c == '-' ? "\\-" : std::string(1, c);
    line_start = c == '\n';
  }
  return out;
}

std::string option_heading(const CLI::Option& option)
{
  std::string names;
  for (const auto& name : option.get_snames()) {
    names += (names.empty() ? "" : ", ") + fmt::format("\\fB{}\\fR", roff("-" + name));
  }
  for (const auto& name : option.get_lnames()) {
    names += (names.empty() ? "" : ", ") + fmt::format("\\fB{}\\fR", roff("--" + name));
  }
  if (takes_value(option)) {
    names += fmt::format(" \\fI{}\\fR", roff(option.get_type_name()));
  }
  return names;
}

std::string options_text(const CLI::App& owner)
{
  std::string text;
  for (const auto* option : owner.get_options()) {
    if (option->get_positional()) {
      text += fmt::format(".TP\n\\fI{}\\fR\n{}\n", roff(option->get_name()),
                          roff(option->get_description()));
    } else {
      text +=
          fmt::format(".TP\n{}\n{}\n", option_heading(*option), roff(option->get_description()));
    }
  }
  return text;
}

std::string command_text(const CLI::App& command)
{
  std::string usage = "ferry " + command.get_name();
  for (const auto* positional :
       command.get_options([](const CLI::Option* o) { return o->get_positional(); })) {
    const bool many = positional->get_items_expected_max() > 1;
    const std::string word = positional->get_name() + (many ? "..." : "");
    usage += positional->get_required() ? " " + word : " [" + word + "]";
  }
  std::string text = fmt::format(".SS \"{}\"\n{}\n", roff(usage), roff(command.get_description()));
  text += options_text(command);
  if (!command.get_footer().empty()) {
    text += ".PP\n.nf\n" + roff(command.get_footer()) + "\n.fi\n";
  }
  return text;
}

constexpr std::string_view k_tail = R"(.SH EXIT STATUS
.TP
0
every run was ok
.TP
1
a run failed, timed out or gave a bad result; or an operation failed (check: a host lacks an interpreter a job needs)
.TP
2
bad input: a usage or validation error; nothing was contacted
.TP
3
a host was unreachable, its key unknown or changed, or authentication failed
.TP
4
replay ran, and the status, exit code or result differs
.TP
130
interrupted (SIGINT or SIGTERM)
.SH ENVIRONMENT
.TP
FERRY_ARCHIVE
the archive database, unless \-\-archive is given
.TP
FERRY_JOBS_PATH
job directories searched after \-\-jobs\-dir, colon\-separated
.TP
XDG_DATA_HOME, XDG_CONFIG_HOME, HOME
where the archive and the user's job directory are by default
.TP
SSH_AUTH_SOCK
the ssh agent used for authentication
.SH FILES
.TP
~/.local/share/ferry/archive.db
the archive of every run (SQLite)
.TP
\&./jobs, ~/.config/ferry/jobs
job directories (ferry jobs \-\-path shows the order)
.TP
~/.ssh/config, ~/.ssh/known_hosts
the ssh configuration and host keys
.SH SEE ALSO
.BR ssh (1),
.BR ssh_config (5),
.BR sqlite3 (1)
)";

std::string man_page(const CLI::App& app)
{
  std::string text = fmt::format(".TH FERRY 1 \"\" \"ferry {}\" \"User Commands\"\n",
                                 roff(std::string(version())));
  text += ".SH NAME\nferry \\- run jobs on remote hosts or here, without a remote shell\n";
  text += ".SH SYNOPSIS\n.B ferry\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] "
          "[\\fIARGS\\fR]\n";
  text += ".SH DESCRIPTION\n" + roff(app.get_description()) +
          "\n.PP\nEach command also explains itself: \\fBferry help\\fR \\fICOMMAND\\fR.\n";
  text += ".SH GLOBAL OPTIONS\n" + options_text(app);
  text += ".SH COMMANDS\n";
  for (const auto* command : visible_commands(app)) {
    text += command_text(*command);
  }
  std::string examples = app.get_footer();
  if (examples.starts_with("Examples:\n")) {
    examples.erase(0, examples.find('\n') + 1);
  }
  text += ".SH EXAMPLES\n.nf\n" + roff(examples) + "\n.fi\n";
  return text + std::string(k_tail);
}

} // namespace

int write_man_page(const CLI::App& app, const std::string& file)
{
  const std::string page = man_page(app);
  if (file.empty()) {
    std::fwrite(page.data(), 1, page.size(), stdout);
    return to_int(ExitCode::ok);
  }
  if (auto written = write_file_atomic(file, page, 0644); !written) {
    std::fprintf(stderr, "ferry: error: %s\n", written.error().message.c_str());
    return to_int(exit_code_for(written.error().kind));
  }
  return to_int(ExitCode::ok);
}

} // namespace ferry::cli
