#include <algorithm>
#include <cstdlib>
#include <map>
#include <span>

#include <fmt/ranges.h>

#include "ferry/job.hpp"
#include "ferry/suggest.hpp"
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

// The candidate files of `dir`, in byte order of their names (the first of a name wins).
std::vector<fs::path> candidate_files(const fs::path& dir)
{
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_candidate_file(entry)) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

Expected<Job> load_job_file(const fs::path& path)
{
  FERRY_TRY_ASSIGN(auto bytes, read_file(path));
  return parse_job(path.stem().string(), path.filename().string(), path.string(), std::move(bytes));
}

std::string stem_of(std::string_view file_name)
{
  return fs::path(std::string(file_name)).stem().string();
}

const EmbeddedFile* find_builtin(std::string_view name)
{
  for (const auto& file : builtin_job_files()) {
    if (stem_of(file.file_name) == name) {
      return &file;
    }
  }
  return nullptr;
}

Expected<Job> load_builtin(const EmbeddedFile& file)
{
  return parse_job(stem_of(file.file_name), std::string(file.file_name), "built-in",
                   std::string(file.bytes));
}

Expected<Job> find_builtin_job(std::string_view name)
{
  if (const auto* file = find_builtin(name)) {
    return load_builtin(*file);
  }
  std::vector<std::string> names;
  for (const auto& file : builtin_job_files()) {
    names.push_back(stem_of(file.file_name));
  }
  return fail(ErrorKind::usage, "no built-in job named '{}'{} (the built-in jobs are {})", name,
              did_you_mean(name, names), fmt::join(names, ", "));
}

std::string first_line(std::string_view text)
{
  return std::string(text.substr(0, text.find('\n')));
}

std::string no_such_job(const std::string& spec, const JobPath& path,
                        const std::vector<fs::path>& not_jobs)
{
  std::vector<std::string> names;
  for (const auto& listing : list_jobs(path)) {
    names.push_back(listing.name);
  }
  // `ferry run my_probe.py`: a job is named without its extension.
  const std::string stem = fs::path(spec).stem().string();
  const bool has_extension = !fs::path(spec).extension().empty();
  if (has_extension && std::find(names.begin(), names.end(), stem) != names.end()) {
    return fmt::format("no file {} here, and jobs on the job path are named without their "
                       "extension: `ferry run {}` runs the job {} (`ferry jobs {}` shows where)",
                       spec, stem, stem, stem);
  }
  std::string message =
      fmt::format("no job named '{}' on the job path{} (`ferry jobs` lists the jobs there, "
                  "`ferry jobs --path` the directories searched, and a path like ./{} runs a "
                  "file directly)",
                  spec, did_you_mean(spec, names), has_extension ? spec : spec + ".py");
  for (const auto& file : not_jobs) {
    message += fmt::format(" ({} is not a job: it has no `/// ferry` block)", file.string());
  }
  return message;
}

} // namespace

JobPath JobPath::from_environment(const std::vector<std::string>& jobs_dirs, bool cwd_jobs)
{
  JobPath path;
  auto add = [&path](fs::path dir, std::string origin) {
    path.dirs.push_back(std::move(dir));
    path.origins.push_back(std::move(origin));
  };
  for (const auto& dir : jobs_dirs) {
    add(dir, "--jobs-dir");
  }
  for (const auto& dir : split(env_or("FERRY_JOBS_PATH", ""), ':')) {
    add(dir, "$FERRY_JOBS_PATH");
  }
  if (cwd_jobs) {
    add("jobs", "./jobs, relative to the current directory");
  }
  add(fs::path(env_or("XDG_CONFIG_HOME", home_dir() + "/.config")) / "ferry" / "jobs",
      "$XDG_CONFIG_HOME/ferry/jobs (default ~/.config/ferry/jobs)");
  return path;
}

