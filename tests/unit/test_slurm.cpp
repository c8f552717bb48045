// The Slurm target's pieces that need no cluster: option checks and precedence, the [slurm]
// table, the submit script's frames, a job array's one follower, the verdicts on how a job ended,
// the shared allocation and the config file. The real cluster is tests/integration/test_slurm.py.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include <sys/wait.h>

#include "cli/slurm_cli.hpp"
#include "ferry/job.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/slurm_options.hpp"
#include "ferry/util.hpp"
#include "transport/slurm/allocation.hpp"
#include "transport/slurm/array_follow.hpp"
#include "transport/slurm/cluster.hpp"
#include "transport/slurm/frames.hpp"
#include "transport/slurm/verdict.hpp"

using namespace ferry;
using nlohmann::json;

namespace {

std::string error_of(const Expected<std::string>& checked)
{
  REQUIRE_FALSE(checked);
  CHECK(checked.error().kind == ErrorKind::usage);
  return checked.error().message;
}

std::string job_error(std::string_view slurm_lines)
{
  const std::string text =
      "# /// ferry\n# interpreter = \"sh\"\n# [slurm]\n" + std::string(slurm_lines) + "# ///\n";
  auto meta = parse_job_meta(text, "probe.sh");
  REQUIRE_FALSE(meta);
  return meta.error().message;
}

} // namespace

TEST_CASE("Slurm option values match strict patterns", "[slurm]")
{
  CHECK(*check_slurm_partition("gpu", "--partition") == "gpu");
  CHECK(*check_slurm_partition("gpu,debug-2", "--partition") == "gpu,debug-2");
  CHECK(*check_slurm_gres("gpu:8", "--gres") == "gpu:8");
  CHECK(*check_slurm_gres("gpu:a100:2,nvme", "--gres") == "gpu:a100:2,nvme");
  CHECK(*check_slurm_gpus("8", "--gpus") == "8");
  CHECK(*check_slurm_gpus("a100:4", "--gpus") == "a100:4");
  CHECK(*check_slurm_account("proj-42", "--account") == "proj-42");
  CHECK(*check_slurm_arg("--qos=high", "--slurm-arg") == "--qos=high");
  CHECK(*check_slurm_arg("--nodelist=n[1-2]", "--slurm-arg") == "--nodelist=n[1-2]");
  CHECK(*check_slurm_arg("--exclusive", "--slurm-arg") == "--exclusive");

  CHECK_THAT(error_of(check_slurm_partition("gpu;rm -rf ~", "--partition")),
             Catch::Contains("--partition 'gpu;rm -rf ~'") && Catch::Contains("letters"));
  CHECK_THAT(error_of(check_slurm_partition("", "--partition")), Catch::Contains("--partition"));
  CHECK_THAT(error_of(check_slurm_partition("a\nb", "--partition")), Catch::Contains("letters"));
  CHECK_THAT(error_of(check_slurm_gres("gpu:8 --wrap=x", "--gres")), Catch::Contains("gpu:8"));
  CHECK_THAT(error_of(check_slurm_gres("8:gpu", "--gres")), Catch::Contains("NAME[:TYPE]"));
  CHECK_THAT(error_of(check_slurm_gpus("0", "--gpus")), Catch::Contains("--gpus '0'"));
  CHECK_THAT(error_of(check_slurm_gpus("x", "--gpus")), Catch::Contains("--gres gpu:N"));
  CHECK_THAT(error_of(check_slurm_account("$(id)", "--account")), Catch::Contains("account"));
  CHECK_FALSE(check_slurm_time(0, "--time"));
  CHECK_FALSE(check_slurm_nodes(65, "--nodes"));
  CHECK(*check_slurm_nodes(2, "--nodes") == 2);
}

TEST_CASE("slurm-arg option: takes only allow-listed long options with plain values", "[slurm]")
{
  CHECK_THAT(error_of(check_slurm_arg("--output=/tmp/x", "--slurm-arg")),
             Catch::Contains("does not pass --output") && Catch::Contains("qos"));
  CHECK_THAT(error_of(check_slurm_arg("--wrap=id", "--slurm-arg")), Catch::Contains("--wrap"));
  CHECK_THAT(error_of(check_slurm_arg("--export=LD_PRELOAD=/x", "--slurm-arg")),
             Catch::Contains("--export"));
  CHECK_THAT(error_of(check_slurm_arg("--partition=gpu", "--slurm-arg")),
             Catch::Contains("use ferry's own --partition"));
  CHECK_THAT(error_of(check_slurm_arg("-p", "--slurm-arg")), Catch::Contains("long form"));
  CHECK_THAT(error_of(check_slurm_arg("--qos", "--slurm-arg")), Catch::Contains("needs a value"));
  CHECK_THAT(error_of(check_slurm_arg("--contiguous=yes", "--slurm-arg")),
             Catch::Contains("takes no value"));
  CHECK_THAT(error_of(check_slurm_arg("--qos=high low", "--slurm-arg")),
             Catch::Contains("the value may use only"));
  CHECK_THAT(error_of(check_slurm_arg("--comment=$(id)", "--slurm-arg")),
             Catch::Contains("the value may use only"));
}

