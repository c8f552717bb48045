// The glob and path rules of files that travel with a job and files that come back.
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/bundle.hpp"
#include "ferry/fd.hpp"
#include "ferry/job.hpp"
#include "ferry/util.hpp"

using namespace ferry;
namespace fs = std::filesystem;

namespace {

// A directory tree in memory: "a/b.csv" files, "d/" directories, "l" (other) entries.
DirLister tree_lister(std::map<std::string, std::vector<DirEntry>> dirs)
{
  return [dirs = std::move(dirs)](
             const std::string& rel) -> Expected<std::optional<std::vector<DirEntry>>> {
    const auto found = dirs.find(rel);
    if (found == dirs.end()) {
      return std::optional<std::vector<DirEntry>>();
    }
    return std::optional(found->second);
  };
}

DirEntry file(std::string name)
{
  return {std::move(name), DirEntry::Kind::file, 1, {}};
}

DirEntry dir(std::string name)
{
  return {std::move(name), DirEntry::Kind::dir, 0, {}};
}

DirEntry link(std::string name)
{
  return {std::move(name), DirEntry::Kind::other, 0, "a symbolic link"};
}

std::vector<std::string> paths(const Expected<std::vector<GlobMatch>>& matches)
{
  REQUIRE(matches);
  std::vector<std::string> out;
  for (const auto& match : *matches) {
    out.push_back(match.path);
  }
  return out;
}

fs::path fresh_dir(const std::string& name)
{
  const fs::path dir = fs::temp_directory_path() / ("ferry-bundle-test-" + name + random_hex(4));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& bytes)
{
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

} // namespace

TEST_CASE("glob patterns must stay inside their directory", "[bundle]")
{
  CHECK(glob_segments("data/*.csv", "x").value() == std::vector<std::string>{"data", "*.csv"});
  CHECK(glob_segments("./a//b/.", "x").value() == std::vector<std::string>{"a", "b"});
  for (const char* bad : {"../x", "a/../../x", "/etc/shadow", "", ".", "./"}) {
    INFO(bad);
    const auto checked = glob_segments(bad, "files entry");
    REQUIRE_FALSE(checked);
    CHECK(checked.error().kind == ErrorKind::usage);
    CHECK_THAT(checked.error().message, Catch::StartsWith("files entry"));
  }
  CHECK_THAT(glob_segments("a/../b", "x").error().message, Catch::Contains("leaves"));
  CHECK_THAT(glob_segments("/abs", "x").error().message, Catch::Contains("absolute"));
}

TEST_CASE("globs match one level per segment, no dotfiles, never through a link", "[bundle]")
{
  const auto lister = tree_lister({
      {"", {file("a.csv"), file("b.csv"), file(".hidden.csv"), dir("data"), link("linked")}},
      {"data", {file("x.csv"), file("y.txt"), dir("deep")}},
      {"deep", {file("never.csv")}},
      {"linked", {file("through-link.csv")}},
  });
  CHECK(paths(expand_glob("*.csv", "p", lister)) == std::vector<std::string>{"a.csv", "b.csv"});
  CHECK(paths(expand_glob(".hidden.csv", "p", lister)) == std::vector<std::string>{".hidden.csv"});
  CHECK(paths(expand_glob("data/*.csv", "p", lister)) == std::vector<std::string>{"data/x.csv"});
  CHECK(paths(expand_glob("*/*.csv", "p", lister)) == std::vector<std::string>{"data/x.csv"});
  CHECK(paths(expand_glob("linked/*", "p", lister)).empty());
  CHECK(paths(expand_glob("missing/*", "p", lister)).empty());
  CHECK(paths(expand_glob("?.csv", "p", lister)) == std::vector<std::string>{"a.csv", "b.csv"});
  CHECK(paths(expand_glob("[b].csv", "p", lister)) == std::vector<std::string>{"b.csv"});
  const auto linked = expand_glob("linked", "p", lister);
  REQUIRE(linked);
  REQUIRE(linked->size() == 1);
  CHECK(linked->front().entry.kind == DirEntry::Kind::other);
}

TEST_CASE("ferry's own names in the run directory are reserved", "[bundle]")
{
  for (const char* name : {"launch.sh", "params.json", "result.json", ".ferry-launcher"}) {
    CHECK(is_reserved_run_file(name));
  }
  CHECK_FALSE(is_reserved_run_file("helpers.py"));
}

TEST_CASE("a job's files resolve relative to its file, with clear errors", "[bundle]")
{
  const fs::path root = fresh_dir("resolve");
  write(root / "probe.py", "x");
  write(root / "helpers.py", "def f(): pass\n");
  write(root / "data" / "a.csv", "1,2\n");
  write(root / "data" / "b.csv", "3,4\n");
  write(root / "outside.txt", "secret");
  fs::create_symlink(root / "outside.txt", root / "data" / "c.csv");
  const auto job_with = [&](std::vector<std::string> files) {
    Job job;
    job.name = "probe";
    job.source = (root / "probe.py").string();
    job.file_name = "probe.py";
    job.meta.files = std::move(files);
    return job;
  };

  Job job = job_with({"helpers.py", "data/[ab].csv"});
  REQUIRE(resolve_job_files(job, {}, k_default_max_upload));
  REQUIRE(job.files.size() == 3);
  CHECK(job.files[0].path == "helpers.py");
  CHECK(job.files[1].path == "data/a.csv");
  CHECK(job.files[1].bytes == "1,2\n");
  CHECK(job.files[1].sha256 == sha256_hex("1,2\n"));
  CHECK(job.files[1].mode == 0600);

  write(root / "more" / "x.txt", "x");
  write(root / "more" / "inner" / "y.txt", "y");
  Job beside = job_with({"more/*"});
  REQUIRE(resolve_job_files(beside, {}, k_default_max_upload));
  REQUIRE(beside.files.size() == 1); // the directory `inner` is passed over by the wildcard
  CHECK(beside.files[0].path == "more/x.txt");
  Job named_dir = job_with({"more/inner"});
  auto is_dir = resolve_job_files(named_dir, {}, k_default_max_upload);
  REQUIRE_FALSE(is_dir);
  CHECK_THAT(is_dir.error().message, Catch::Contains("is a directory"));

  Job none = job_with({"*.parquet"});
  auto missing = resolve_job_files(none, {}, k_default_max_upload);
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message, Catch::Contains("matches no file"));

