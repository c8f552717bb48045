// The terminal's folded fleet summary (issue 43 item 4): host names as ClusterShell nodesets,
// runs grouped by the sameness of their result, and the fields that set a group apart.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "report/host_fold.hpp"
#include "report/result_fold.hpp"

using namespace ferry;
using nlohmann::json;

TEST_CASE("host names fold into nodeset ranges by their last number", "[fold]")
{
  CHECK(fold_hosts({"gpu1", "gpu2", "gpu3"}) == "gpu[1-3]");
  CHECK(fold_hosts({"gpu42", "gpu17"}) == "gpu[17,42]");
  CHECK(fold_hosts({"gpu3", "gpu1", "gpu2", "gpu7", "gpu9", "gpu8"}) == "gpu[1-3,7-9]");
  CHECK(fold_hosts({"gpu17"}) == "gpu17");
  CHECK(fold_hosts({}).empty());
  // Names given twice are listed once.
  CHECK(fold_hosts({"gpu2", "gpu1", "gpu2"}) == "gpu[1-2]");
  // A suffix after the number, and only the last number folds.
  CHECK(fold_hosts({"r2-n01-ib", "r2-n02-ib", "r3-n01-ib"}) == "r2-n[01-02]-ib,r3-n01-ib");
}

TEST_CASE("zero padding is kept as the names write it", "[fold]")
{
  std::vector<std::string> eight;
  for (int i = 1; i <= 8; ++i) {
    eight.push_back(fmt::format("gpu{:02}", i));
  }
  CHECK(fold_hosts(eight) == "gpu[01-08]");
  CHECK(fold_hosts({"gpu09", "gpu10", "gpu11"}) == "gpu[09-11]");
  CHECK(fold_hosts({"gpu9", "gpu10"}) == "gpu[9-10]");
  CHECK(fold_hosts({"gpu01", "gpu02", "gpu10"}) == "gpu[01-02,10]");
  CHECK(fold_hosts({"gpu001", "gpu002", "gpu01"}) == "gpu[01,001-002]");
  // The same number written two ways is two hosts.
  CHECK(fold_hosts({"gpu01", "gpu1"}) == "gpu[1,01]");
  CHECK(fold_hosts({"n0", "n1", "n00"}) == "n[0-1,00]");
}

TEST_CASE("names without a number, or with nodeset syntax, are listed as they are", "[fold]")
{
  CHECK(fold_hosts({"login", "local", "gpu1", "gpu2"}) == "gpu[1-2],local,login");
  CHECK(fold_hosts({"gpu", "gpu1", "gpu2"}) == "gpu,gpu[1-2]");
  // Sorted by prefix: "a3" is "a" and a number.
  CHECK(fold_hosts({"a[1]", "a,2", "a3"}) == "a3,a,2,a[1]");
  CHECK(fold_hosts({"ops@gpu1:2222", "ops@gpu1:2223"}) == "ops@gpu1:[2222-2223]");
  // A number too long to be one stays a name.
  CHECK(fold_hosts({"h12345678901234567890", "h2"}) == "h2,h12345678901234567890");
}

namespace {

HostOutcome ok_run(std::string host, json result)
{
  return {std::move(host), RunStatus::ok, "", "", std::move(result), "digest"};
}

HostOutcome failed_run(std::string host, RunStatus status, std::string generic)
{
  return {std::move(host), status, "own " + generic, std::move(generic), json(), "-"};
}

} // namespace

TEST_CASE("runs group by identical results, the largest ok group first", "[fold]")
{
  const json common = {{"driver", "550.54"}, {"gpus", 8}};
  json odd = common;
  odd["driver"] = "535.154";
  const auto groups = group_outcomes({
      failed_run("gpu05", RunStatus::error, "{host}: cannot connect"),
      ok_run("gpu01", common),
      ok_run("gpu17", odd),
      ok_run("gpu02", common),
      failed_run("gpu06", RunStatus::error, "{host}: cannot connect"),
      ok_run("gpu42", odd),
      ok_run("gpu03", common),
      failed_run("gpu07", RunStatus::timeout, "timed out"),
  });
  REQUIRE(groups.size() == 4);
  CHECK(groups[0].hosts == std::vector<std::string>{"gpu01", "gpu02", "gpu03"});
  CHECK(groups[0].reference);
  CHECK(groups[0].changes.empty());
  CHECK(groups[1].hosts == std::vector<std::string>{"gpu17", "gpu42"});
  CHECK_FALSE(groups[1].reference);
  REQUIRE(groups[1].changes.size() == 1);
  CHECK(groups[1].changes[0].path == "/driver");
  // Failures by status and message, larger groups first; one host keeps its own message.
  CHECK(groups[2].hosts == std::vector<std::string>{"gpu05", "gpu06"});
  CHECK(groups[2].error == "{host}: cannot connect");
  CHECK(groups[3].status == RunStatus::timeout);
  CHECK(groups[3].error == "own timed out");

  CHECK(render_groups(groups) == "gpu[01-03] (3 hosts): ok — digest\n"
                                 "gpu[17,42] (2 hosts): ok — driver \"535.154\" instead of "
                                 "\"550.54\"\n"
                                 "gpu[05-06] (2 hosts): error — {host}: cannot connect\n"
                                 "gpu07: timeout — own timed out\n");
}

TEST_CASE("with no ok run there is no reference, and nothing is diffed", "[fold]")
{
  const auto groups = group_outcomes({failed_run("a1", RunStatus::failed, "exit 1"),
                                      failed_run("a2", RunStatus::failed, "exit 1")});
  REQUIRE(groups.size() == 1);
  CHECK_FALSE(groups[0].reference);
  CHECK(groups[0].hosts.size() == 2);
}

TEST_CASE("changes are named by their path: changed, absent, added, and the rest counted", "[fold]")
{
  const json a = {{"driver", "550"}, {"gpus", {1, 2}}, {"x", 1}, {"y", 1}};
  const json b = {{"driver", "535"}, {"gpus", {1}}, {"new", true}, {"x", 2}, {"y", 1}};
  const auto changes = json_diff(a, b);
  CHECK(describe_changes(changes, 10) ==
        "driver \"535\" instead of \"550\"; gpus/1 absent (others: 2); x 2 instead of 1; "
        "new true (absent in others)");
  CHECK(describe_changes(changes, 2) ==
        "driver \"535\" instead of \"550\"; gpus/1 absent (others: 2); +2 more");
  CHECK(describe_changes(json_diff(json(4), json(5))) == "result 5 instead of 4");
}

TEST_CASE("a host's own names in an error are made generic", "[fold]")
{
  const json target = {{"host", "127.0.0.5"}, {"port", 2222}, {"user", "u"}};
  CHECK(generic_error("gpu5: cannot connect to 127.0.0.5:2222: refused", "gpu5", target) ==
        "{host}: cannot connect to {address}: refused");
  CHECK(generic_error("gpu5: key of 127.0.0.5 changed", "gpu5", target) ==
        "{host}: key of {address} changed");
  // The user gave the address itself: it is the host.
  CHECK(generic_error("10.0.0.1: down", "10.0.0.1", json{{"host", "10.0.0.1"}}) == "{host}: down");
  CHECK(generic_error("local: failed", "local", json{{"local", true}}) == "{host}: failed");
}

TEST_CASE("the summary escapes what hosts and results bring", "[fold]")
{
  const auto groups =
      group_outcomes({failed_run("evil\x1b]0;x\x07", RunStatus::error, "bad\x1b[2J")});
  const std::string text = render_groups(groups);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("\\x1b") != std::string::npos);
}
