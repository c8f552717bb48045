// ssh_config read as OpenSSH 9.2 reads it: blocks, Match criteria, Include, first value wins,
// unknown keywords, quoting and %-tokens (the real ssh is compared in test_ssh_parity.py).
#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "transport/ssh/config.hpp"

using namespace ferry::ssh;
namespace fs = std::filesystem;

namespace {

struct TempHome {
  fs::path dir;
  TempHome()
  {
    char pattern[] = "/tmp/ferry-ssh-config-XXXXXX";
    dir = ::mkdtemp(pattern);
    fs::create_directories(dir / ".ssh");
  }
  ~TempHome() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text, unsigned mode = 0644) const
  {
    const fs::path path = dir / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path.string();
  }
  ConfigQuery query(const std::string& host, const std::string& config) const
  {
    ConfigQuery q;
    q.host = host;
    q.config_file = config;
    q.home = dir.string();
    q.local_user = "alice";
    q.system_config = (dir / "no-system-config").string();
    return q;
  }
};

SshConfig read(const ConfigQuery& query)
{
  auto config = read_ssh_config(query);
  INFO((config ? std::string() : config.error().message));
  REQUIRE(config);
  return std::move(config).value();
}

std::string refusal(const ConfigQuery& query)
{
  auto config = read_ssh_config(query);
  REQUIRE_FALSE(config);
  CHECK(config.error().kind == ferry::ErrorKind::usage);
  return config.error().message;
}

} // namespace

TEST_CASE("ssh config: Host blocks, first value wins, identity files add up", "[ssh_config]")
{
  TempHome home;
  const auto cfg = home.write("cfg", R"(
# comment
Host gpu* !gpu9
    HostName %h.example.com
    User first
    IdentityFile ~/.ssh/a
Host gpu1
    User second
    IdentityFile ~/.ssh/b
    IdentityFile ~/.ssh/a
Host *
    Port=2222
    UserKnownHostsFile ~/.ssh/one "/tmp/two files"
)");
  const auto config = read(home.query("gpu1", cfg));
  CHECK(config.first_arg("hostname") == "%h.example.com");
  CHECK(config.first_arg("user") == "first");
  CHECK(config.first_arg("port") == "2222");
  REQUIRE(config.identity_files.size() == 2);
  CHECK(config.identity_files[0].args[0] == "~/.ssh/a");
  CHECK(config.identity_files[0].where.line == 6);
  CHECK(config.identity_files[1].args[0] == "~/.ssh/b");
  REQUIRE(config.find("userknownhostsfile") != nullptr);
  CHECK(config.find("userknownhostsfile")->args ==
        std::vector<std::string>{"~/.ssh/one", "/tmp/two files"});
  CHECK(config.files_read == std::vector<std::string>{cfg});

  const auto negated = read(home.query("gpu9", cfg));
  CHECK(negated.find("hostname") == nullptr);
  CHECK(negated.first_arg("port") == "2222");
}

TEST_CASE("ssh config: Match originalhost, host (after HostName), user, exec", "[ssh_config]")
{
  TempHome home;
  const auto cfg = home.write("cfg", R"(
Match originalhost alias
    HostName 10.0.0.7
Match host 10.0.0.7
    Port 2201
Match host alias
    Port 9999
Match user bob
    IdentityFile ~/.ssh/bob
Match exec "test %n = alias" user alice
    IdentitiesOnly yes
Match originalhost other exec "never %h"
    ProxyJump bastion
)");
  std::vector<std::string> ran;
  auto query = home.query("alias", cfg);
  query.run_command = [&ran](const std::string& command) {
    ran.push_back(command);
    return command == "test alias = alias" ? 0 : 1;
  };
  const auto config = read(query);
  CHECK(config.first_arg("hostname") == "10.0.0.7");
  CHECK(config.first_arg("port") == "2201"); // `Match host` sees the HostName, as in ssh
  CHECK(config.identity_files.empty());
  CHECK(config.first_arg("identitiesonly") == "yes");
  CHECK(config.find("proxyjump") == nullptr);
  CHECK(ran == std::vector<std::string>{"test alias = alias"}); // never run after a failure

  query.user = "bob";
  CHECK(read(query).identity_files.size() == 1);
  CHECK(read(query).find("identitiesonly") == nullptr);
}

