// `ferry show RUN`: one archived run as a readable page, or one part of it exactly.
#include <cstdio>
#include <memory>
#include <vector>

#include "cli/archive_view.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

using nlohmann::json;

struct ShowCommand {
  std::string run;
  RunNarrowing narrow;
  bool json = false;
  bool script = false;
  bool params = false;
  bool result = false;
  bool stdout_only = false;
  bool stderr_only = false;
  bool outputs = false;
};

constexpr std::size_t stream_head_lines = 10;
constexpr std::size_t stream_tail_lines = 10;
constexpr std::size_t line_width = 400; // longer lines are cut: a job may print megabytes on one

std::string pretty_json(const json& value)
{
  return value.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string indented(std::string_view text)
{
  std::string out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto end = text.find('\n', start);
    const auto line = text.substr(start, end == std::string_view::npos ? end : end - start);
    out += "  ";
    out += line;
    out += '\n';
    if (end == std::string_view::npos) {
      break;
    }
    start = end + 1;
  }
  return out;
}

std::string display_line(std::string_view line)
{
  if (line.size() <= line_width) {
    return terminal_safe(line);
  }
  return fmt::format("{}… ({} more bytes)", terminal_safe(line.substr(0, line_width)),
                     line.size() - line_width);
}

std::string stream_section(std::string_view name, std::string_view bytes, bool truncated)
{
  const auto lines = split_lines(bytes);
  if (lines.empty()) {
    return fmt::format("{} (empty)\n", name);
  }
  std::string out =
      fmt::format("{} ({} line{}, {} bytes{})\n", name, lines.size(), lines.size() == 1 ? "" : "s",
                  bytes.size(), truncated ? ", cut at the capture cap" : "");
  const std::size_t shown = stream_head_lines + stream_tail_lines;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines.size() > shown && i == stream_head_lines) {
      out +=
          fmt::format("  … {} lines omitted (ferry show RUN --{}) …\n", lines.size() - shown, name);
      i = lines.size() - stream_tail_lines;
    }
    out += "  " + display_line(lines[i]) + "\n";
  }
  return out;
}

std::string target_section(const RunRecord& run)
{
  if (run.target.value("local", false)) {
    return "local";
  }
  std::string where = run.target.value("host", "");
  if (const std::string user = run.target.value("user", ""); !user.empty()) {
    where = user + "@" + where;
  }
  if (const auto port = run.target.find("port"); port != run.target.end() && port->is_number()) {
    where += fmt::format(":{}", port->get<long long>());
  }
  std::string text = target_label(run);
  if (!where.empty() && where != text) {
    text += " (" + where + ")";
  }
  if (const std::string key = run.target.value("host_key_sha256", ""); !key.empty()) {
    text += ", host key " + key;
  }
  return terminal_safe(text);
}

std::string page(const RunRecord& run, bool mismatched)
{
  std::string page;
  const auto field = [&](std::string_view name, std::string_view value) {
    page += fmt::format("{:<10} {}\n", name, value);
  };
  field("run", run.run_id);
  std::string job = terminal_safe(run.job);
  if (!run.script_name.empty() && run.script_name != run.job) {
    job += " (" + terminal_safe(run.script_name) + ")";
  }
  field("job", job);
  field("sha256", run.job_sha256 + (mismatched ? " (the archived bytes no longer match it: "
                                                 "see the warning)"
                                               : ""));
  field("target", target_section(run));
  std::string status(to_string(run.status));
  if (run.exit_code) {
    status += fmt::format(", exit code {}", *run.exit_code);
  }
  field("status", status);
  if (run.error) {
    field("error", terminal_safe(*run.error));
  }
  field("started", run.started_at);
  field("duration",
        fmt::format("{:.3f} s (connect {:.3f}, upload {:.3f}, exec {:.3f}, fetch {:.3f})",
                    run.duration_s, run.timings.connect, run.timings.upload, run.timings.exec,
                    run.timings.fetch));
  if (run.replay_of) {
    field("replay of", *run.replay_of);
  }
  field("ferry", run.ferry_version);
  for (const auto& warning : run.warnings) {
    field("warning",
          terminal_safe(warning.is_object() ? fmt::format("{}: {}", warning.value("code", ""),
                                                          warning.value("message", ""))
                                            : to_json_line(warning)));
  }
  page += "\nparams\n" + indented(pretty_json(run.params));
  page += "\nresult\n" + indented(pretty_json(run.result));
  page += "\n" + stream_section("stdout", run.stdout_text, run.stdout_truncated);
  page += "\n" + stream_section("stderr", run.stderr_text, run.stderr_truncated);
  return page;
}