TEST_CASE("a job's [slurm] table is read and checked where it stands", "[slurm]")
{
  auto meta = parse_job_meta("# /// ferry\n# interpreter = \"sh\"\n# [slurm]\n"
                             "# partition = \"gpu\"\n# gres = \"gpu:8\"\n# time = 5\n"
                             "# nodes = 2\n# args = [\"--qos=high\"]\n# ///\n",
                             "probe.sh");
  REQUIRE(meta);
  CHECK(meta->slurm.partition == "gpu");
  CHECK(meta->slurm.gres == "gpu:8");
  CHECK(meta->slurm.time_min == 5);
  CHECK(meta->slurm.nodes == 2);
  CHECK(meta->slurm.args == std::vector<std::string>{"--qos=high"});

  CHECK_THAT(job_error("# partition = \"a b\"\n"),
             Catch::Contains("probe.sh:4:") && Catch::Contains("slurm.partition 'a b'"));
  CHECK_THAT(job_error("# gres = \"gpu:8\"\n# gpus = 8\n"), Catch::Contains("exclude each other"));
  CHECK_THAT(job_error("# time = \"5\"\n"), Catch::Contains("slurm.time must be a whole number"));
  CHECK_THAT(job_error("# queue = \"x\"\n"), Catch::Contains("unknown key 'queue'"));
  CHECK_THAT(job_error("# args = [\"--uid=0\"]\n"), Catch::Contains("does not pass --uid"));
}

TEST_CASE("the command line wins over the job, the job over the config", "[slurm]")
{
  SlurmOptions command_line;
  command_line.partition = "cli";
  command_line.args = {"--qos=urgent"};
  SlurmOptions job;
  job.partition = "job";
  job.gres = "gpu:8";
  job.time_min = 5;
  job.args = {"--qos=normal", "--constraint=a100"};
  SlurmOptions config;
  config.account = "team";
  config.gpus = "2";
  config.time_min = 60;

  const auto merged = merge_slurm_options(command_line, merge_slurm_options(job, config));
  CHECK(merged.partition == "cli");
  CHECK(merged.gres == "gpu:8");
  CHECK_FALSE(merged.gpus); // one GPU request: the job's gres replaces the config's gpus
  CHECK(merged.time_min == 5);
  CHECK(merged.account == "team");
  CHECK(merged.args == std::vector<std::string>{"--qos=urgent", "--constraint=a100"});
  CHECK(sbatch_options(merged) == std::vector<std::string>{"--partition=cli", "--gres=gpu:8",
                                                           "--time=5", "--account=team",
                                                           "--qos=urgent", "--constraint=a100"});

  auto back = slurm_options_from_json(slurm_options_json(merged));
  REQUIRE(back);
  CHECK(slurm_options_json(*back) == slurm_options_json(merged));
}

TEST_CASE("slurm time option: follows the job's timeout with room for the launcher to stop it",
          "[slurm]")
{
  CHECK(slurm_minutes_for(1, 2) == 1);
  CHECK(slurm_minutes_for(40, 2) == 1);
  CHECK(slurm_minutes_for(60, 2) == 2);
  CHECK(slurm_minutes_for(300, 2) == 6);
}

