// The job cache over SFTP (docs/run-protocol.md, "The job cache"): a job's bytes live once in
// the run base as `ferry-job-SHA256[.ext]`, and a run directory holds a link to them.
#include <chrono>

#include <fmt/format.h>

#include "ferry/util.hpp"
#include "transport/ssh/job_cache.hpp"
#include "transport/ssh/sftp_files.hpp"

namespace ferry::ssh {

namespace {
using Clock = std::chrono::steady_clock;
// How long a session trusts what it listed, checked or made without looking again: well inside
// the two days in which no cleanup removes an entry a run touched.
constexpr std::chrono::minutes k_trusted_for{10};
// How long a name a look found missing is taken to be: the run that looked (cached_job_entry)
// goes on to upload the job at once (put_job_file), without a second look.
constexpr std::chrono::seconds k_missing_for{5};

long long epoch_now()
{
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
} // namespace

Expected<bool> SftpFiles::put_job_file(const std::string& path, std::string_view bytes,
                                       const std::string& sha256, bool discard_cached)
{
  FERRY_TRY(know_the_user());
  const std::string name = job_cache_name(sha256, path.substr(path.rfind('/') + 1));
  if (discard_cached && !name.empty()) {
    job_cache_discard(name);
  }
  if (m_cache_off || discard_cached || name.empty() || sha256_hex(bytes) != sha256) {
    FERRY_TRY(put_file(path, bytes));
    return false;
  }
  const bool cached = job_cache_has_for(path, name, bytes.size());
  if (!cached) {
    if (auto added = job_cache_add(name, bytes); !added) {
      // A cache that cannot take the job (a directory at its name, a full disk): this session
      // uploads its jobs as any other file, which says what is wrong if anything is.
      return job_cache_give_up(path, bytes, added.error());
    }
  }
  const std::string entry = m_base + "/" + name;
  {
    const auto armed = arm("link " + path);
    if (sftp_symlink(m_sftp.get(), entry.c_str(), path.c_str()) == SSH_OK) {
      m_uploaded[path.substr(0, path.rfind('/'))].push_back(path);
      return cached;
    }
  }
  // A server that makes no links, or a run directory it does not let us write.
  return job_cache_give_up(path, bytes,
                           Error{ErrorKind::failed, error("link the cached job at", path)});
}

std::optional<std::string> SftpFiles::cached_job_entry(const std::string& path,
                                                       std::string_view bytes,
                                                       const std::string& sha256)
{
  const std::string name = job_cache_name(sha256, path.substr(path.rfind('/') + 1));
  if (m_base.empty() || !m_uid || m_cache_off || name.empty() || sha256_hex(bytes) != sha256 ||
      !job_cache_has_for(path, name, bytes.size())) {
    return std::nullopt;
  }
  return m_base + "/" + name;
}

std::string SftpFiles::take_refused_entry(const std::string& run_dir)
{
  const auto it = m_cache_refused.find(run_dir);
  if (it == m_cache_refused.end()) {
    return {};
  }
  std::string entry = std::move(it->second);
  m_cache_refused.erase(it);
  return entry;
}

// An entry found but not as ferry leaves it was changed on the host (an entry appears only
// whole, by a rename): the run that wanted it says so (issue 45 item 3), as the launcher and the
// python standby say what they refuse.
bool SftpFiles::job_cache_has_for(const std::string& path, const std::string& name,
                                  std::size_t size)
{
  const CacheLook look = job_cache_look(name, size);
  if (look == CacheLook::refused) {
    m_cache_refused[path.substr(0, path.rfind('/'))] = m_base + "/" + name;
  }
  return look == CacheLook::usable;
}

Expected<std::string> SftpFiles::cache_script(std::string_view file_name, std::string_view bytes)
{
  FERRY_TRY(know_the_user());
  if (auto entry = cached_script(file_name, bytes)) {
    return std::move(*entry);
  }
  const std::string name = job_cache_name(sha256_hex(bytes), file_name);
  if (m_cache_off || name.empty()) {
    return fail(ErrorKind::failed, "the job cache is off for this session");
  }
  FERRY_TRY(job_cache_add(name, bytes));
  return m_base + "/" + name;
}

std::optional<std::string> SftpFiles::cached_script(std::string_view file_name,
                                                    std::string_view bytes)
{
  const std::string name = job_cache_name(sha256_hex(bytes), file_name);
  if (m_base.empty() || !m_uid || m_cache_off || name.empty() ||
      !job_cache_has(name, bytes.size())) {
    return std::nullopt;
  }
  return m_base + "/" + name;
}

void SftpFiles::discard_script(std::string_view file_name, std::string_view bytes)
{
  if (const std::string name = job_cache_name(sha256_hex(bytes), file_name);
      !m_base.empty() && !name.empty()) {
    job_cache_discard(name);
  }
}

Expected<void> SftpFiles::know_the_user()
{
  FERRY_TRY(prepare_base());
  FERRY_TRY(start());
  if (!m_uid) {
    FERRY_TRY_ASSIGN(const std::string dir, create_run_dir());
    FERRY_TRY(remove_run_dir(dir));
  }
  return {};
}

// The job goes up as any other file, and so do the session's later jobs; unless the connection
// is gone (the watchdog fired), when `why` is the run's error.
Expected<bool> SftpFiles::job_cache_give_up(const std::string& path, std::string_view bytes,
                                            const Error& why)
{
  if (m_watchdog.fired()) {
    return Unexpected{why};
  }
  m_cache_off = true;
  FERRY_TRY(put_file(path, bytes));
  return false;
}

// An entry is used only as ferry leaves it: a regular file (never a link), mode 0400, of the
// job's size; it appeared by a rename after a complete upload. Anything else at its name is
// removed, to be replaced. What the session's sweep listed, or this session checked or made, is
// trusted for a while without another look. A run touches the entry once a day, so the cleanup
// sees it in use.
SftpFiles::CacheLook SftpFiles::job_cache_look(const std::string& name, std::size_t size)
{
  if (!m_uid) {
    return CacheLook::missing; // nothing is trusted before the session knows whose the base is
  }
  const std::string entry = m_base + "/" + name;
  sftp_session sftp = m_sftp.get();
  const auto now = Clock::now();
  JobCacheSeen seen;
  if (const auto known = m_cache_seen.find(name);
      known != m_cache_seen.end() && now - known->second.at < k_trusted_for) {
    seen = known->second;
  } else if (known == m_cache_seen.end() && now - m_cache_listed_at < k_trusted_for) {
    return CacheLook::missing; // not in the sweep's listing
  } else if (known == m_cache_seen.end() && name == m_cache_missing &&
             now - m_cache_missing_at < k_missing_for) {
    return CacheLook::missing; // a look a moment ago found it missing
  } else {
    const auto armed = arm("look up the job cache entry " + entry);
    const Attributes attributes(sftp_lstat(sftp, entry.c_str()));
    if (!attributes) {
      m_cache_missing = name;
      m_cache_missing_at = now;
      return CacheLook::missing;
    }
    seen = {(attributes->permissions & 07777) == k_job_cache_mode &&
                trusted_file(attributes->type == SSH_FILEXFER_TYPE_REGULAR, attributes->uid,
                             attributes->permissions, *m_uid),
            attributes->size, static_cast<long long>(attributes->mtime), now};
  }
  if (!seen.usable || seen.size != size) {
    const auto armed = arm("remove the job cache entry " + entry);
    sftp_unlink(sftp, entry.c_str()); // a directory stays: the rename onto it fails
    m_cache_seen.erase(name);
    return CacheLook::refused;
  }
  if (const long long epoch = epoch_now(); job_cache_needs_touch(seen.mtime, epoch)) {
    const auto armed = arm("touch the job cache entry " + entry);
    timeval times[2] = {{static_cast<time_t>(epoch), 0}, {static_cast<time_t>(epoch), 0}};
    sftp_utimes(sftp, entry.c_str(), times); // best effort: the entry is good either way
    seen.mtime = epoch;
  }
  seen.at = now;
  m_cache_seen[name] = seen;
  return CacheLook::usable;
}

// A launcher refused the entry (its bytes no longer match their sha256): it goes, and is taken
// for missing from now on, so that the next run that wants it uploads it again.
void SftpFiles::job_cache_discard(const std::string& name)
{
  const std::string entry = m_base + "/" + name;
  const auto armed = arm("remove the job cache entry " + entry);
  sftp_unlink(m_sftp.get(), entry.c_str());
  m_cache_seen.erase(name);
  m_cache_missing = name;
  m_cache_missing_at = Clock::now();
}

// Uploaded under a temporary name in the base, then renamed into place: an entry is always
// complete. Another run that put the same bytes there first is as good.
Expected<void> SftpFiles::job_cache_add(const std::string& name, std::string_view bytes)
{
  const std::string entry = m_base + "/" + name;
  const std::string upload = m_base + "/" + job_cache_upload_name(random_hex(16));
  FERRY_TRY(write_new(upload, bytes, k_job_cache_mode));
  bool renamed = false;
  {
    const auto armed = arm("move the job into the cache as " + entry);
    renamed = sftp_rename(m_sftp.get(), upload.c_str(), entry.c_str()) == SSH_OK;
    if (!renamed) {
      sftp_unlink(m_sftp.get(), upload.c_str());
    }
  }
  m_cache_seen.erase(name);
  m_cache_listed_at = {}; // look, from now on, rather than trust the listing
  if (!renamed && !job_cache_has(name, bytes.size())) {
    return fail(ErrorKind::failed, "{}", error("move the job into the cache as", entry));
  }
  m_cache_seen[name] = {true, bytes.size(), epoch_now(), Clock::now()};
  return {};
}

// The sweep's listing of the base: the cache's names as they are now, and what
// job_cache_victims names goes (judged by the host's clock, `now`). Best effort, each bounded.
void SftpFiles::job_cache_listed(const JobCacheListing& listing, long long now)
{
  const auto at = Clock::now();
  std::vector<JobCacheEntry> files;
  for (const auto& [entry, usable] : listing) {
    m_cache_seen[entry.name] = {usable, entry.size, entry.mtime, at};
    files.push_back(entry);
  }
  m_cache_listed_at = at;
  if (m_watchdog.fired()) {
    return;
  }
  for (const auto& name : job_cache_victims(std::move(files), now)) {
    const auto armed = arm("remove the job cache entry " + name);
    if (sftp_unlink(m_sftp.get(), (m_base + "/" + name).c_str()) == SSH_OK) {
      m_cache_seen.erase(name);
    }
  }
}

} // namespace ferry::ssh
