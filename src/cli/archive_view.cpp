#include "cli/archive_view.hpp"

#include <fmt/ranges.h>

#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

// A file sent with the run or fetched back, whose bytes the archive keeps.
void check_blob(const RunRecord& run, const nlohmann::json& item, std::string_view role,
                std::vector<std::string>& mismatched)
{
  if (!item.value("archived", true)) {
    return; // recorded by its hash only
  }
  const std::string sha256 = item.value("sha256", "");
  const std::string name = terminal_safe(item.value("path", ""));
  const auto blob = run.blobs.find(sha256);
  if (blob == run.blobs.end()) {
    mismatched.push_back(fmt::format("the {} {} (sha256 {}) is missing", role, name, sha256));
  } else if (const std::string actual = sha256_hex(blob->second); actual != sha256) {
    mismatched.push_back(fmt::format("the {} {} is filed under sha256 {} but hashes to {}", role,
                                     name, sha256, actual));
  }
}

} // namespace

std::vector<std::string> mismatched_bytes(const RunRecord& run)
{
  std::vector<std::string> mismatched;
  if (!run.job_sha256.empty()) {
    if (run.script.empty()) {
      mismatched.push_back(fmt::format("the script (sha256 {}) is missing", run.job_sha256));
    } else if (const std::string actual = sha256_hex(run.script); actual != run.job_sha256) {
      mismatched.push_back(fmt::format("the script is filed under sha256 {} but hashes to {}",
                                       run.job_sha256, actual));
    }
  }
  for (const auto& item : run.files) {
    check_blob(run, item, "file sent", mismatched);
  }
  for (const auto& item : run.outputs) {
    check_blob(run, item, "fetched file", mismatched);
  }
  return mismatched;
}

std::string mismatch_note(const RunRecord& run, const std::vector<std::string>& mismatched)
{
  return fmt::format("run {}: {} — the archive was changed outside ferry: these bytes are not "
                     "the ones that ran, and `ferry replay` refuses this run",
                     run.run_id, fmt::join(mismatched, "; "));
}

std::string target_label(const RunRecord& run)
{
  if (!run.host_label.empty()) {
    return run.host_label;
  }
  if (const auto host = run.target.find("host"); host != run.target.end() && host->is_string()) {
    return host->get<std::string>();
  }
  return "local";
}

Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref,
                                      const RunNarrowing& narrow)
{
  FERRY_TRY_ASSIGN(auto archive, Archive::open_read_only(ctx.archive_path()));
  return archive.load(ref, LoadOptions{.verify_blobs = false, .narrow = narrow});
}

void add_narrowing_options(CLI::App& command, RunNarrowing& narrow, const std::string& host_flag)
{
  command.add_option_function<std::string>(
      "--job", [&narrow](const std::string& job) { narrow.job = job; },
      "with last or last~N: count only runs of this job");
  command.add_option_function<std::string>(
      host_flag, [&narrow](const std::string& host) { narrow.host = host; },
      "with last or last~N: count only runs on this host (its name or the alias given)");
}

} // namespace ferry::cli