TEST_CASE("frames carry control lines and counted chunks, however the bytes are cut",
          "[slurm][frames]")
{
  std::vector<std::string> lines;
  std::string out;
  std::string err;
  slurm::FrameReader reader(
      "T",
      [&](const auto& words) {
        std::string line;
        for (auto w : words) {
          line += (line.empty() ? "" : " ") + std::string(w);
        }
        lines.push_back(line);
      },
      [&](OutputStream s, std::string_view b) { (s == OutputStream::out ? out : err) += b; });
  // The job printed something that looks like a frame: as payload it is only bytes.
  const std::string payload = "T end COMPLETED 0:0 n1 x\nT out 99\n";
  const std::string stream = "T job 42\nT state PENDING Resources\nT out " +
                             std::to_string(payload.size()) + "\n" + payload +
                             "T err 3\nab\nT node n1\nT end FAILED 3:0 n[1-2] scontrol\n";
  for (std::size_t cut = 1; cut < stream.size(); cut += 7) {
    lines.clear();
    out.clear();
    err.clear();
    slurm::FrameReader fresh = reader;
    fresh.feed(stream.substr(0, cut));
    fresh.feed(stream.substr(cut));
    CHECK_FALSE(fresh.broken());
    CHECK_FALSE(fresh.midway());
    CHECK(out == payload);
    CHECK(err == "ab\n");
    CHECK(lines == std::vector<std::string>{"job 42", "state PENDING Resources", "node n1",
                                            "end FAILED 3:0 n[1-2] scontrol"});
  }
}

TEST_CASE("a stream that is not frames is refused, not guessed at", "[slurm][frames]")
{
  const auto broken = [](std::string_view text) {
    slurm::FrameReader reader(
        "T", [](const auto&) {}, [](OutputStream, std::string_view) {});
    reader.feed(text);
    return reader.broken().value_or("");
  };
  CHECK_THAT(broken("hello\n"), Catch::Contains("unexpected line"));
  CHECK_THAT(broken("U job 1\n"), Catch::Contains("unexpected line"));
  CHECK_THAT(broken("T out -1\n"), Catch::Contains("bad chunk header"));
  CHECK_THAT(broken("T out 999999999999\n"), Catch::Contains("bad chunk header"));
  CHECK_THAT(broken(std::string(5000, 'x')), Catch::Contains("without a newline"));
  slurm::FrameReader cut(
      "T", [](const auto&) {}, [](OutputStream, std::string_view) {});
  cut.feed("T out 10\nabc");
  CHECK(cut.midway());
}

TEST_CASE("a job array's frames name the task they are about", "[slurm][frames]")
{
  std::vector<std::string> seen;
  std::string out;
  slurm::FrameReader reader(
      "T",
      [&](const auto& words) {
        seen.push_back(fmt::format("{}:{}", reader.task(), std::string(words[0])));
      },
      [&](OutputStream, std::string_view bytes) {
        out += fmt::format("{}:{}", reader.task(), std::string(bytes));
      },
      true);
  reader.feed("T job 42\nT 3 out 3\nab\nT 0 state RUNNING -\nT note squeue: 12 down\n"
              "T 12 end COMPLETED 0:0 n1 scontrol\n");
  CHECK_FALSE(reader.broken());
  CHECK(seen == std::vector<std::string>{"-1:job", "0:state", "-1:note", "12:end"});
  CHECK(out == "3:ab\n");
  reader.feed("T 4\n");
  CHECK_THAT(reader.broken().value_or(""), Catch::Contains("nothing after its task"));
}

namespace {

// A point of a job array as SlurmSession::follow_point sees it, on a thread of its own.
struct ArrayPoint {
  ExecRequest request;
  std::optional<slurm::Follow> follow;
  std::string job;
  std::atomic<int> cancels{0};
  std::optional<ExecOutcome> outcome;

  explicit ArrayPoint(std::chrono::milliseconds deadline)
  {
    request.end_marker = "END";
    request.deadline = deadline;
    request.stop = StopToken::make();
    follow.emplace(request, "", [this](std::string id) { job = std::move(id); });
  }
  void run(slurm::ArrayFollow& array, int task)
  {
    array.enroll(task, *follow);
    auto script = array.wait(task, request.stop, [this] { ++cancels; });
    REQUIRE(script);
    outcome = follow->outcome(std::move(*script), slurm::NodeRun{});
  }
};

} // namespace

