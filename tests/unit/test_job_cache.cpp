// The job cache's rules (docs/run-protocol.md, "The job cache"): entry names, which names are the
// cache's, what a cleanup removes and when a run touches an entry.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/ssh/job_cache.hpp"

using namespace ferry::ssh;

namespace {

const std::string k_sha(64, 'a');
constexpr long long k_day = 24 * 3600;
constexpr long long k_now = 1'800'000'000;

// The entry name of a made-up sha256.
std::string sha_of(int i)
{
  std::string hex = std::to_string(i);
  return "ferry-job-" + std::string(64 - hex.size(), '0') + hex; // decimal digits are hex
}

bool contains(const std::vector<std::string>& names, const std::string& name)
{
  return std::find(names.begin(), names.end(), name) != names.end();
}

} // namespace

TEST_CASE("a job cache entry is named by the sha256 and keeps a plain extension", "[job_cache]")
{
  const std::string entry = "ferry-job-" + k_sha;
  CHECK(job_cache_name(k_sha, "probe.py") == entry + ".py");
  CHECK(job_cache_name(k_sha, "gpu.info.sh") == entry + ".sh");
  CHECK(job_cache_name(k_sha, "job") == entry);
  CHECK(job_cache_name(k_sha, ".bashrc") == entry);
  CHECK(job_cache_name(k_sha, "x.p y") == entry);               // odd extension: none
  CHECK(job_cache_name(k_sha, "x.$(id)") == entry);             // never shell text
  CHECK(job_cache_name(k_sha, "x.abcdefghijklmnopq") == entry); // 17 characters: too long
  CHECK(job_cache_name(k_sha, "x.abcdefghijklmno") == entry + ".abcdefghijklmno");
  CHECK(job_cache_name(k_sha, "x.") == entry);
  CHECK(job_cache_upload_name("0123abcd") == ".ferry-job-0123abcd");
  // Not a sha256: no entry (the job is uploaded as any other file).
  CHECK(job_cache_name(std::string(63, 'a'), "x.py").empty());
  CHECK(job_cache_name(std::string(65, 'a'), "x.py").empty());
  CHECK(job_cache_name(std::string(64, 'A'), "x.py").empty());
  CHECK(job_cache_name(std::string(63, 'a') + "/", "x.py").empty());
}

TEST_CASE("only the cache's own names are the cache's", "[job_cache]")
{
  const std::string entry = "ferry-job-" + k_sha;
  CHECK(is_job_cache_name(entry));
  CHECK(is_job_cache_name(entry + ".py"));
  CHECK(is_job_cache_name(".ferry-job-0123abcd"));
  CHECK(is_job_cache_upload(".ferry-job-0123abcd"));
  CHECK_FALSE(is_job_cache_upload(entry + ".py"));
  CHECK_FALSE(is_job_cache_name(k_sha + ".py")); // no prefix
  CHECK_FALSE(is_job_cache_name(".ferry-job-"));
  CHECK_FALSE(is_job_cache_name(".ferry-job-xyz"));
  CHECK_FALSE(is_job_cache_name(".tmp-0123abcd"));
  CHECK_FALSE(is_job_cache_name("notes.txt"));
  CHECK_FALSE(is_job_cache_name(entry + ".py.bak"));
  CHECK_FALSE(is_job_cache_name(entry + "x"));
  CHECK_FALSE(is_job_cache_name("ferry-job-" + std::string(63, 'a')));
  CHECK_FALSE(is_job_cache_name("ferry-job-" + std::string(64, 'A')));
  CHECK_FALSE(is_job_cache_name("ferry-20261130T221500Z-0123456789abcdef0123456789abcdef"));
  CHECK_FALSE(is_job_cache_name(""));
}

TEST_CASE("the cleanup removes broken uploads and unused entries, never a recent one",
          "[job_cache]")
{
  const std::vector<JobCacheEntry> entries = {
      {sha_of(1) + ".py", 100, k_now - 31 * k_day}, // unused for 31 days: goes
      {sha_of(2) + ".py", 100, k_now - 29 * k_day}, // 29 days: stays
      {".ferry-job-01", 100, k_now - 25 * 3600},    // a broken-off upload a day old: goes
      {".ferry-job-02", 100, k_now - 3600},         // an upload under way: stays
      {"notes.txt", 100, k_now - 400 * k_day},      // not the cache's: stays
      {sha_of(3), 100, k_now - 2 * k_day + 60},     // touched within two days: stays
  };
  auto victims = job_cache_victims(entries, k_now);
  std::sort(victims.begin(), victims.end());
  CHECK(victims == std::vector<std::string>{".ferry-job-01", sha_of(1) + ".py"});
}

TEST_CASE("the cleanup keeps at most 256 entries, removing the oldest", "[job_cache]")
{
  std::vector<JobCacheEntry> entries;
  for (int i = 0; i < 260; ++i) {
    entries.push_back({sha_of(i), 10, k_now - 3 * k_day - i}); // a larger i is older
  }
  entries.push_back({"someone-elses-file", 10, k_now - 20 * k_day});
  const auto victims = job_cache_victims(entries, k_now);
  REQUIRE(victims.size() == 4);
  for (int i = 256; i < 260; ++i) {
    CHECK(contains(victims, sha_of(i)));
  }
}

TEST_CASE("the cleanup keeps at most 256 MiB, but never what was used in the last two days",
          "[job_cache]")
{
  constexpr std::uint64_t mib = 1024 * 1024;
  const std::vector<JobCacheEntry> entries = {
      {sha_of(1), 100 * mib, k_now - 10 * k_day},
      {sha_of(2), 100 * mib, k_now - 5 * k_day},
      {sha_of(3), 100 * mib, k_now - 3 * k_day},
      {sha_of(4), 200 * mib, k_now - k_day}, // recent: neither removed nor counted
  };
  CHECK(job_cache_victims(entries, k_now) == std::vector<std::string>{sha_of(1)});
  // Under both bounds nothing goes.
  CHECK(job_cache_victims({entries[1], entries[2], entries[3]}, k_now).empty());
}

TEST_CASE("a run touches the entry it uses once a day", "[job_cache]")
{
  CHECK_FALSE(job_cache_needs_touch(k_now - 3600, k_now));
  CHECK_FALSE(job_cache_needs_touch(k_now - k_day, k_now));
  CHECK(job_cache_needs_touch(k_now - k_day - 1, k_now));
  CHECK_FALSE(job_cache_needs_touch(k_now + k_day, k_now)); // a host clock ahead of ours
}