Expected<Job> find_job(const std::string& spec, const JobPath& path)
{
  if (spec.starts_with(k_builtin_prefix)) {
    return find_builtin_job(std::string_view(spec).substr(k_builtin_prefix.size()));
  }
  if (spec.find('/') != std::string::npos) {
    std::error_code ec;
    if (!fs::is_regular_file(spec, ec)) {
      return fail(ErrorKind::usage, "job file {} does not exist or is not a regular file", spec);
    }
    return load_job_file(spec);
  }
  std::vector<fs::path> not_jobs; // files of that name without a block: not jobs, passed over
  for (const auto& dir : path.dirs) {
    for (const auto& file : candidate_files(dir)) {
      if (file.stem().string() != spec) {
        continue;
      }
      FERRY_TRY_ASSIGN(auto bytes, read_file(file));
      if (!has_job_block(bytes)) {
        not_jobs.push_back(file);
        continue;
      }
      return parse_job(spec, file.filename().string(), file.string(), std::move(bytes));
    }
  }
  if (path.builtins) {
    if (const auto* file = find_builtin(spec)) {
      return load_builtin(*file);
    }
  }
  std::error_code ec;
  if (fs::is_regular_file(spec, ec)) {
    return load_job_file(fs::path(".") / spec);
  }
  return fail(ErrorKind::usage, "{}", no_such_job(spec, path, not_jobs));
}

namespace {

JobListing listing_of(std::string name, std::string source, const Expected<JobMeta>& meta)
{
  if (!meta) {
    return {std::move(name),
            std::move(source),
            "(not a valid job: " + first_line(meta.error().message) + ")",
            "",
            false,
            "",
            ""};
  }
  return {std::move(name), std::move(source), meta->description, meta->interpreter, true, "", ""};
}

// The jobs of one directory whose names no earlier directory took.
void scan_dir(const fs::path& dir, std::map<std::string, JobListing>& found,
              std::vector<std::string>& notes)
{
  for (const auto& file : candidate_files(dir)) {
    const std::string name = file.stem().string();
    const auto bytes = read_file(file);
    if (bytes && !has_job_block(*bytes)) {
      notes.push_back(fmt::format("{}: not a job (no `/// ferry` block), skipped", file.string()));
    } else if (const auto taken = found.find(name); taken != found.end()) {
      notes.push_back(fmt::format("{}: hidden by {}, which comes first on the job path",
                                  file.string(), taken->second.source));
    } else if (!bytes) {
      found[name] = listing_of(name, file.string(), Unexpected{bytes.error()});
    } else {
      found[name] = listing_of(name, file.string(), parse_job_meta(*bytes, file.string()));
    }
  }
}

} // namespace

JobScan scan_jobs(const JobPath& path)
{
  JobScan scan;
  std::map<std::string, JobListing> found;
  for (const auto& dir : path.dirs) {
    scan_dir(dir, found, scan.notes);
  }
  std::map<std::string, JobListing> hidden; // built-ins a file hides, by their plain name
  for (const auto& file : path.builtins ? builtin_job_files() : std::span<const EmbeddedFile>()) {
    const std::string name = stem_of(file.file_name);
    auto listing = listing_of(name, "built-in", parse_job_meta(file.bytes, file.file_name));
    if (const auto taken = found.find(name); taken != found.end()) {
      taken->second.shadows = std::string(k_builtin_prefix) + name;
      listing.name = taken->second.shadows;
      listing.shadowed_by = taken->second.source;
      hidden.emplace(name, std::move(listing));
    } else {
      found.emplace(name, std::move(listing));
    }
  }
  for (auto& [name, listing] : found) {
    scan.jobs.push_back(std::move(listing));
    if (const auto builtin = hidden.find(name); builtin != hidden.end()) {
      scan.jobs.push_back(std::move(builtin->second));
    }
  }
  return scan;
}

std::vector<JobListing> list_jobs(const JobPath& path)
{
  return scan_jobs(path).jobs;
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

# One parameter's value. $FERRY_PARAMS is one line of compact JSON ({{"greeting":"hello"}}), so
# sed can take a plain string (one without quotes or backslashes; a number is "n":5, without
# quotes); for anything richer use `jq -r .greeting "$FERRY_PARAMS"`, or write the job in python.
greeting=$(sed -n 's/.*"greeting":"\([^"\\]*\)".*/\1/p' "$FERRY_PARAMS")
host=$(uname -n)
echo "$greeting from $host"
printf '{{"host": "%s", "greeting": "%s", "params": %s}}\n' "$host" "$greeting" \
  "$(cat "$FERRY_PARAMS")" > "$FERRY_RESULT"
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
    # Every declared parameter is a key of $FERRY_PARAMS (null when unset and without default).
    with open(os.environ["FERRY_PARAMS"], encoding="utf-8") as f:
        params = json.load(f)
    greeting = params["greeting"]  # one parameter's value, typed as declared
    result = {{"host": platform.node(), "greeting": greeting}}
    print(f"{{greeting}} from {{result['host']}}")
    with open(os.environ["FERRY_RESULT"], "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
)JOB",
                     name);
}

} // namespace ferry