TEST_CASE("one follower serves every point of a job array, each its own task", "[slurm]")
{
  slurm::ArrayFollow array(2);
  ArrayPoint zero(std::chrono::hours(1));
  ArrayPoint one(std::chrono::milliseconds(50));
  std::atomic<bool> cancelled{false};
  // The script: point 1 runs past its deadline and must be cancelled alone, point 0 goes on.
  array.arm(
      [&](const ExecRequest& script) -> Expected<ExecOutcome> {
        script.on_output(OutputStream::out,
                         "T job 42\nT 1 state RUNNING None\nT 0 out 6\nzero\n\n");
        while (!cancelled) {
          script.on_output(OutputStream::out, "T 1 out 4\none\n");
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        script.on_output(OutputStream::out, "T 1 end CANCELLED 0:15 n2 scontrol\n"
                                            "T 0 end COMPLETED 0:0 n1 scontrol\n");
        return ExecOutcome{};
      },
      ExecRequest{}, "T");
  std::thread first([&] { zero.run(array, 0); });
  std::thread second([&] { one.run(array, 1); });
  for (int i = 0; i < 500 && one.cancels == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  cancelled = true;
  first.join();
  second.join();
  CHECK(zero.job == "42_0");
  CHECK(one.job == "42_1");
  CHECK(zero.cancels == 0);
  CHECK(one.cancels == 1);
  REQUIRE(zero.outcome);
  REQUIRE(one.outcome);
  CHECK(zero.outcome->out.bytes == "zero\n\n");
  CHECK(zero.outcome->end == ExecEnd::exited);
  CHECK(one.outcome->out.bytes.starts_with("one\none\n"));
  CHECK(one.outcome->end == ExecEnd::deadline);
  CHECK(zero.follow->end()->state == "COMPLETED");
  CHECK(one.follow->end()->state == "CANCELLED");
}

TEST_CASE("a job array that cannot be followed fails every point", "[slurm]")
{
  slurm::ArrayFollow array(2);
  ArrayPoint zero(std::chrono::hours(1));
  array.enroll(0, *zero.follow);
  array.abandon("the login node refused the script");
  auto script = array.wait(0, zero.request.stop, [] {});
  REQUIRE_FALSE(script);
  CHECK_THAT(script.error().message, Catch::Contains("the login node refused the script"));
}

TEST_CASE("how a Slurm job ended decides the run's verdict", "[slurm]")
{
  using Kind = ExecOutcome::Verdict::Kind;
  slurm::NodeRun run;
  run.run_dir = "/home/u/.cache/ferry/runs/ferry-x";
  run.node = "n1";
  run.launcher_report = true;
  run.time_min = 1;
  slurm::JobEnd end;
  end.state = "COMPLETED";
  end.exit_code = 0;
  end.source = "scontrol";
  CHECK_FALSE(slurm::slurm_verdict(end, run)); // the launcher's report decides

  end.state = "FAILED";
  end.exit_code = 3;
  CHECK_FALSE(slurm::slurm_verdict(end, run));

  end.state = "TIMEOUT";
  auto verdict = slurm::slurm_verdict(end, run);
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::timeout);
  CHECK_THAT(verdict->message, Catch::Contains("--time 1 min") && Catch::Contains("TIMEOUT"));

  end.state = "CANCELLED";
  verdict = slurm::slurm_verdict(end, run);
  REQUIRE(verdict);
  CHECK_THAT(verdict->message, Catch::Contains("cancelled outside ferry"));
  run.stopped_by_ferry = true;
  CHECK_FALSE(slurm::slurm_verdict(end, run));
  run.stopped_by_ferry = false;

  end.state = "OUT_OF_MEMORY";
  CHECK_THAT(slurm::slurm_verdict(end, run)->message, Catch::Contains("--mem"));
  end.state = "NODE_FAIL";
  CHECK(slurm::slurm_verdict(end, run)->kind == Kind::error);

  // The node never entered its run directory.
  run.node.clear();
  run.launcher_report = false;
  end.state = "FAILED";
  end.exit_code = slurm::k_no_run_dir_exit;
  end.nodes = "n3";
  verdict = slurm::slurm_verdict(end, run);
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::error);
  CHECK_THAT(verdict->message, Catch::Contains("node n3 cannot see the run directory "
                                               "/home/u/.cache/ferry/runs/ferry-x") &&
                                   Catch::Contains("--remote-base"));

  end.exit_code = 0;
  end.signal = 53;
  CHECK_THAT(slurm::slurm_verdict(end, run)->message,
             Catch::Contains("before ferry's launcher started") && Catch::Contains("0:53"));

  CHECK(slurm::parse_exit_code("3:0") == std::pair{3, 0});
  CHECK(slurm::parse_exit_code("0:15") == std::pair{0, 15});
  CHECK_FALSE(slurm::parse_exit_code("-"));
  CHECK(slurm::is_final_state("OUT_OF_MEMORY"));
  CHECK_FALSE(slurm::is_final_state("COMPLETING"));
}

