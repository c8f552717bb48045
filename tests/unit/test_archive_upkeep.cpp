// Issue 14 items 5-7 in the archive: naming runs (prefixes of the random part, last~N,
// narrowing), and pruning.
#include "archive/prune.hpp"
#include "archive_test_support.hpp"

using namespace archive_test;
using ferry::RunNarrowing;

namespace {

// T with SET applied: designated initializers would have to name every member (-Wextra).
template <typename T, typename F> T with(F set)
{
  T value;
  set(value);
  return value;
}

std::string or_empty(const ferry::Expected<std::string>& id)
{
  return id ? id.value() : "error: " + id.error().message;
}

std::uint64_t or_zero(const ferry::Expected<std::uint64_t>& size)
{
  return size ? size.value() : 0;
}

// Four runs: two jobs on two hosts, started a minute apart (newest last).
void record_four(Archive& archive)
{
  record(archive, make_run("20260102T030400Z-3f9a1c0b", "kv_calc", "gpu1", RunStatus::ok,
                           "2026-01-02T03:04:00.000Z"));
  record(archive, make_run("20260102T030500Z-3f9b2222", "kv_calc", "gpu2", RunStatus::ok,
                           "2026-01-02T03:05:00.000Z"));
  record(archive, make_run("20260102T030600Z-a0c0ffee", "probe", "gpu1", RunStatus::ok,
                           "2026-01-02T03:06:00.000Z"));
  record(archive, make_run("20260102T030700Z-77aa0000", "probe", "gpu2", RunStatus::failed,
                           "2026-01-02T03:07:00.000Z"));
}

} // namespace

TEST_CASE("run ids: a unique prefix of the random part names the run", "[archive][runids]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  record_four(archive);
  CHECK(or_empty(archive.resolve("a0c")) == "20260102T030600Z-a0c0ffee");
  CHECK(or_empty(archive.resolve("3f9a")) == "20260102T030400Z-3f9a1c0b");
  auto by_random_part = archive.load("77aa0000");
  REQUIRE(by_random_part);
  CHECK(by_random_part->job == "probe");
  // The whole id and a prefix of it still work.
  CHECK(or_empty(archive.resolve("20260102T030500Z-3f9b2222")) == "20260102T030500Z-3f9b2222");
  CHECK(or_empty(archive.resolve("20260102T0305")) == "20260102T030500Z-3f9b2222");

  auto ambiguous = archive.resolve("3f9");
  REQUIRE_FALSE(ambiguous);
  CHECK(ambiguous.error().kind == ErrorKind::usage);
  CHECK(contains(ambiguous.error().message, "ambiguous"));
  CHECK(contains(ambiguous.error().message, "20260102T030400Z-3f9a1c0b  kv_calc @ gpu1"));
  CHECK(contains(ambiguous.error().message, "20260102T030500Z-3f9b2222  kv_calc @ gpu2"));
  CHECK_FALSE(contains(ambiguous.error().message, "a0c0ffee"));

  auto missing = archive.resolve("dead");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().kind == ErrorKind::usage);
  CHECK(contains(missing.error().message, "no run 'dead'"));
}

TEST_CASE("run ids: an ambiguous prefix lists at most 10 candidates", "[archive][runids]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  for (int i = 0; i < 14; ++i) {
    record(archive, make_run(fmt::format("20260102T0304{:02}Z-ab{:06}", i, i), "p", "gpu1",
                             RunStatus::ok, fmt::format("2026-01-02T03:04:{:02}.000Z", i)));
  }
  auto ambiguous = archive.resolve("ab");
  REQUIRE_FALSE(ambiguous);
  const std::string& message = ambiguous.error().message;
  CHECK(contains(message, "more than 10 runs"));
  // The newest first: 13 down to 4 are listed, 3 is not.
  CHECK(contains(message, "20260102T030413Z-ab000013"));
  CHECK(contains(message, "20260102T030404Z-ab000004"));
  CHECK_FALSE(contains(message, "20260102T030403Z-ab000003"));
}

