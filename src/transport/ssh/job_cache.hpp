#pragma once
// The job cache on an SSH host (docs/run-protocol.md, "The job cache"): a job's bytes are kept
// in the run base by their sha256, so that a later run links to them instead of uploading them
// again; the session's sweep, which lists the base anyway, sees and prunes them. These are its
// rules, apart from SFTP.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::ssh {

// An entry is read-only (0400): written through a handle opened as it was created, then never.
inline constexpr unsigned k_job_cache_mode = 0400;

// The entry's name for a job file: `ferry-job-SHA256`, then the file name's extension (an
// interpreter may go by it, and one that resolves the link sees the entry's name, not the
// file's). Empty when `sha256` is not 64 lowercase hex digits.
[[nodiscard]] std::string job_cache_name(std::string_view sha256, std::string_view file_name);
// The name of an upload into the cache before it is renamed into place: `.ferry-job-HEX`.
[[nodiscard]] std::string job_cache_upload_name(std::string_view random_hex);
// A name the cache uses: an entry, or an upload not yet renamed into place.
[[nodiscard]] bool is_job_cache_name(std::string_view name);
[[nodiscard]] bool is_job_cache_upload(std::string_view name);

struct JobCacheEntry {
  std::string name;
  std::uint64_t size = 0;
  long long mtime = 0; // the host's clock, epoch seconds
};
// What to remove from the cache as listed when the host's clock said `now`: uploads that broke
// off (a day old), entries unused for 30 days, then the oldest until at most 256 entries and
// 256 MiB are left. An entry touched in the last two days is never removed (a run touches the
// entry it uses once a day: job_cache_needs_touch), nor is any name the cache does not use.
[[nodiscard]] std::vector<std::string> job_cache_victims(std::vector<JobCacheEntry> entries,
                                                         long long now);
// Whether a run that uses an entry last touched at `mtime` touches it again (`now`: this
// machine's clock; a day of skew between the clocks only makes the touch come earlier or later).
[[nodiscard]] bool job_cache_needs_touch(long long mtime, long long now);

} // namespace ferry::ssh