TEST_CASE("the node slots of an allocation meet before it is submitted", "[slurm]")
{
  slurm::SharedAllocation allocation(2);
  const StopToken stop = StopToken::make();
  std::optional<Expected<std::vector<std::string>>> second;
  std::thread peer([&] { second.emplace(allocation.join(0, 1, "/r/b", stop)); });
  auto first = allocation.join(0, 0, "/r/a", stop);
  peer.join();
  REQUIRE(first);
  REQUIRE(*second);
  CHECK(*first == std::vector<std::string>{"/r/a", "/r/b"});
  CHECK(**second == *first);

  allocation.submitted(0, "42");
  CHECK(*allocation.job_of(0, stop) == "42");

  // A slot whose run could not be staged fails the round for the others, at once.
  allocation.abandon(1, "node slot 2 of 2: its run could not be staged");
  auto failed = allocation.join(1, 0, "/r/c", stop);
  REQUIRE_FALSE(failed);
  CHECK_THAT(failed.error().message, Catch::Contains("its run could not be staged"));

  // A slot that left (could not connect) fails every later round.
  allocation.leave(1, "cannot connect");
  auto left = allocation.join(2, 0, "/r/d", stop);
  REQUIRE_FALSE(left);
  CHECK_THAT(left.error().message, Catch::Contains("node slot 2 of 2 dropped out: cannot connect"));

  // A stop request ends the wait.
  slurm::SharedAllocation three(3);
  stop.request_stop();
  auto stopped = three.join(0, 0, "/r/e", stop);
  REQUIRE_FALSE(stopped);
  CHECK_THAT(stopped.error().message, Catch::Contains("interrupted"));
}

TEST_CASE("the submit script is filled with quoted fields and parses under sh", "[slurm]")
{
  const std::string script = fill_template(
      remote_script("submit.sh"), {{"slurm_state", std::string(remote_script("slurm_state.sh"))},
                                   {"run_dir", sh_quote("/runs/ferry-x")},
                                   {"tag", sh_quote("ferry-slurm-1")},
                                   {"job_id", sh_quote("")},
                                   {"job_name", sh_quote("ferry-a'b-1")},
                                   {"end_marker", sh_quote("ferry-end-1")},
                                   {"sentinel", sh_quote("ferry-submit-1")},
                                   {"mode", sh_quote("attach")}});
  CHECK(script.find("run_dir='/runs/ferry-x'") != std::string::npos);
  CHECK(script.find("mode='attach'") != std::string::npos);
  CHECK(script.find("job_name='ferry-a'\\''b-1'") != std::string::npos);
  const auto path = std::filesystem::temp_directory_path() / "ferry-unit-submit.sh";
  std::ofstream(path) << script;
  CHECK(std::system(("sh -n " + path.string()).c_str()) == 0);
  std::filesystem::remove(path);
  CHECK_FALSE(remote_script("slurm_batch.sh").empty());
  const std::string array =
      fill_template(remote_script("follow_array.sh"),
                    {{"slurm_state", std::string(remote_script("slurm_state.sh"))},
                     {"run_dirs", "'/runs/a' '/runs/b c'"},
                     {"tag", sh_quote("ferry-slurm-1")},
                     {"job_name", sh_quote("ferry-a'b-1")},
                     {"end_marker", sh_quote("ferry-end-1")},
                     {"sentinel", sh_quote("ferry-submit-1")}});
  CHECK(array.find("set -- '/runs/a' '/runs/b c'") != std::string::npos);
  CHECK(array.find("final_state() {") != std::string::npos);
  std::ofstream(path) << array;
  CHECK(std::system(("sh -n " + path.string()).c_str()) == 0);
  std::filesystem::remove(path);
}

