#include "run/archiving.hpp"

#include "ferry/transport.hpp"

namespace ferry {

ArchivingObserver::ArchivingObserver(ArchivingSettings settings, RunObserver& view)
    : m_settings(std::move(settings)), m_view(view)
{
}

void ArchivingObserver::record(RunRecord& record)
{
  if (!record.detached.is_null()) { // `run --detach`: kept apart until `attach` collects it
    if (auto stored = m_settings.archive->record_detached(record); !stored) {
      if (m_settings.on_error) {
        m_settings.on_error(
            {stored.error().kind, stored.error().message +
                                      " — `ferry attach` cannot find this run; "
                                      "its run directory is " +
                                      record.detached.value("run_dir", std::string())});
      }
      return;
    }
    m_archived.insert(record.run_id);
    return;
  }
  auto stored = m_settings.archive->record(record);
  if (!stored) {
    if (m_settings.on_error) {
      m_settings.on_error(
          {stored.error().kind, stored.error().message + " — " + m_settings.not_archived_hint});
    }
    if (m_settings.warn_in_record) {
      record.warnings.push_back(
          {{"code", "not-archived"},
           {"message", "the archive refused this run: " + stored.error().message}});
    }
    return;
  }
  if (!stored->spooled_to) {
    m_archived.insert(record.run_id);
  } else if (m_settings.on_note) {
    m_settings.on_note(fmt::format(
        "{}; run {} was saved to {} instead, and goes into the archive the next time ferry "
        "opens it to record a run",
        stored->why, record.run_id, stored->spooled_to->string()));
  }
}

void ArchivingObserver::run_finished(RunRecord& record)
{
  if (!m_settings.client.is_null()) {
    record.client = m_settings.client;
  }
  if (m_settings.archive != nullptr) {
    this->record(record);
  }
  // The bytes of the run's files are in the archive now; views keep records, not bytes.
  record.blobs.clear();
  m_failed |= record.status != RunStatus::ok;
  m_unreachable |= record.unreachable;
  m_interrupted |= record.status == RunStatus::interrupted;
  m_view.run_finished(record);
}

void ArchivingObserver::keep_within(std::uint64_t max_size, std::string_view config_file)
{
  if (m_settings.archive == nullptr || m_archived.empty()) {
    return;
  }
  // The newest run stays, so the run just made can be looked at whatever the size says.
  PruneOptions options;
  options.keep_last = 1;
  options.max_size = max_size;
  auto pruned = m_settings.archive->prune(options);
  if (!pruned) {
    if (m_settings.on_error) {
      m_settings.on_error(pruned.error());
    }
  } else if (!pruned->removed.empty() && m_settings.on_note) {
    m_settings.on_note(
        fmt::format("archive over its max_size of {} ({}): removed the {} oldest run{} ({})",
                    size_text(max_size), config_file, pruned->removed.size(),
                    pruned->removed.size() == 1 ? "" : "s", size_text(pruned->removed_bytes)));
  }
}

bool ArchivingObserver::archived(std::string_view run_id) const
{
  return m_archived.find(run_id) != m_archived.end();
}

ExitCode ArchivingObserver::exit_code() const
{
  if (m_interrupted || interrupt_requested()) {
    return ExitCode::interrupted;
  }
  if (m_unreachable) {
    return ExitCode::unreachable;
  }
  return m_failed ? ExitCode::run_failed : ExitCode::ok;
}

} // namespace ferry