TEST_CASE("run ids: last, last~N and narrowing by job and host", "[archive][runids]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  record_four(archive);
  CHECK(or_empty(archive.resolve("last")) == "20260102T030700Z-77aa0000");
  CHECK(or_empty(archive.resolve("last~0")) == "20260102T030700Z-77aa0000");
  CHECK(or_empty(archive.resolve("last~1")) == "20260102T030600Z-a0c0ffee");
  CHECK(or_empty(archive.resolve("last~3")) == "20260102T030400Z-3f9a1c0b");
  CHECK(or_empty(archive.resolve("last", with<RunNarrowing>([](auto& o) { o.job = "kv_calc"; }))) ==
        "20260102T030500Z-3f9b2222");
  CHECK(or_empty(archive.resolve("last~1", with<RunNarrowing>([](auto& o) {
                                   o.job = "kv_calc";
                                 }))) == "20260102T030400Z-3f9a1c0b");
  CHECK(or_empty(archive.resolve("last", with<RunNarrowing>([](auto& o) { o.host = "gpu1"; }))) ==
        "20260102T030600Z-a0c0ffee");
  CHECK(or_empty(archive.resolve("last", with<RunNarrowing>([](auto& o) {
                                   o.job = "kv_calc";
                                   o.host = "gpu1";
                                 }))) == "20260102T030400Z-3f9a1c0b");
  auto narrowed =
      archive.load("last~1", with<ferry::LoadOptions>([](auto& o) { o.narrow.host = "gpu2"; }));
  REQUIRE(narrowed);
  CHECK(narrowed->job == "kv_calc");

  auto too_far = archive.resolve("last~4");
  REQUIRE_FALSE(too_far);
  CHECK(too_far.error().kind == ErrorKind::usage);
  auto none = archive.resolve("last", with<RunNarrowing>([](auto& o) { o.job = "nope"; }));
  REQUIRE_FALSE(none);
  CHECK(contains(none.error().message, "of job 'nope'"));
  for (const char* bad : {"last~", "last~x", "last~-1", "last~1x"}) {
    auto refused = archive.resolve(bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().kind == ErrorKind::usage);
    CHECK(contains(refused.error().message, "last~1"));
  }
  // Narrowing a run id makes no sense: refused, not silently ignored.
  auto narrowed_id = archive.resolve("a0c", with<RunNarrowing>([](auto& o) { o.job = "kv_calc"; }));
  REQUIRE_FALSE(narrowed_id);
  CHECK(contains(narrowed_id.error().message, "--job and --host"));
}

namespace {

using ferry::PruneOptions;
using ferry::RunSize;

// Runs newest first, each `bytes` big, started on consecutive days of January (newest: the
// highest day).
std::vector<RunSize> sizes_newest_first(int count, std::uint64_t bytes = 100)
{
  std::vector<RunSize> sizes;
  for (int day = count; day >= 1; --day) {
    sizes.push_back({fmt::format("run{}", day), "j", "h",
                     fmt::format("2026-01-{:02}T00:00:00.000Z", day), bytes});
  }
  return sizes;
}

std::vector<std::string> chosen_ids(const std::vector<RunSize>& sizes, const PruneOptions& options,
                                    std::uint64_t used)
{
  std::vector<std::string> ids;
  for (const auto i : ferry::archive::select_for_pruning(sizes, options, used)) {
    ids.push_back(sizes[i].run_id);
  }
  return ids;
}

using Ids = std::vector<std::string>;

} // namespace

