// Fills an archive with N synthetic runs through the library (Archive::record, one transaction
// each, as `ferry run` records them) for tests/bench/archive_bench.sh. Prints the id of a run in
// the middle of the archive, for `ferry show`.
//
//   ferry_make_archive PATH [N [KIB]]   (N defaults to 100000; PATH must not exist yet)
//
// KIB (default 0): about that many KiB more of stdout in every run, for the memory of a command
// that reads whole records (`ferry log --json`).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "ferry/archive.hpp"
#include "ferry/util.hpp"

namespace {

using ferry::RunRecord;
using ferry::RunStatus;

constexpr int job_count = 12;
constexpr int host_count = 16;

std::string job_script(int job)
{
  std::string script = fmt::format("#!/usr/bin/env python3\n# /// ferry\n# description = \"job "
                                   "{}\"\n# interpreter = \"python3\"\n# ///\n",
                                   job);
  for (int line = 0; line < 100 * (job + 1); ++line) {
    script += fmt::format("x_{} = {} * {}  # a line of job {}\n", line, line, job, job);
  }
  return script;
}

RunStatus status_of(long i)
{
  switch (i % 50) {
  case 7:
    return RunStatus::failed;
  case 19:
    return RunStatus::timeout;
  case 31:
    return RunStatus::error;
  case 43:
    return RunStatus::bad_result;
  default:
    return RunStatus::ok;
  }
}

RunRecord make_run(long i, long n, const std::string* scripts, long pad_kib)
{
  using namespace std::chrono;
  // One run a minute, ending now.
  const auto started = system_clock::now() - minutes(n - i);
  const int job = static_cast<int>(i % job_count);
  const int host = static_cast<int>((i / job_count) % host_count);
  RunRecord run;
  run.run_id = fmt::format("{}-{:08x}", ferry::utc_compact(started), static_cast<unsigned>(i));
  run.job = fmt::format("job{:02}", job);
  run.script = scripts[job];
  run.script_name = run.job + ".py";
  run.job_sha256 = ferry::sha256_hex(run.script);
  run.target = {{"host", fmt::format("gpu{}.example.net", host)},
                {"user", "ops"},
                {"port", 22},
                {"host_key_sha256", "SHA256:" + std::string(43, 'k')}};
  run.host_label = fmt::format("gpu{}", host);
  run.params = {
      {"tp", 1 << (i % 4)}, {"kv_dtype", {"bf16", "fp8_e4m3"}}, {"context", {8192, 131072}}};
  run.status = status_of(i);
  run.exit_code = run.status == RunStatus::ok ? 0 : 1;
  if (run.status != RunStatus::ok) {
    run.error = fmt::format("synthetic {} run {}", ferry::to_string(run.status), i);
  }
  nlohmann::json result = {
      {"layers", {{"total", 60}, {"full_attention", 15}}},
      {"kv", {{"bf16", {{"bytes_per_token", 61440 + i % 7}, {"max_tokens", 1000000 + i}}}}},
      {"warnings", nlohmann::json::array()}};
  run.result_bytes = result.dump(2) + "\n";
  run.result = std::move(result);
  for (int line = 0; line < 20 + i % 40; ++line) {
    run.stdout_text += fmt::format("run {} line {}: bf16 {} tokens\n", i, line, 1000000 + i);
  }
  for (long k = 0; k < pad_kib; ++k) {
    run.stdout_text += fmt::format("{:<1023}\n", fmt::format("run {} padding {}", i, k));
  }
  run.stderr_text = i % 10 == 0 ? "warning: something to note\n" : "";
  run.started_at = ferry::utc_iso(started);
  run.duration_s = 0.2 + static_cast<double>(i % 100) / 100.0;
  run.timings = {0.05, 0.02, run.duration_s - 0.1, 0.03};
  run.ferry_version = "bench";
  return run;
}

} // namespace

int main(int argc, char** argv)
{
  if (argc < 2 || argc > 4) {
    fmt::print(stderr, "usage: ferry_make_archive PATH [N [KIB]]\n");
    return 2;
  }
  const std::filesystem::path path = argv[1];
  const long n = argc >= 3 ? std::strtol(argv[2], nullptr, 10) : 100000;
  const long pad_kib = argc == 4 ? std::strtol(argv[3], nullptr, 10) : 0;
  if (n <= 0 || pad_kib < 0 || std::filesystem::exists(path)) {
    fmt::print(stderr,
               "ferry_make_archive: N must be positive, KIB not negative, and {} must not "
               "exist yet\n",
               path.string());
    return 2;
  }
  auto archive = ferry::Archive::open(path);
  if (!archive) {
    fmt::print(stderr, "ferry_make_archive: {}\n", archive.error().message);
    return 1;
  }
  std::string scripts[job_count];
  for (int job = 0; job < job_count; ++job) {
    scripts[job] = job_script(job);
  }
  const auto start = std::chrono::steady_clock::now();
  std::string middle_id;
  for (long i = 0; i < n; ++i) {
    const RunRecord run = make_run(i, n, scripts, pad_kib);
    if (i == n / 2) {
      middle_id = run.run_id;
    }
    if (auto stored = archive->record(run); !stored) {
      fmt::print(stderr, "ferry_make_archive: {}\n", stored.error().message);
      return 1;
    }
    if ((i + 1) % 10000 == 0) {
      fmt::print(stderr, "{} runs, {:.1f} s\n", i + 1, ferry::seconds_since(start));
    }
  }
  fmt::print("{}\n", middle_id);
  return 0;
}
