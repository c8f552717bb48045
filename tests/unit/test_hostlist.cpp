// Hostlists (issue 43 item 3): the folded syntax of ClusterShell and pdsh, and @groups from the
// config file, expanded before any host is contacted.
#include <catch2/catch.hpp>

#include "cli/targets.hpp"
#include "ferry/hostlist.hpp"
#include "run/targets.hpp"

using namespace ferry;
using Hosts = std::vector<std::string>;

namespace {

Hosts expanded(std::string_view entry)
{
  auto hosts = expand_hostlist(entry);
  INFO(entry << ": " << (hosts ? std::string() : hosts.error().message));
  REQUIRE(hosts);
  return *hosts;
}

std::string refusal(std::string_view entry, std::size_t cap = k_max_hostlist_hosts)
{
  const auto hosts = expand_hostlist(entry, cap);
  INFO(entry);
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().kind == ErrorKind::usage);
  return hosts.error().message;
}

UserConfig config_with_groups(std::string_view groups)
{
  auto config = parse_user_config(groups, "/home/me/.config/ferry/config.toml");
  INFO((config ? std::string() : config.error().message));
  REQUIRE(config);
  return *config;
}

Expected<Hosts> named(const Hosts& hosts, const UserConfig& config)
{
  HostTargets target;
  target.hosts = hosts;
  return named_hosts(target, config);
}

} // namespace

TEST_CASE("hostlist: ranges, lists, zero padding and steps", "[hostlist]")
{
  CHECK(expanded("gpu1") == Hosts{"gpu1"});
  CHECK(expanded("gpu[1-3]") == Hosts{"gpu1", "gpu2", "gpu3"});
  CHECK(expanded("gpu[08-11]") == Hosts{"gpu08", "gpu09", "gpu10", "gpu11"});
  CHECK(expanded("gpu[001-002]") == Hosts{"gpu001", "gpu002"});
  CHECK(expanded("node[1-4,7]") == Hosts{"node1", "node2", "node3", "node4", "node7"});
  CHECK(expanded("node[7,1-2]") == Hosts{"node7", "node1", "node2"});
  CHECK(expanded("n[1-9/4]") == Hosts{"n1", "n5", "n9"});
  CHECK(expanded("[1-2].lab") == Hosts{"1.lab", "2.lab"});
  CHECK(expanded("n[0]") == Hosts{"n0"});
}

TEST_CASE("hostlist: several groups expand as a product, the first outermost", "[hostlist]")
{
  CHECK(expanded("r[1-2]n[1-2]") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expanded("r[1-2]-n[01,10].dc") ==
        Hosts{"r1-n01.dc", "r1-n10.dc", "r2-n01.dc", "r2-n10.dc"});
}

TEST_CASE("hostlist: user@ and :port stay on every host, IPv6 literals stay literal", "[hostlist]")
{
  CHECK(expanded("root@gpu[1-2]:2222") == Hosts{"root@gpu1:2222", "root@gpu2:2222"});
  CHECK(expanded("[::1]:22") == Hosts{"[::1]:22"});
  CHECK(expanded("[::1]") == Hosts{"[::1]"});
  CHECK(expanded("me@[fe80::1%eth0]:2200") == Hosts{"me@[fe80::1%eth0]:2200"});
  CHECK(expanded("127.0.0.[1-2]:22") == Hosts{"127.0.0.1:22", "127.0.0.2:22"});
  // A colon inside brackets after a name is no address: a bad range.
  CHECK_THAT(refusal("gpu[1:2]"), Catch::Contains("'1:2' is not a number"));
}

TEST_CASE("hostlist: a bad range is refused, naming it", "[hostlist]")
{
  CHECK(refusal("gpu[5-1]") == "bad host range 'gpu[5-1]': '5-1' runs backwards; write the "
                               "lower bound first");
  CHECK_THAT(refusal("gpu[a-b]"), Catch::StartsWith("bad host range 'gpu[a-b]': 'a' is not a "
                                                    "number"));
  CHECK_THAT(refusal("gpu[1-4"), Catch::Contains("a '[' is not closed by ']'"));
  CHECK_THAT(refusal("gpu[1-[2]]"), Catch::Contains("a '[' is not closed by ']'"));
  CHECK_THAT(refusal("gpu1-4]"), Catch::Contains("a ']' closes no '['"));
  CHECK_THAT(refusal("gpu[]"), Catch::Contains("'' is not a number"));
  CHECK_THAT(refusal("gpu[1,,2]"), Catch::Contains("'' is not a number"));
  CHECK_THAT(refusal("gpu[1-2-3]"), Catch::Contains("'2-3' is not a number"));
  CHECK_THAT(refusal("gpu[1-9/0]"), Catch::Contains("steps by 0"));
  CHECK_THAT(refusal("gpu[1-9999999999]"), Catch::Contains("at most 9 digits"));
  CHECK_THAT(refusal("gpu[1-100001]"), Catch::Contains("names more than 100000 hosts"));
  CHECK(expanded("gpu[1-100000]").size() == 100000);
  CHECK_THAT(refusal("gpu[1-1000]r[1-1000]"), Catch::Contains("names more than 100000 hosts"));
  CHECK_THAT(refusal("n[1-3]", 2), Catch::Contains("names more than 2 hosts"));
  CHECK_THAT(refusal("n[1-2,3]", 2), Catch::Contains("names more than 2 hosts"));
}

