// What ferry trusts on a host before it runs anything there (src/transport/ssh/base_trust.hpp):
// the run base and the directories above it, and the files it runs from the base.
#include <catch2/catch.hpp>

#include "transport/ssh/base_trust.hpp"

using ferry::ssh::base_chain_problem;
using ferry::ssh::parent_dir;
using ferry::ssh::SeenDir;
using ferry::ssh::trusted_file;
using ferry::ssh::walk_above;

namespace {
constexpr std::uint32_t k_me = 1000;
constexpr std::uint32_t k_other = 1001;

SeenDir dir(std::string path, std::uint32_t uid, std::uint32_t mode,
            SeenDir::Type type = SeenDir::Type::directory)
{
  return {std::move(path), type, uid, mode};
}

// The default base under a home in /home, as prepare_base walks it.
std::vector<SeenDir> home_chain()
{
  return {dir("/home/me/.cache/ferry/runs", k_me, 0700), dir("/home/me/.cache/ferry", k_me, 0700),
          dir("/home/me/.cache", k_me, 0755), dir("/home/me", k_me, 0750), dir("/home", 0, 0755)};
}
} // namespace

TEST_CASE("the walk up from the base stops at the first directory of root's", "[base_trust]")
{
  CHECK(parent_dir("/home/me/.cache") == "/home/me");
  CHECK(parent_dir("/home/") == "/");
  CHECK(parent_dir("/tmp") == "/");
  CHECK_FALSE(parent_dir("/"));
  CHECK(walk_above(dir("/home/me", k_me, 0700)));
  CHECK_FALSE(walk_above(dir("/home", 0, 0755)));
  CHECK_FALSE(walk_above(dir("/", k_me, 0755)));
}

TEST_CASE("a base in private directories up to root's is trusted", "[base_trust]")
{
  CHECK_FALSE(base_chain_problem(home_chain(), k_me, "me"));
  // A private directory of the user's in /tmp: /tmp is root's and sticky.
  CHECK_FALSE(
      base_chain_problem({dir("/tmp/ferry-me", k_me, 0700), dir("/tmp", 0, 01777)}, k_me, "me"));
  // Owners unknown yet: only what the modes and types say.
  auto chain = home_chain();
  chain[0].uid = k_other;
  CHECK_FALSE(base_chain_problem(chain, std::nullopt, "me"));
}

TEST_CASE("a directory anyone else could write, or that is not the user's, is refused by name",
          "[base_trust]")
{
  SECTION("~/.cache open to all (another user could swap ~/.cache/ferry)")
  {
    auto chain = home_chain();
    chain[2].mode = 0777;
    const auto problem = base_chain_problem(chain, k_me, "me");
    REQUIRE(problem);
    CHECK_THAT(*problem, Catch::Contains("/home/me/.cache, above the run base, is writable by "
                                         "group or others (mode 777)"));
    CHECK_THAT(*problem, Catch::Contains("chmod go-w /home/me/.cache"));
  }
  SECTION("a group-writable project directory given as --remote-base")
  {
    const auto problem = base_chain_problem(
        {dir("/srv/project/runs", k_me, 0700), dir("/srv/project", 0, 02775), dir("/srv", 0, 0755)},
        k_me, "me");
    REQUIRE(problem);
    CHECK_THAT(*problem, Catch::Contains("/srv/project, above the run base, is writable by group "
                                         "or others (mode 2775) and not sticky"));
    CHECK_THAT(*problem, Catch::Contains("only you and root can write"));
  }
  SECTION("the base itself open to the group")
  {
    auto chain = home_chain();
    chain[0].mode = 0770;
    CHECK_THAT(*base_chain_problem(chain, k_me, "me"),
               Catch::Contains("the run base /home/me/.cache/ferry/runs is writable by group or "
                               "others (mode 770)"));
  }
  SECTION("/tmp itself as the base: a private directory under it, never chmod 700 /tmp")
  {
    const auto problem = base_chain_problem({dir("/tmp", 0, 01777), dir("/", 0, 0755)}, k_me, "me");
    REQUIRE(problem);
    CHECK_THAT(*problem, Catch::Contains("--remote-base /tmp/ferry-me"));
    CHECK_THAT(*problem, !Catch::Contains("chmod"));
  }
  SECTION("another user's base, or a directory above it of another user's")
  {
    auto chain = home_chain();
    chain[0].uid = k_other;
    CHECK_THAT(*base_chain_problem(chain, k_me, "me"),
               Catch::Contains("belongs to uid 1001, not to you (uid 1000)"));
    chain = home_chain();
    chain[3].uid = k_other;
    CHECK_THAT(*base_chain_problem(chain, k_me, "me"),
               Catch::Contains("/home/me, above the run base, belongs to uid 1001"));
  }
  SECTION("a link on the way")
  {
    auto chain = home_chain();
    chain[1].type = SeenDir::Type::link;
    CHECK_THAT(*base_chain_problem(chain, k_me, "me"),
               Catch::Contains("/home/me/.cache/ferry is a symbolic link"));
  }
}

TEST_CASE("a file in the base is run only when it is the user's and no one else can write it",
          "[base_trust]")
{
  CHECK(trusted_file(true, k_me, 0400, k_me));
  CHECK(trusted_file(true, k_me, 0600, k_me));
  CHECK_FALSE(trusted_file(true, k_other, 0400, k_me));
  CHECK_FALSE(trusted_file(true, k_me, 0420, k_me));
  CHECK_FALSE(trusted_file(true, k_me, 0402, k_me));
  CHECK_FALSE(trusted_file(false, k_me, 0400, k_me));
}
