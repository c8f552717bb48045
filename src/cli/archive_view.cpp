#include "cli/archive_view.hpp"

namespace ferry::cli {

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
