#include <algorithm>
#include <cstdlib>
#include <map>

#include "ferry/job.hpp"
#include "ferry/util.hpp"
#include "job/builtin_jobs.hpp"

namespace ferry {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> split(std::string_view text, char sep)
{
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(sep, start), text.size());
    if (end > start) {
      parts.emplace_back(text.substr(start, end - start));
    }
    start = end + 1;
  }
  return parts;
}

bool is_candidate_file(const fs::directory_entry& entry)
{
  std::error_code ec;
  const std::string file = entry.path().filename().string();
  return !file.empty() && file.front() != '.' && file.back() != '~' && entry.is_regular_file(ec);
}

// Files in `dir` whose name without extension is `name` (hidden and backup files excluded).
std::optional<fs::path> find_in_dir(const fs::path& dir, const std::string& name)
{
  std::error_code ec;
  std::vector<fs::path> matches;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& p = entry.path();
    if (!is_candidate_file(entry)) {
      continue;
    }
    if (p.stem().string() == name) {
      matches.push_back(p);
    }
  }
  if (matches.empty()) {
    return std::nullopt;
  }
  std::sort(matches.begin(), matches.end());
  return matches.front();
}

Expected<Job> load_job_file(const fs::path& path)
{
  FERRY_TRY_ASSIGN(auto bytes, read_file(path));
  return parse_job(path.stem().string(), path.filename().string(), path.string(), std::move(bytes));
}

} // namespace

JobPath JobPath::from_environment(const std::vector<std::string>& jobs_dirs)
{
  JobPath path;
  for (const auto& dir : jobs_dirs) {
    path.dirs.emplace_back(dir);
  }
  for (const auto& dir : split(env_or("FERRY_JOBS_PATH", ""), ':')) {
    path.dirs.emplace_back(dir);
  }
  path.dirs.emplace_back("jobs");
  path.dirs.push_back(fs::path(env_or("XDG_CONFIG_HOME", home_dir() + "/.config")) / "ferry" /
                      "jobs");
  return path;
}

Expected<Job> find_job(const std::string& spec, const JobPath& path)
{
  const bool looks_like_path = spec.find('/') != std::string::npos;
  if (looks_like_path) {
    std::error_code ec;
    if (!fs::is_regular_file(spec, ec)) {
      return fail(ErrorKind::usage, "job file {} does not exist or is not a regular file", spec);
    }
    return load_job_file(spec);
  }
  for (const auto& dir : path.dirs) {
    if (auto found = find_in_dir(dir, spec)) {
      return load_job_file(*found);
    }
  }
  if (path.builtins) {
    for (const auto& file : builtin_job_files()) {
      if (fs::path(std::string(file.file_name)).stem().string() == spec) {
        return parse_job(spec, std::string(file.file_name), "built-in", std::string(file.bytes));
      }
    }
  }
  std::error_code ec;
  if (fs::is_regular_file(spec, ec)) {
    return load_job_file(fs::path(".") / spec);
  }
  return fail(ErrorKind::usage,
              "no job named '{}' on the job path; `ferry jobs` lists the jobs there, and a path "
              "like ./{}.py runs a file directly",
              spec, spec);
}

namespace {

// The jobs of one directory that no earlier directory named already.
void list_dir(const fs::path& dir, std::map<std::string, JobListing>& found)
{
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().stem().string();
    if (!is_candidate_file(entry) || found.count(name) != 0) {
      continue;
    }
    auto bytes = read_file(entry.path());
    if (!bytes) {
      continue;
    }
    auto meta = parse_job_meta(*bytes, entry.path().string());
    found[name] = {name, entry.path().string(),
                   meta ? meta->description : "(not a valid job: " + meta.error().message + ")"};
  }
}

} // namespace

std::vector<JobListing> list_jobs(const JobPath& path)
{
  std::map<std::string, JobListing> found;
  for (const auto& dir : path.dirs) {
    list_dir(dir, found);
  }
  if (path.builtins) {
    for (const auto& file : builtin_job_files()) {
      const std::string name = fs::path(std::string(file.file_name)).stem().string();
      if (found.count(name) == 0) {
        auto meta = parse_job_meta(file.bytes, file.file_name);
        found[name] = {name, "built-in", meta ? meta->description : ""};
      }
    }
  }
  std::vector<JobListing> listing;
  for (auto& [name, item] : found) {
    listing.push_back(std::move(item));
  }
  return listing;
}

std::string job_template(std::string_view name, std::string_view lang)
{
  if (lang == "sh") {
    return fmt::format(R"JOB(#!/bin/sh
# /// ferry
# description = "{0}: describe what this job tells you"
# interpreter = "sh"
# timeout = 60
#
# [params.greeting]
# type = "string"
# default = "hello"
# help = "an example parameter"
# ///
#
# The parameters arrive as JSON in "$FERRY_PARAMS"; write one JSON document to "$FERRY_RESULT".
# Human-readable text goes to stdout. The working directory is "$FERRY_RUN_DIR" (private).
set -eu

host=$(uname -n)
echo "{0} on $host"
printf '{{"host": "%s", "params": %s}}\n' "$host" "$(cat "$FERRY_PARAMS")" > "$FERRY_RESULT"
)JOB",
                       name);
  }
  return fmt::format(R"JOB(#!/usr/bin/env python3
# /// ferry
# description = "{0}: describe what this job tells you"
# interpreter = "python3"
# timeout = 60
#
# [params.greeting]
# type = "string"
# default = "hello"
# help = "an example parameter"
# ///
"""Run with: ferry run {0} [-p greeting=hi] [--host HOST]"""
import json
import os
import platform


def main():
    with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
        params = json.load(f)
    result = {{"host": platform.node(), "greeting": params["greeting"]}}
    print(f"{{params['greeting']}} from {{result['host']}}")
    with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
)JOB",
                     name);
}

} // namespace ferry