TEST_CASE("ssh config: Match final is a second pass where Host lines match the HostName",
          "[ssh_config]")
{
  TempHome home;
  const auto cfg = home.write("cfg", R"(
Host alias
    HostName real.example.com
Host real.example.com
    User from-host-line
Match final host real.example.com
    Port 2022
Match !final
    IdentityFile ~/.ssh/first-pass-only
)");
  const auto config = read(home.query("alias", cfg));
  CHECK(config.first_arg("port") == "2022");
  CHECK(config.first_arg("user") == "from-host-line");
  CHECK(config.identity_files.size() == 1);

  const auto no_final = home.write("cfg2", "Host alias\n  HostName real\nHost real\n  User x\n");
  CHECK(read(home.query("alias", no_final)).find("user") == nullptr);
}

TEST_CASE("ssh config: Include under ~/.ssh, globs, blocks and the includer's state",
          "[ssh_config]")
{
  TempHome home;
  home.write(".ssh/conf.d/a.conf", "Host gpu1\n  User from-a\nMatch all\n  Port 2001\n");
  home.write(".ssh/conf.d/b.conf", "IdentityFile ~/.ssh/from-b\n");
  home.write(".ssh/skipped.conf", "User from-skipped\n");
  const auto cfg = home.write("cfg", R"(
Host other
    Include skipped.conf
Host gpu1
    Include conf.d/*.conf
    HostName after-include
)");
  const auto config = read(home.query("gpu1", cfg));
  CHECK(config.first_arg("user") == "from-a");
  CHECK(config.first_arg("port") == "2001");
  CHECK(config.identity_files.size() == 1);
  // The Match in a.conf ended with that file: gpu1's block goes on after the Include.
  CHECK(config.first_arg("hostname") == "after-include");
  CHECK(config.files_read.size() == 4); // cfg, both includes, and skipped.conf (read, not applied)
}

TEST_CASE("ssh config: what ssh refuses, ferry refuses with the file and line", "[ssh_config]")
{
  TempHome home;
  CHECK_THAT(refusal(home.query("h", home.write("c1", "Host h\n  Frobnicate yes\n"))),
             Catch::Contains("c1 line 2") &&
                 Catch::Contains("Bad configuration option: frobnicate"));
  const auto ignored = home.write("c2", "IgnoreUnknown frob*,other\nFrobnicate yes\nUser u\n");
  CHECK(read(home.query("h", ignored)).first_arg("user") == "u");
  CHECK_THAT(refusal(home.query("h", home.write("c3", "Match originalhost\n"))),
             Catch::Contains("Missing Match criteria"));
  CHECK_THAT(refusal(home.query("h", home.write("c4", "Match tagged x\n"))),
             Catch::Contains("Unsupported Match attribute tagged"));
  CHECK_THAT(refusal(home.query("h", home.write("c5", "User \"unclosed\n"))),
             Catch::Contains("invalid quotes"));
  CHECK_THAT(refusal(home.query("h", home.write("c6", "Match all host x\n"))),
             Catch::Contains("cannot be combined"));
  home.write(".ssh/loose.conf", "User loose\n", 0666);
  CHECK_THAT(refusal(home.query("h", home.write("c7", "Include loose.conf\n"))),
             Catch::Contains("Bad owner or permissions"));
  const std::string loop = (home.dir / "c8").string();
  CHECK_THAT(refusal(home.query("h", home.write("c8", "Include " + loop + "\n"))),
             Catch::Contains("Include nested more than"));
}

TEST_CASE("ssh config: ProxyJump and ProxyCommand share one slot", "[ssh_config]")
{
  TempHome home;
  const auto cfg = home.write("cfg", "Host a\n  ProxyCommand nc %h %p\nHost *\n  ProxyJump b\n");
  const auto config = read(home.query("a", cfg));
  REQUIRE(config.find("proxycommand") != nullptr);
  CHECK(config.find("proxycommand")->text == "nc %h %p");
  CHECK(config.find("proxyjump") == nullptr);
}

TEST_CASE("ssh config: no file, the default files and a missing --ssh-config", "[ssh_config]")
{
  TempHome home;
  home.write(".ssh/config", "Host *\n  User from-user-config\n", 0600);
  auto query = home.query("h", "");
  query.system_config = home.write("system", "Host *\n  User from-system\n  Port 2\n");
  const auto config = read(query);
  CHECK(config.first_arg("user") == "from-user-config");
  CHECK(config.first_arg("port") == "2");
  CHECK(read(home.query("h", "none")).values.empty());
  CHECK_THAT(refusal(home.query("h", (home.dir / "missing").string())),
             Catch::Contains("cannot read the ssh config"));
}

TEST_CASE("ssh config arguments split as OpenSSH splits them", "[ssh_config]")
{
  using V = std::vector<std::string>;
  CHECK(*split_config_args(R"(a "b c" 'd e' f\ g h\"i # comment)") ==
        V{"a", "b c", "d e", "f g", "h\"i"});
  CHECK(*split_config_args("x#y") == V{"x#y"});
  CHECK_FALSE(split_config_args("\"open"));
  CHECK(match_pattern("gpu12", "gpu*"));
  CHECK_FALSE(match_pattern("GPU1", "gpu1"));
  CHECK(match_pattern_list("gpu1", "cpu*,GPU?", true));
  CHECK_FALSE(match_pattern_list("gpu1", "gpu*,!gpu1", true));
}

TEST_CASE("%-tokens and environment variables expand, an unknown token is an error", "[ssh_config]")
{
  ::setenv("FERRY_TEST_DIR", "/srv/keys", 1);
  auto expanded = percent_expand("${FERRY_TEST_DIR}/%h-%p%%", {{'h', "gpu1"}, {'p', "22"}}, true,
                                 "IdentityFile");
  REQUIRE(expanded);
  CHECK(*expanded == "/srv/keys/gpu1-22%");
  auto unknown = percent_expand("%z", {{'h', "x"}}, false, "cfg line 3: ProxyCommand");
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message, Catch::Contains("cfg line 3") && Catch::Contains("%z"));
  CHECK_FALSE(percent_expand("${FERRY_TEST_UNSET_VARIABLE}", {}, true, "x"));
  CHECK(expand_tilde("~/.ssh/id", "/home/a") == "/home/a/.ssh/id");
  CHECK(expand_tilde("~", "/home/a") == "/home/a");
  CHECK(expand_tilde("~root/x", "/home/a") == "/root/x");
  CHECK(expand_tilde("/abs/~", "/home/a") == "/abs/~");
}

TEST_CASE("a config file is split once per process, and again when its bytes change",
          "[ssh_config]")
{
  TempHome home;
  const auto config = home.write("cfg", "Host a\n  Port 2201\nHost b\n  Port 2202\n");
  CHECK(read(home.query("a", config)).first_arg("port") == "2201");
  CHECK(read(home.query("b", config)).first_arg("port") == "2202"); // the same split, another host
  home.write("cfg", "Host a\n  Port 2301\nHost b\n  Port 2302\n");  // same size, same lines
  CHECK(read(home.query("a", config)).first_arg("port") == "2301");
  home.write("cfg", "Host a\n  Port 2301\n  Bogus yes\n");
  CHECK_THAT(refusal(home.query("a", config)),
             Catch::Contains("line 3: Bad configuration option: bogus"));
}