// The part of the run the options ask for, byte for byte; nullopt: the whole page.
std::optional<std::string> part(const ShowCommand& cmd, const RunRecord& run)
{
  if (cmd.script) {
    return run.script;
  }
  if (cmd.stdout_only) {
    return run.stdout_text;
  }
  if (cmd.stderr_only) {
    return run.stderr_text;
  }
  if (cmd.params) {
    return pretty_json(run.params) + "\n";
  }
  if (cmd.result) {
    return pretty_json(run.result) + "\n";
  }
  if (cmd.json) {
    return pretty_json(to_json(run)) + "\n";
  }
  return std::nullopt;
}

// `--outputs`: the files fetched back, one line each (the names made safe for a terminal).
std::string outputs_listing(const RunRecord& run)
{
  if (run.outputs.empty()) {
    return fmt::format("run {} fetched no files\n", run.run_id);
  }
  std::string text;
  for (const auto& item : run.outputs) {
    text += fmt::format("{}  {} bytes  sha256 {}{}\n", terminal_safe(item.value("path", "")),
                        item.value("size", std::uint64_t{0}), item.value("sha256", ""),
                        item.value("archived", false) ? "" : "  (not archived: over the cap)");
  }
  return text;
}

Expected<ExitCode> run_show(Context& ctx, const ShowCommand& cmd)
{
  FERRY_TRY_ASSIGN(const auto run, load_archived_run(ctx, cmd.run, cmd.narrow));
  // Bytes that no longer match their sha256 are shown (they are what the archive holds), but
  // never without saying so; printing the script then fails, as replaying it would.
  const auto mismatched = mismatched_bytes(run);
  if (!mismatched.empty()) {
    ctx.reporter().note("warning: " + mismatch_note(run, mismatched));
  }
  if (cmd.outputs) {
    if (cmd.json) {
      ctx.reporter().bytes(pretty_json(run.outputs) + "\n");
    } else {
      ctx.reporter().document(outputs_listing(run), run.outputs);
    }
    return ExitCode::ok;
  }
  if (auto bytes = part(cmd, run)) {
    ctx.reporter().bytes(*bytes);
    if (std::ferror(stdout) != 0) {
      return fail(ErrorKind::failed, "cannot write to standard output");
    }
    return cmd.script && !mismatched.empty() ? ExitCode::run_failed : ExitCode::ok;
  }
  ctx.reporter().document(page(run, !mismatched.empty()), to_json(run));
  return ExitCode::ok;
}

} // namespace

void add_show_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ShowCommand>();
  CLI::App* sub = app.add_subcommand("show", "Show one archived run");
  sub->add_option("RUN", cmd->run, run_ref_help)->required();
  add_narrowing_options(*sub, cmd->narrow);
  std::vector<CLI::Option*> parts = {
      sub->add_flag("--json", cmd->json, "the full run record as one JSON object"),
      sub->add_flag("--script", cmd->script, "the exact script bytes that ran"),
      sub->add_flag("--params", cmd->params, "the parameters, as JSON"),
      sub->add_flag("--result", cmd->result, "the result, as JSON"),
      sub->add_flag("--stdout", cmd->stdout_only, "the job's standard output, byte for byte"),
      sub->add_flag("--stderr", cmd->stderr_only, "the job's standard error, byte for byte"),
  };
  // With --json: the list as JSON.
  auto* outputs = sub->add_flag("--outputs", cmd->outputs,
                                "the files fetched back: path, size, sha256, whether archived");
  for (auto* part : parts) {
    for (auto* other : parts) {
      if (part != other) {
        part->excludes(other);
      }
    }
    if (part->get_name() != "--json") {
      outputs->excludes(part);
    }
  }
  sub->footer(R"(Examples:
  ferry show last
  ferry show last~1 --job kv_calc
  ferry show 3f9a --result
  ferry show last --script | sha256sum)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return run_show(ctx, *cmd); });
}

} // namespace ferry::cli
