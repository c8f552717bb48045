// The note of the python standby's script in a host's job cache (docs/run-protocol.md, "A first
// run without SFTP"): what a fresh note gives, and what is never taken from one.
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <utime.h>

#include "archive_test_support.hpp"
#include "transport/ssh/standby/memo.hpp"

using namespace ferry;
using archive_test::TempDir;

namespace {

const std::string k_memo_identity = R"({"host":"gpu1","port":22})";
const std::string k_memo_script = "ferry-job-" + std::string(64, 'b') + ".py";
const std::string k_memo_entry = "/home/ops/.cache/ferry/runs/" + k_memo_script;

// XDG_RUNTIME_DIR set to a fresh directory of the user's for the test's length.
struct MemoRuntimeDir {
  TempDir dir;
  std::string saved;
  bool had = false;
  MemoRuntimeDir()
  {
    if (const char* old = std::getenv("XDG_RUNTIME_DIR")) {
      saved = old;
      had = true;
    }
    ::setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);
  }
  ~MemoRuntimeDir()
  {
    if (had) {
      ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
    } else {
      ::unsetenv("XDG_RUNTIME_DIR");
    }
  }
  [[nodiscard]] std::string memo() const
  {
    return ssh::standby_memo_path(dir.path() / "ferry", k_memo_identity).string();
  }
};

void age_memo(const std::string& path, long seconds)
{
  const time_t then = std::time(nullptr) - seconds;
  const utimbuf times{then, then};
  REQUIRE(::utime(path.c_str(), &times) == 0);
}

} // namespace

TEST_CASE("a note of the standby's script is recalled while fresh", "[standby_memo]")
{
  const MemoRuntimeDir runtime;
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
  ssh::remember_standby(k_memo_identity, k_memo_entry);
  struct stat st {};
  REQUIRE(::stat(runtime.memo().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry == k_memo_entry);
  // Another connection's options: another note.
  CHECK_FALSE(ssh::recall_standby(R"({"host":"gpu2","port":22})", k_memo_script));
  // Another build's script: not this one's.
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, "ferry-job-" + std::string(64, 'c') + ".py"));
  // An hour after the sweep that wrote it, the note is stale: the base is swept again.
  age_memo(runtime.memo(), 3600 + 5);
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
  age_memo(runtime.memo(), 3600 - 60);
  CHECK(ssh::recall_standby(k_memo_identity, k_memo_script));
  ssh::forget_standby(k_memo_identity);
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
}

TEST_CASE("a standby that could not start is noted, and not overwritten while fresh",
          "[standby_memo]")
{
  const MemoRuntimeDir runtime;
  ssh::standby_failed(k_memo_identity);
  auto memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry.empty());
  ssh::remember_standby(k_memo_identity,
                        k_memo_entry); // a sweep saw the script: the failure stands
  memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry.empty());
  age_memo(runtime.memo(), 3600 + 5);
  ssh::remember_standby(k_memo_identity, k_memo_entry); // once stale, the sweep's word counts again
  memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry == k_memo_entry);
}

TEST_CASE("a note that is not the user's own private file, or not a plain entry, is not taken",
          "[standby_memo]")
{
  const MemoRuntimeDir runtime;
  const auto write = [&](const std::string& text) {
    ssh::forget_standby(k_memo_identity);
    ssh::remember_standby(k_memo_identity, k_memo_entry); // makes the directory
    std::ofstream(runtime.memo(), std::ios::trunc) << text;
  };
  write(k_memo_entry + "\n");
  CHECK(ssh::recall_standby(k_memo_identity, k_memo_script));
  // Anything that would not be one neutral token in the exec request.
  for (const std::string& bad :
       {"/home/o ps/" + k_memo_script, "/home/ops/$(x)/" + k_memo_script,
        "relative/" + k_memo_script, "/" + k_memo_script + ";true", "/" + k_memo_script}) {
    write(bad + "\n");
    CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
  }
  write(k_memo_entry + "\n");
  REQUIRE(::chmod(runtime.memo().c_str(), 0644) == 0); // open to others
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
  REQUIRE(::chmod(runtime.memo().c_str(), 0600) == 0);
  const std::string link = runtime.memo() + ".real";
  REQUIRE(::rename(runtime.memo().c_str(), link.c_str()) == 0);
  REQUIRE(::symlink(link.c_str(), runtime.memo().c_str()) == 0); // a link is never followed
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
}

TEST_CASE("a once standby's compiled code is added to the note, which keeps its time",
          "[standby_memo]")
{
  const MemoRuntimeDir runtime;
  const std::string tag(64, 'e');
  // No note, or a note of another entry: nothing is added.
  ssh::remember_standby_code(k_memo_identity, k_memo_entry, tag);
  CHECK_FALSE(ssh::recall_standby(k_memo_identity, k_memo_script));
  ssh::remember_standby(k_memo_identity, k_memo_entry);
  ssh::remember_standby_code(k_memo_identity, "/elsewhere/" + k_memo_script, tag);
  REQUIRE(ssh::recall_standby(k_memo_identity, k_memo_script));
  CHECK(ssh::recall_standby(k_memo_identity, k_memo_script)->tag_sha256.empty());
  // Not a sha256: nothing is added.
  for (const std::string& bad :
       {std::string("-"), std::string(63, 'e'), std::string(64, 'E'), std::string(63, 'e') + " "}) {
    ssh::remember_standby_code(k_memo_identity, k_memo_entry, bad);
    CHECK(ssh::recall_standby(k_memo_identity, k_memo_script)->tag_sha256.empty());
  }
  // Added, and the note is as old as the sweep that wrote it.
  age_memo(runtime.memo(), 1800);
  struct stat before {};
  REQUIRE(::stat(runtime.memo().c_str(), &before) == 0);
  ssh::remember_standby_code(k_memo_identity, k_memo_entry, tag);
  auto memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry == k_memo_entry);
  CHECK(memo->tag_sha256 == tag);
  struct stat after {};
  REQUIRE(::stat(runtime.memo().c_str(), &after) == 0);
  CHECK(after.st_mtime == before.st_mtime);
  CHECK((after.st_mode & 0777) == 0600);
  // A sweep that sees the same entry keeps it (and dates the note now); another entry drops it.
  ssh::remember_standby(k_memo_identity, k_memo_entry);
  CHECK(ssh::recall_standby(k_memo_identity, k_memo_script)->tag_sha256 == tag);
  REQUIRE(::stat(runtime.memo().c_str(), &after) == 0);
  CHECK(after.st_mtime > before.st_mtime);
  const std::string other = "/home/ops/.cache/ferry/other/" + k_memo_script;
  ssh::remember_standby(k_memo_identity, other);
  memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry == other);
  CHECK(memo->tag_sha256.empty());
  // A note whose second field is not a sha256 still gives its entry, without a sum.
  std::ofstream(runtime.memo(), std::ios::trunc) << other << " $(reboot)\n";
  memo = ssh::recall_standby(k_memo_identity, k_memo_script);
  REQUIRE(memo);
  CHECK(memo->entry == other);
  CHECK(memo->tag_sha256.empty());
}