TEST_CASE("prune selection: age, keep-last and size", "[archive][prune]")
{
  const auto sizes = sizes_newest_first(6); // run6 newest … run1 oldest
  // Nothing asked, nothing chosen.
  CHECK(chosen_ids(sizes, {}, 600).empty());
  // Older than the 4th: runs 1-3, oldest first.
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) {
                     o.started_before = "2026-01-04T00:00:00.000Z";
                   }),
                   600) == Ids{"run1", "run2", "run3"});
  // keep-last alone removes all but the N newest.
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) { o.keep_last = 2; }), 600) ==
        Ids{"run1", "run2", "run3", "run4"});
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) { o.keep_last = 0; }), 600).size() == 6);
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) { o.keep_last = 10; }), 600).empty());
  // Beside an age it only protects.
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) {
                     o.started_before = "2026-02-01";
                     o.keep_last = 4;
                   }),
                   600) == Ids{"run1", "run2"});
  // Size: the oldest go until the rest fits (600 used, 100 each).
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) { o.max_size = 350; }), 600) ==
        Ids{"run1", "run2", "run3"});
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) { o.max_size = 600; }), 600).empty());
  // What the age removes counts towards the size.
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) {
                     o.started_before = "2026-01-03";
                     o.max_size = 350;
                   }),
                   600) == Ids{"run1", "run2", "run3"});
  // keep-last protects against size too, even when the rest does not fit.
  CHECK(chosen_ids(sizes, with<PruneOptions>([](auto& o) {
                     o.keep_last = 5;
                     o.max_size = 0;
                   }),
                   600) == Ids{"run1"});
  CHECK(chosen_ids({}, with<PruneOptions>([](auto& o) {
                     o.keep_last = 1;
                     o.max_size = 0;
                   }),
                   600)
            .empty());
}

TEST_CASE("prune: runs, then unused scripts, then the space", "[archive][prune]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  Archive archive = open_archive(path);
  CHECK(sql_int(path, "PRAGMA auto_vacuum") == 2); // set when the archive is created
  const std::string big(512 * 1024, 'x');
  for (int i = 0; i < 4; ++i) {
    auto run = make_run(fmt::format("20260102T03040{}Z-0000000{}", i, i), i < 2 ? "old" : "new",
                        "gpu1", RunStatus::ok, fmt::format("2026-01-0{}T00:00:00.000Z", i + 1),
                        i < 2 ? "echo old\n" : "echo new\n");
    run.stdout_text = big;
    record(archive, run);
  }
  auto dry = archive.prune(with<PruneOptions>([](auto& o) {
    o.keep_last = 1;
    o.dry_run = true;
  }));
  REQUIRE(dry);
  CHECK(dry->removed.size() == 3);
  CHECK(dry->removed.front().run_id == "20260102T030400Z-00000000");
  CHECK(dry->removed.front().bytes > big.size());
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 4);

  auto pruned = archive.prune(with<PruneOptions>([](auto& o) {
    o.started_before = "2026-01-03";
    o.job = "old";
  }));
  REQUIRE(pruned);
  CHECK(pruned->removed.size() == 2);
  CHECK(pruned->scripts_removed == 1);
  CHECK(pruned->file_bytes_after + big.size() < pruned->file_bytes_before);
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 2);
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 1);
  CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");

  auto stats = archive.stats(1);
  REQUIRE(stats);
  CHECK(stats->runs == 2);
  CHECK(stats->scripts == 1);
  CHECK(stats->oldest == "2026-01-03T00:00:00.000Z");
  CHECK(stats->newest == "2026-01-04T00:00:00.000Z");
  REQUIRE(stats->largest.size() == 1);
  CHECK(stats->largest.front().bytes > big.size());
  CHECK(stats->used_bytes <= stats->file_bytes);
}

// A run started on DAY (2026-01-0DAY) that sent FILE as data/conf.json and fetched OUTPUT.
RunRecord run_with_files(int day, const std::string& file, const std::string& output)
{
  RunRecord run = make_run(fmt::format("2026010{}T000000Z-0000000{}", day, day), "probe", "gpu1",
                           RunStatus::ok, fmt::format("2026-01-0{}T00:00:00.000Z", day));
  run.files = nlohmann::json::array({{{"path", "data/conf.json"},
                                      {"mode", "0600"},
                                      {"size", file.size()},
                                      {"sha256", ferry::sha256_hex(file)}}});
  run.outputs = nlohmann::json::array({{{"path", "out/r.txt"},
                                        {"size", output.size()},
                                        {"sha256", ferry::sha256_hex(output)},
                                        {"archived", true}}});
  run.blobs = {{ferry::sha256_hex(file), file}, {ferry::sha256_hex(output), output}};
  return run;
}