  Job linked = job_with({"data/*.csv"});
  auto refused = resolve_job_files(linked, {}, k_default_max_upload);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("data/c.csv is a symbolic link"));

  Job big = job_with({"data/a.csv", "data/b.csv"});
  auto over = resolve_job_files(big, {}, 6);
  REQUIRE_FALSE(over);
  CHECK_THAT(over.error().message, Catch::Contains("--max-upload"));

  Job reserved = job_with({});
  write(root / "params.json", "{}");
  auto clash = resolve_job_files(reserved, {(root / "params.json").string()}, 1 << 20);
  REQUIRE_FALSE(clash);
  CHECK_THAT(clash.error().message, Catch::Contains("a name ferry itself writes"));

  Job given = job_with({});
  REQUIRE(resolve_job_files(given, {(root / "data" / "b.csv").string()}, 1 << 20));
  REQUIRE(given.files.size() == 1);
  CHECK(given.files[0].path == "b.csv"); // an absolute --file lands under its name

  Job absent = job_with({});
  auto no_file = resolve_job_files(absent, {(root / "nope").string()}, 1 << 20);
  REQUIRE_FALSE(no_file);
  CHECK_THAT(no_file.error().message, Catch::Contains("--file"));
  fs::remove_all(root);
}

TEST_CASE("output files are created under their directory, never through a link", "[bundle]")
{
  const fs::path root = fresh_dir("out");
  const fs::path elsewhere = fresh_dir("elsewhere");
  {
    auto fd = create_output_file(root, "plots/a.png");
    REQUIRE(fd);
    Fd owned(*fd);
  }
  CHECK(fs::is_regular_file(root / "plots" / "a.png"));
  CHECK((fs::status(root / "plots" / "a.png").permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write));
  auto again = create_output_file(root, "plots/a.png");
  REQUIRE_FALSE(again);
  CHECK_THAT(again.error().message, Catch::Contains("choose an empty --out"));

  fs::create_directory_symlink(elsewhere, root / "sneaky");
  auto through = create_output_file(root, "sneaky/x");
  REQUIRE_FALSE(through);
  CHECK(fs::is_empty(elsewhere));
  CHECK_FALSE(create_output_file(root, "../escape"));
  CHECK_FALSE(fs::exists(root.parent_path() / "escape"));
  fs::remove_all(root);
  fs::remove_all(elsewhere);
}

TEST_CASE("the output directory pattern takes the run id and a safe host", "[bundle]")
{
  CHECK(output_dir_for("ferry-out/{run_id}/{host}", "R1", "gpu1") == "ferry-out/R1/gpu1");
  CHECK(output_dir_for("o/{host}", "R", "u@h:22") == "o/u@h:22");
  CHECK(output_dir_for("o/{host}", "R", "../..") == "o/.._..");
  CHECK(output_dir_for("o/{host}", "R", "a/b") == "o/a_b");
  CHECK(output_dir_for("plain", "R", "h") == "plain");
}

TEST_CASE("sha256 fed in pieces equals the one-shot hash", "[bundle]")
{
  std::string bytes;
  for (int i = 0; i < 1000; ++i) {
    bytes += static_cast<char>(i * 7);
  }
  for (const std::size_t piece : {1u, 3u, 63u, 64u, 65u, 999u}) {
    Sha256 hash;
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      hash.update(std::string_view(bytes).substr(at, piece));
    }
    CHECK(std::move(hash).hex() == sha256_hex(bytes));
  }
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
