// `ferry export RUN DIR`: an archived run as files (docs/cli.md), byte for byte.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/archive_view.hpp"
#include "ferry/bundle.hpp"
#include "ferry/fd.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ExportCommand {
  std::string run;
  RunNarrowing narrow;
  std::string dir;
  std::string to; // --to DIR: the same as DIR
};

using ExportFile = std::pair<std::string, std::string>; // name, bytes

std::vector<ExportFile> export_files(const RunRecord& run)
{
  // params.json as the runner wrote it for the job; result.json as it came back (when the
  // result came from stdout instead, or there was none, its JSON).
  std::string params = params_file_bytes(run.params);
  std::string result = !run.result_bytes.empty()
                           ? run.result_bytes
                           : run.result.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::string record = to_json(run).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  return {{"script", run.script},
          {"files", {}},
          {"outputs", {}},
          {"params.json", std::move(params)},
          {"result.json", std::move(result)},
          {"stdout", run.stdout_text},
          {"stderr", run.stderr_text},
          {"run.json", std::move(record)}};
}

// O_EXCL: never replaces a file, even one that appears while we write.
Expected<void> write_new_file(const fs::path& path, std::string_view bytes)
{
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) {
    return fail(ErrorKind::failed, "cannot create {}: {}", path.string(), std::strerror(errno));
  }
  int err = write_all(fd.get(), bytes);
  if (const int closed = fd.close(); err == 0) {
    err = closed;
  }
  if (err != 0) {
    ::unlink(path.c_str());
    return fail(ErrorKind::failed, "cannot write {}: {}", path.string(), std::strerror(err));
  }
  return {};
}

Expected<void> prepare_directory(const fs::path& dir, const std::vector<ExportFile>& files)
{
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) {
      return fail(ErrorKind::failed, "cannot create directory {}: {}", dir.string(), ec.message());
    }
    return {};
  }
  if (!fs::is_directory(dir, ec)) {
    return fail(ErrorKind::usage, "{} exists and is not a directory", dir.string());
  }
  std::string clashes;
  for (const auto& [name, bytes] : files) {
    if (fs::exists(fs::symlink_status(dir / name, ec))) {
      clashes += (clashes.empty() ? "" : ", ") + name;
    }
  }
  if (!clashes.empty()) {
    return fail(ErrorKind::usage,
                "{} already holds {}; ferry export does not overwrite files — give a new or "
                "empty directory",
                dir.string(), clashes);
  }
  return {};
}

// The staged files (under files/) and the archived outputs (under outputs/) at their relative
// paths; returns how many outputs were recorded with their hash only.
Expected<std::size_t> write_bundles(const RunRecord& run, const fs::path& dir)
{
  std::size_t hash_only = 0;
  const std::pair<const char*, const json*> lists[] = {{"files", &run.files},
                                                       {"outputs", &run.outputs}};
  for (const auto& [sub, list] : lists) {
    for (const auto& item : *list) {
      const auto blob = run.blobs.find(item.value("sha256", ""));
      if (blob == run.blobs.end()) {
        ++hash_only;
        continue;
      }
      FERRY_TRY_ASSIGN(const int raw, create_output_file(dir / sub, item.value("path", "")));
      Fd fd(raw);
      if (const int e = write_all(fd.get(), blob->second); e != 0 || fd.close() != 0) {
        return fail(ErrorKind::failed, "cannot write {}/{}/{}: {}", dir.string(), sub,
                    item.value("path", ""), std::strerror(e != 0 ? e : errno));
      }
    }
  }
  return hash_only;
}

Expected<ExitCode> run_export(Context& ctx, const ExportCommand& cmd)
{
  if (cmd.dir.empty() == cmd.to.empty()) {
    return fail(ErrorKind::usage, "export: give the directory once, as DIR or as --to DIR");
  }
  FERRY_TRY_ASSIGN(const auto run, load_archived_run(ctx, cmd.run, cmd.narrow));
  const fs::path dir(cmd.dir.empty() ? cmd.to : cmd.dir);
  const auto files = export_files(run);
  FERRY_TRY(prepare_directory(dir, files));
  for (const auto& [name, bytes] : files) {
    if (name != "files" && name != "outputs") {
      FERRY_TRY(write_new_file(dir / name, bytes));
    }
  }
  FERRY_TRY_ASSIGN(const auto hash_only, write_bundles(run, dir));
  // Written as the archive holds them, and said: they are not the bytes that ran.
  const auto mismatched = mismatched_bytes(run);
  if (!mismatched.empty()) {
    ctx.reporter().note("warning: " + mismatch_note(run, mismatched));
  }
  ctx.reporter().document(
      fmt::format("exported run {} to {}: script, params.json, result.json, stdout, stderr, "
                  "run.json{}{}{}\n",
                  run.run_id, dir.string(), run.files.empty() ? "" : ", files/",
                  run.outputs.empty() ? "" : ", outputs/",
                  hash_only == 0
                      ? ""
                      : fmt::format(" ({} fetched file{} recorded by hash only, not archived)",
                                    hash_only, hash_only == 1 ? "" : "s")),
      {{"run_id", run.run_id}, {"dir", dir.string()}, {"mismatched", mismatched}});
  return mismatched.empty() ? ExitCode::ok : ExitCode::run_failed;
}

} // namespace

void add_export_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ExportCommand>();
  CLI::App* sub = app.add_subcommand(
      "export", "Write one archived run as files: script, params.json, result.json, stdout, "
                "stderr, run.json");
  sub->add_option("RUN", cmd->run, run_ref_help)->required();
  add_narrowing_options(*sub, cmd->narrow);
  auto* positional =
      sub->add_option("DIR", cmd->dir, "directory to write into (created if missing)");
  sub->add_option("--to", cmd->to, "the same as DIR")->excludes(positional);
  sub->footer(R"(Examples:
  ferry export last ./run-files
  ferry export last --to ./run-files   (files sent and fetched under files/ and outputs/)
  ferry export 20261129T141215Z-3f9a1c0b /tmp/kv-bf16)");
  on_chosen(*sub, ctx, [cmd, &ctx] { return run_export(ctx, *cmd); });
}

} // namespace ferry::cli
