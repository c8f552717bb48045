// The job cache's rules (docs/run-protocol.md, "The job cache"); SftpFiles applies them.
#include "transport/ssh/job_cache.hpp"

#include <algorithm>

namespace ferry::ssh {

namespace {

constexpr long long k_day_s = 24 * 3600;
constexpr long long k_unused_age_s = 30 * k_day_s;
constexpr long long k_protected_age_s = 2 * k_day_s;
constexpr long long k_touch_age_s = k_day_s;
constexpr std::size_t k_max_entries = 256;
constexpr std::uint64_t k_max_bytes = 256ULL * 1024 * 1024;
constexpr std::size_t k_sha256_hex = 64;
constexpr std::size_t k_max_extension = 16;
constexpr std::string_view k_entry_prefix = "ferry-job-";
constexpr std::string_view k_upload_prefix = ".ferry-job-";

bool is_lower_hex(std::string_view text)
{
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

bool is_alnum(std::string_view text)
{
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  });
}

// ".py" of "probe.py"; empty for "job", ".bashrc" or an extension that is long or odd.
std::string_view extension_of(std::string_view file_name)
{
  const auto dot = file_name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) {
    return {};
  }
  const std::string_view extension = file_name.substr(dot);
  const bool usable =
      extension.size() > 1 && extension.size() <= k_max_extension && is_alnum(extension.substr(1));
  return usable ? extension : std::string_view();
}

} // namespace

std::string job_cache_name(std::string_view sha256, std::string_view file_name)
{
  if (sha256.size() != k_sha256_hex || !is_lower_hex(sha256)) {
    return {};
  }
  return std::string(k_entry_prefix) + std::string(sha256) + std::string(extension_of(file_name));
}

std::string job_cache_upload_name(std::string_view random_hex)
{
  return std::string(k_upload_prefix) + std::string(random_hex);
}

bool is_job_cache_upload(std::string_view name)
{
  return name.starts_with(k_upload_prefix) && is_lower_hex(name.substr(k_upload_prefix.size()));
}

bool is_job_cache_name(std::string_view name)
{
  if (is_job_cache_upload(name)) {
    return true;
  }
  if (!name.starts_with(k_entry_prefix)) {
    return false;
  }
  name.remove_prefix(k_entry_prefix.size());
  if (name.size() < k_sha256_hex || !is_lower_hex(name.substr(0, k_sha256_hex))) {
    return false;
  }
  const std::string_view rest = name.substr(k_sha256_hex);
  return rest.empty() || extension_of(name) == rest;
}

std::vector<std::string> job_cache_victims(std::vector<JobCacheEntry> entries, long long now)
{
  std::vector<std::string> victims;
  std::vector<JobCacheEntry> kept;
  for (auto& entry : entries) {
    const long long age = now - entry.mtime;
    const bool upload = is_job_cache_upload(entry.name);
    if (upload) {
      if (age > k_day_s) {
        victims.push_back(std::move(entry.name)); // an upload that broke off
      }
      continue;
    }
    if (!is_job_cache_name(entry.name) || age < k_protected_age_s) {
      continue; // not the cache's, or in use lately: never removed, and not counted either
    }
    if (age > k_unused_age_s) {
      victims.push_back(std::move(entry.name));
    } else {
      kept.push_back(std::move(entry));
    }
  }
  std::sort(kept.begin(), kept.end(),
            [](const auto& a, const auto& b) { return a.mtime < b.mtime; });
  std::uint64_t bytes = 0;
  for (const auto& entry : kept) {
    bytes += entry.size;
  }
  std::size_t left = kept.size();
  for (auto& entry : kept) {
    if (left <= k_max_entries && bytes <= k_max_bytes) {
      break;
    }
    bytes -= entry.size;
    --left;
    victims.push_back(std::move(entry.name));
  }
  return victims;
}

bool job_cache_needs_touch(long long mtime, long long now)
{
  return now - mtime > k_touch_age_s;
}

} // namespace ferry::ssh