TEST_CASE("prune: a blob goes only when no remaining run uses it, by any role", "[archive][prune]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  Archive archive = open_archive(path);
  // Runs 1 and 2 share the file sent and the script; run 1's output is its own; run 3 fetched
  // back the very bytes runs 1 and 2 sent.
  record(archive, run_with_files(1, "{\"tp\": 2}", "first output"));
  record(archive, run_with_files(2, "{\"tp\": 2}", "second output"));
  record(archive, run_with_files(3, "third file", "{\"tp\": 2}"));
  const auto loads_whole = [&](const std::string& run_id) {
    auto loaded = archive.load(run_id, ferry::LoadOptions{.verify_blobs = true, .narrow = {}});
    return loaded ? std::string() : loaded.error().message;
  };
  const auto prune = [&](auto set) {
    auto pruned = archive.prune(with<PruneOptions>(set));
    REQUIRE(pruned);
    return *pruned;
  };

  // Removing no run removes no blob a run uses.
  const auto none = prune([](auto& o) { o.started_before = "2025-01-01"; });
  CHECK(none.removed.empty());
  CHECK(none.scripts_removed + none.files_removed + none.outputs_removed == 0);
  // The script, two files and three outputs, one of them the bytes of a file.
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 5);

  const auto first = prune([](auto& o) { o.keep_last = 2; });
  REQUIRE(first.removed.size() == 1);
  CHECK(first.scripts_removed == 0); // runs 2 and 3 run the same script
  CHECK(first.files_removed == 0);   // run 2 sent the same bytes
  CHECK(first.outputs_removed == 1); // "first output" was run 1's alone
  CHECK(sql_int(path, "SELECT count(*) FROM run_files") == 4);
  CHECK(loads_whole("20260102T000000Z-00000002").empty());
  CHECK(loads_whole("20260103T000000Z-00000003").empty());

  // Run 2 goes: its file's bytes stay, since run 3 fetched them back as an output.
  const auto second = prune([](auto& o) { o.started_before = "2026-01-03"; });
  REQUIRE(second.removed.size() == 1);
  CHECK(second.files_removed == 0);
  CHECK(second.outputs_removed == 1);
  CHECK(loads_whole("20260103T000000Z-00000003").empty());

  const auto last = prune([](auto& o) { o.keep_last = 0; });
  CHECK(last.scripts_removed == 1);
  CHECK(last.files_removed == 1);   // "third file"
  CHECK(last.outputs_removed == 1); // the bytes run 3 fetched
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 0);
  CHECK(sql_int(path, "SELECT count(*) FROM run_files") == 0);
}

TEST_CASE("prune: by size, the run kept keeps every blob it refers to", "[archive][prune]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  Archive archive = open_archive(path);
  for (int day = 1; day <= 3; ++day) {
    auto run = run_with_files(day, "shared file", fmt::format("output {}", day));
    run.stdout_text = std::string(64 * 1024, 'x');
    record(archive, run);
  }
  auto pruned = archive.prune(with<PruneOptions>([](auto& o) {
    o.max_size = 0;
    o.keep_last = 1;
  }));
  REQUIRE(pruned);
  CHECK(pruned->removed.size() == 2);
  CHECK(pruned->files_removed == 0);
  CHECK(pruned->outputs_removed == 2);
  auto kept = archive.load("20260103T000000Z-00000003",
                           ferry::LoadOptions{.verify_blobs = true, .narrow = {}});
  REQUIRE(kept);
  CHECK(kept->blobs.size() == 2);
}