TEST_CASE("hostlist: a list splits at the commas outside brackets", "[hostlist]")
{
  CHECK(split_hostlist("a, n[1,3-4] ,b") == Hosts{"a", "n[1,3-4]", "b"});
  CHECK(split_hostlist("[::1]:22,[::2]") == Hosts{"[::1]:22", "[::2]"});
  CHECK(split_hostlist("a,,b") == Hosts{"a", "", "b"});
  CHECK(split_hostlist("") == Hosts{""});
}

TEST_CASE("hosts named: hostlists and @groups expand, repeats kept for each_host_once",
          "[hostlist][targets]")
{
  const auto config = config_with_groups(R"([groups]
a100 = ["gpu[01-03]", "spare1"]
all = ["@a100", "cpu[1-2]"]
)");
  const auto hosts = named({"node[1-2,4],@a100", "gpu02"}, config);
  REQUIRE(hosts);
  CHECK(*hosts == Hosts{"node1", "node2", "node4", "gpu01", "gpu02", "gpu03", "spare1", "gpu02"});
  std::vector<std::string> notes;
  CHECK(each_host_once(*hosts, [&](std::string_view line) { notes.emplace_back(line); }) ==
        Hosts{"node1", "node2", "node4", "gpu01", "gpu02", "gpu03", "spare1"});
  CHECK(notes == Hosts{"gpu02 is named more than once; it runs once"});
  const auto nested = named({"@all"}, config);
  REQUIRE(nested);
  CHECK(*nested == Hosts{"gpu01", "gpu02", "gpu03", "spare1", "cpu1", "cpu2"});
}

TEST_CASE("hosts named: many repeats make one note, first occurrences kept in order",
          "[hostlist][targets]")
{
  const auto hosts = named({"n[1-8]", "n[8-1]"}, UserConfig{});
  REQUIRE_FALSE(hosts); // a backwards range is refused, not reversed
  const auto twice = named({"n[1-8]", "n[3-10]"}, UserConfig{});
  REQUIRE(twice);
  std::vector<std::string> notes;
  const auto once =
      each_host_once(*twice, [&](std::string_view line) { notes.emplace_back(line); });
  CHECK(once == Hosts{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"});
  CHECK(notes ==
        Hosts{"6 hosts are named more than once (n3, n4, n5, n6, n7, ...); each runs once"});
}

TEST_CASE("hosts named: an unknown group, a cycle, a bad range in a group are usage errors",
          "[hostlist][targets]")
{
  const auto config = config_with_groups(R"([groups]
a100 = ["gpu[01-08]"]
loop = ["x", "@back"]
back = ["@loop"]
broken = ["gpu[9-1]"]
)");
  auto hosts = named({"@h100"}, config);
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().kind == ErrorKind::usage);
  CHECK(hosts.error().message ==
        "--host: no group @h100; groups are defined in the [groups] table of "
        "/home/me/.config/ferry/config.toml (known: @a100, @back, @broken, @loop)");
  hosts = named({"@loop"}, config);
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().message == "group @loop names itself (@loop -> @back -> @loop) in "
                                 "/home/me/.config/ferry/config.toml");
  hosts = named({"a,@broken"}, config);
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().message == "group @broken in /home/me/.config/ferry/config.toml: bad host "
                                 "range 'gpu[9-1]': '9-1' runs backwards; write the lower bound "
                                 "first");
  hosts = named({"gpu[5-1]"}, UserConfig{});
  REQUIRE_FALSE(hosts);
  CHECK_THAT(hosts.error().message, Catch::StartsWith("--host: bad host range 'gpu[5-1]'"));
  hosts = named({"n[1-60000]", "m[1-60000]"}, UserConfig{});
  REQUIRE_FALSE(hosts);
  CHECK(hosts.error().message == "--host: more than 100000 hosts in all (at 'm[1-60000]'); name "
                                 "fewer");
}

TEST_CASE("config: [groups] entries are lists of host strings with plain names", "[hostlist]")
{
  for (const char* text :
       {"[groups]\na = \"gpu1\"\n", "[groups]\na = []\n", "[groups]\na = [1]\n",
        "[groups]\n\"a b\" = [\"x\"]\n", "[groups]\na = [\" \"]\n", "groups = 3\n"}) {
    INFO(text);
    const auto config = parse_user_config(text, "/c/config.toml");
    REQUIRE_FALSE(config);
    CHECK(config.error().kind == ErrorKind::usage);
    CHECK_THAT(config.error().message, Catch::StartsWith("/c/config.toml:"));
  }
}