namespace {

// The batch script's task for one run directory, its launcher a stand-in that leaves and removes
// its state file as a kept run's does and exits 3: the state file afterwards ("" when none), and
// the task's exit status. In a session of its own: the task signals its process group at the end.
std::pair<std::string, int> batch_task_with(const std::optional<std::string>& keep_for)
{
  const auto dir = std::filesystem::temp_directory_path() / ("ferry-unit-batch-" + random_hex(6));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "launch.sh") << "printf '7 +302\\n' >.ferry-launcher\n"
                                   << "rm -f .ferry-launcher\nexit 3\n";
  std::ofstream(dir / "batch.sh") << remote_script("slurm_batch.sh");
  if (keep_for) {
    std::ofstream(dir / ".ferry-keep-for") << *keep_for;
  }
  const int status =
      std::system(("env -u SLURM_ARRAY_TASK_ID -u SLURM_NODEID setsid -w /bin/sh " +
                   sh_quote((dir / "batch.sh").string()) + " " + sh_quote(dir.string()))
                      .c_str());
  std::ifstream in(dir / ".ferry-launcher");
  std::string state((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return {state, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

} // namespace

TEST_CASE("a detached run's batch task leaves its --keep-for in the launcher's state file",
          "[slurm][detach]")
{
  // Once the launcher has ended: `PID +SECONDS`, for the run base's sweep (docs/slurm.md).
  const auto [kept, kept_status] = batch_task_with("60\n");
  CHECK(kept_status == 3);
  CHECK_THAT(kept, Catch::Matches("[0-9]+ \\+60\n"));
  // A run ferry follows (no --keep-for), or a garbled file: nothing is left for the sweep.
  for (const auto& keep_for : {std::optional<std::string>(), std::optional<std::string>("6x0")}) {
    const auto [state, status] = batch_task_with(keep_for);
    CHECK(status == 3);
    CHECK(state.empty());
  }
}

namespace {

// slurm_state.sh's `submit` with a stand-in sbatch that prints `said`: what the script prints
// and its exit status.
std::pair<std::string, int> submit_with(const std::string& said)
{
  const auto dir = std::filesystem::temp_directory_path() / ("ferry-unit-submit-" + random_hex(6));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "args") << "--parsable\n";
  std::ofstream(dir / "run.sh") << remote_script("slurm_state.sh") << "\n"
                                << "tick=0.01 stopping=0 end_marker=x\n"
                                << "cancel() { echo cancelled; }\n"
                                << "sbatch() { printf '%s' " << sh_quote(said) << "; }\n"
                                << "submit " << sh_quote((dir / "args").string()) << "\n"
                                << "printf '[%s]\\n' \"$job\"\n";
  const int status = std::system(
      ("sh " + (dir / "run.sh").string() + " >" + (dir / "out").string() + " 2>&1").c_str());
  std::ifstream in(dir / "out");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

} // namespace

TEST_CASE("sbatch's job id is trimmed and checked once for both submit scripts", "[slurm]")
{
  CHECK(submit_with("4242\n") == std::pair<std::string, int>("[4242]\n", 0));
  CHECK(submit_with(" 4242;cluster1\r\n") == std::pair<std::string, int>("[4242]\n", 0));
  CHECK(submit_with("\t17 \n") == std::pair<std::string, int>("[17]\n", 0));
  const auto [out, status] = submit_with("Submitted batch job 12\n");
  CHECK(status == 3);
  CHECK_THAT(out, Catch::Contains("sbatch printed no job id: Submitted batch job 12"));
  CHECK(submit_with("").second == 3);
  CHECK(submit_with("12_3\n").second == 3); // an array task is no job of its own
}

TEST_CASE("scontrol's one-line records become objects", "[slurm]")
{
  const auto records = slurm::parse_scontrol_records(
      "PartitionName=debug AllowGroups=ALL Default=YES Nodes=n[1-2] State=UP\n"
      "NodeName=n1 Gres=gpu:8 OS=Linux 6.1.0 #1 SMP Partitions=debug,gpu\n");
  REQUIRE(records.size() == 2);
  CHECK(records[0]["Nodes"] == "n[1-2]");
  CHECK(records[0]["Default"] == "YES");
  CHECK(records[1]["Gres"] == "gpu:8");
  CHECK(records[1]["Partitions"] == "debug,gpu");
}

TEST_CASE("the user config file's [slurm] table is checked like a job's", "[slurm]")
{
  const auto path = std::filesystem::temp_directory_path() / "ferry-unit-config.toml";
  const auto load = [&](std::string_view text) {
    std::ofstream(path) << text;
    return cli::config_slurm_options(path.string());
  };
  auto options = load("[slurm]\npartition = \"gpu\"\naccount = \"team\"\nargs = [\"--qos=low\"]\n");
  REQUIRE(options);
  CHECK(options->partition == "gpu");
  CHECK(options->args == std::vector<std::string>{"--qos=low"});

  auto bad = load("[slurm]\n\npartition = \"g p u\"\n");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().kind == ErrorKind::usage);
  CHECK_THAT(bad.error().message, Catch::Contains(path.string() + ":3:"));
  bad = load("[slurmm]\n");
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("unknown key 'slurmm'"));
  bad = load("[slurm\n");
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("invalid TOML"));
  std::filesystem::remove(path);
  auto none = cli::config_slurm_options(path.string());
  REQUIRE(none);
  CHECK(none->empty());
}