TEST_CASE("prune: an archive made without incremental vacuum is vacuumed once", "[archive][prune]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    auto run = make_run("20260102T030400Z-00000001");
    run.stdout_text = std::string(256 * 1024, 'y');
    record(archive, run);
    record(archive, make_run("20260102T030400Z-00000002", "probe", "gpu1", RunStatus::ok,
                             "2026-01-03T00:00:00.000Z"));
  }
  sql_exec(path, "PRAGMA auto_vacuum = NONE; VACUUM");
  REQUIRE(sql_int(path, "PRAGMA auto_vacuum") == 0);
  Archive archive = open_archive(path);
  auto pruned = archive.prune(with<PruneOptions>([](auto& o) { o.keep_last = 1; }));
  REQUIRE(pruned);
  CHECK(pruned->removed.size() == 1);
  CHECK(sql_int(path, "PRAGMA auto_vacuum") == 2);
  CHECK(sql_int(path, "PRAGMA freelist_count") == 0);
  CHECK(pruned->file_bytes_after + 200 * 1024 < pruned->file_bytes_before);
}

TEST_CASE("sizes: units and refusals", "[archive][prune]")
{
  CHECK(or_zero(ferry::parse_size("2GiB", "x")) == 2ULL << 30);
  CHECK(or_zero(ferry::parse_size("500mib", "x")) == 500ULL << 20);
  CHECK(or_zero(ferry::parse_size("1.5GB", "x")) == 1'500'000'000ULL);
  CHECK(or_zero(ferry::parse_size("4096", "x")) == 4096);
  CHECK(or_zero(ferry::parse_size("64 K", "x")) == 64 * 1024);
  for (const char* bad : {"", "big", "-1GiB", "2 GiBs", "1e30", "nan", "GiB"}) {
    auto refused = ferry::parse_size(bad, "--max-size");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().kind == ErrorKind::usage);
    CHECK(contains(refused.error().message, "--max-size"));
  }
  CHECK(ferry::size_text(12) == "12 B");
  CHECK(ferry::size_text(1536) == "1.5 KiB");
  CHECK(ferry::size_text(2ULL << 30) == "2.0 GiB");
}

TEST_CASE("runs are listed by their invocation and pruned with it", "[archive][invocation]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  Archive archive = open_archive(path);
  const std::string first = "20260102T030400Z-aaaa0001";
  const std::string second = "20260102T030500Z-bbbb0002";
  for (int i = 0; i < 3; ++i) {
    auto run = make_run(fmt::format("20260102T03040{}Z-0000000{}", i, i), "probe", "gpu1",
                        RunStatus::ok, fmt::format("2026-01-0{}T00:00:00.000Z", i + 1));
    run.invocation = i < 2 ? first : second;
    record(archive, run);
  }
  record(archive, make_run("20260102T030409Z-00000009", "probe", "gpu1", RunStatus::ok,
                           "2026-01-01T12:00:00.000Z")); // recorded without one
  const auto resolved = [&archive](std::string_view ref) {
    auto id = archive.resolve_invocation(ref);
    return id ? *id : std::string();
  };
  CHECK(resolved("last") == second);
  CHECK(resolved("20260102T0304") == first);
  const auto ambiguous = archive.resolve_invocation("20260102T030");
  REQUIRE_FALSE(ambiguous);
  CHECK(ambiguous.error().kind == ErrorKind::usage);
  CHECK(ambiguous.error().message.find("ambiguous") != std::string::npos);
  CHECK_FALSE(archive.resolve_invocation("nothing-like-it"));

  ferry::LogFilter filter;
  filter.invocation = first;
  filter.limit = 0;
  const auto listed = archive.log(filter);
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].invocation == first);
  // A row of its own, not a column after the BLOBs (which would build each row in memory).
  CHECK(sql_int(path, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'invocation'") ==
        0);

  auto pruned = archive.prune(with<PruneOptions>([](auto& o) { o.keep_last = 1; }));
  REQUIRE(pruned);
  CHECK(sql_int(path, "SELECT count(*) FROM run_invocations") == 1);
  CHECK(resolved("last") == second);
}
