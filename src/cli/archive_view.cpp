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

Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref)
{
  FERRY_TRY_ASSIGN(auto archive, Archive::open_read_only(ctx.archive_path()));
  return archive.load(ref);
}

} // namespace ferry::cli
