#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/shell_neutral.hpp"
#include "ferry/text.hpp"
#include "ferry/transport.hpp"
#include "transport/exec_request.hpp"

using namespace ferry;

TEST_CASE("only [A-Za-z0-9/._-] tokens separated by single spaces are shell-neutral", "[exec]")
{
  CHECK(is_shell_neutral_command(
      "/bin/sh /home/u/.cache/ferry/runs/ferry-20261129T141215Z-3f9a/launch.sh"));
  CHECK(is_shell_neutral_command("true"));
  for (const char* bad :
       {"",      " ",   "/bin/sh  x", "/bin/sh x ", " /bin/sh", "a;b",  "a|b", "a&b",
        "$HOME", "a'b", "a\"b",       "a\\b",       "a*b",      "a?b",  "[a]", "{a,b}",
        "~root", "a!b", "(a)",        "a#b",        "a\tb",     "a\nb", "a=b", "a:b",
        "a%b",   "a^b", "a,b",        "a@b",        "a+b",      "日本", "a\rb"}) {
    INFO(bad);
    CHECK_FALSE(is_shell_neutral_command(bad));
  }
  CHECK(shell_neutral_command({"/bin/sh", "/x/launch.sh"}).value() == "/bin/sh /x/launch.sh");
  auto refused = shell_neutral_command({"/bin/sh", "/home/my user/launch.sh"});
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("remote_base"));
}

TEST_CASE("sh_quote survives every byte but NUL", "[launcher]")
{
  CHECK(sh_quote("abc") == "'abc'");
  CHECK(sh_quote("it's") == "'it'\\''s'");
  CHECK(sh_quote("") == "''");
}

// A launcher's fields as a run fills them in, for a python3 job.
static LauncherSpec python_launcher(std::string run_dir, std::string job_file, std::string job_name,
                                    std::string sentinel)
{
  LauncherSpec spec;
  spec.run_dir = std::move(run_dir);
  spec.job_file = std::move(job_file);
  spec.job_name = std::move(job_name);
  spec.interpreter = "python3";
  spec.timeout_s = 42;
  spec.grace_s = 3;
  spec.sentinel = std::move(sentinel);
  return spec;
}

TEST_CASE("the launcher sets the contract's variables and never executes the job file",
          "[launcher]")
{
  const LauncherSpec spec = python_launcher("/home/u/.cache/ferry/runs/ferry-1-ab", "kv_calc.py",
                                            "kv'calc", "ferry-start-123");
  const std::string text = make_launcher(spec);
  CHECK_THAT(text, Catch::Contains("FERRY_RUN_DIR='/home/u/.cache/ferry/runs/ferry-1-ab'"));
  CHECK_THAT(text,
             Catch::Contains("FERRY_PARAMS='/home/u/.cache/ferry/runs/ferry-1-ab'/params.json"));
  CHECK_THAT(text,
             Catch::Contains("FERRY_RESULT='/home/u/.cache/ferry/runs/ferry-1-ab'/result.json"));
  CHECK_THAT(text, Catch::Contains("FERRY_JOB='kv'\\''calc'"));
  CHECK_THAT(text, Catch::Contains("export FERRY_RUN_DIR FERRY_PARAMS FERRY_RESULT FERRY_JOB"));
  // The job runs with SIGPIPE as it should be; only the launcher ignores it. `env -i`: the job
  // inherits only the variables the launcher lists.
  CHECK_THAT(text,
             Catch::Contains("(trap - PIPE; exec setsid env -i \"$@\" \"$interpreter\" "
                             "\"$FERRY_RUN_DIR\"/'kv_calc.py' </dev/null >&5 2>&6 5>&- 6>&-) &"));
  CHECK_THAT(text, Catch::Contains("nap 42 ||"));
  CHECK_THAT(text, Catch::Contains("nap 3 ||"));
  CHECK_THAT(text, Catch::Contains("interpreter='python3'"));
  CHECK_THAT(text, Catch::Contains("printf '%s\\n' 'ferry-start-123'\n"));
  CHECK_THAT(text, Catch::Contains("cd \"$FERRY_RUN_DIR\""));
  // The job file is an argument of the interpreter, never a command of its own.
  CHECK(text.find("\"$FERRY_RUN_DIR\"/'kv_calc.py' </dev/null >&5") != std::string::npos);
  CHECK(text.find("\n\"$FERRY_RUN_DIR\"/'kv_calc.py'") == std::string::npos);
}

TEST_CASE("the launcher's second line hands a job without declared environment to the python "
          "standby, in hex, its interpreter last",
          "[launcher]")
{
  LauncherSpec spec = python_launcher("/r/ferry-1-ab", "j.py", "a b\n'c", "S");
  spec.end_marker = "E";
  spec.params = "{\"k\": 1}";
  spec.job_sha256 = "ab";
  const auto second_line = [&] {
    const std::string text = make_launcher(spec);
    const auto first = text.find('\n');
    return text.substr(first + 1, text.find('\n', first + 1) - first - 1);
  };
  // Fields in standby.py's order: run_dir, job_name, job_file, sentinel, end_marker, timeout,
  // grace, timeout_marker, timeout_exit, state_file, launch_file, params_size, frame_limit, keep,
  // job_sha256, interpreter.
  CHECK(second_line() ==
        "# ferry-standby 2 2f722f66657272792d312d6162 6120620a2763 6a2e7079 53 45 "
        "3432 33 2e66657272792d74696d656f7574 313234 2e66657272792d6c61756e63686572 "
        "6c61756e63682e7368 38 38333838363038 30 6162 707974686f6e33");
  CHECK(runs_on_python_ahead(spec));
  spec.keep_run_dir = true;
  CHECK(second_line().ends_with(" 31 6162 707974686f6e33"));
  spec.env = {{"PYTHONPATH", "/x"}}; // could change how the interpreter starts
  CHECK(second_line() == "#");
  CHECK_FALSE(runs_on_standby(spec));
  spec.env.clear();
  spec.interpreter = "/usr/bin/python3";
  CHECK(second_line().ends_with(" 31 6162 2f7573722f62696e2f707974686f6e33"));
  CHECK(runs_on_standby(spec));
  CHECK_FALSE(runs_on_python_ahead(spec));
  spec.interpreter = "sh";
  CHECK(second_line().ends_with(" 31 6162 7368"));
}

TEST_CASE("the python standby takes the standby line's prefix and field names from the list that "
          "writes the line",
          "[launcher]")
{
  const std::string_view script = standby_script();
  CHECK_THAT(std::string(script), Catch::Contains("SPEC_PREFIX = b\"# ferry-standby 2 \"\n"));
  CHECK_THAT(
      std::string(script),
      Catch::Contains("SPEC_FIELDS = \"run_dir job_name job_file sentinel end_marker timeout "
                      "grace timeout_marker timeout_exit state_file launch_file params_size "
                      "frame_limit keep job_sha256 interpreter\".split()\n"));
  CHECK(script.find("@standby_") == std::string_view::npos);
}

TEST_CASE("output before the sentinel is set aside and after it kept up to the cap", "[capture]")
{
  OutputCapture capture("ferry-start-1", 10);
  capture.feed("hello from zshenv\nferry-st");
  capture.feed("art-1\n0123456");
  capture.feed("789abc");
  const CapturedStream out = std::move(capture).finish();
  CHECK(out.saw_sentinel);
  CHECK(out.before_sentinel == "hello from zshenv\n");
  CHECK(out.bytes == "0123489abc"); // the first and the last half of the cap
  CHECK(out.truncated);
  CHECK(out.dropped == 3);
}

TEST_CASE("a stream without the sentinel comes back as it came", "[capture]")
{
  OutputCapture capture("ferry-start-1", 100);
  capture.feed("sh: 1: bad: not found\n");
  const CapturedStream out = std::move(capture).finish();
  CHECK_FALSE(out.saw_sentinel);
  CHECK(out.bytes == "sh: 1: bad: not found\n");
}

TEST_CASE("memory stays bounded however much arrives", "[capture]")
{
  OutputCapture capture("ferry-start-1", 1000);
  const std::string chunk(1 << 16, 'x');
  for (int i = 0; i < 64; ++i) {
    capture.feed(chunk); // 4 MiB of noise before any sentinel
  }
  capture.feed("ferry-start-1\n");
  for (int i = 0; i < 64; ++i) {
    capture.feed(chunk);
  }
  const CapturedStream out = std::move(capture).finish();
  CHECK(out.bytes.size() == 1000);
  CHECK(out.before_sentinel.size() <= 64 * 1024);
  CHECK(out.dropped == 64u * (1u << 16) - 1000);
}

TEST_CASE("the launcher's last line is not the job's", "[capture]")
{
  OutputCapture capture("ferry-start-1", 10, "ferry-end-1");
  capture.feed("ferry-start-1\nno newline");
  capture.feed("ferry-end-1 0 exit\n");
  const CapturedStream out = std::move(capture).finish();
  CHECK(out.bytes == "no newline");
  CHECK_FALSE(out.truncated);
}

TEST_CASE("live output passes on the job's bytes as they come, without the launcher's lines",
          "[capture]")
{
  std::string streamed;
  OutputCapture capture("ferry-start-1", 4, "ferry-end-1",
                        [&](std::string_view bytes) { streamed += bytes; });
  capture.feed("noise\nferry-start-1\nline 1\n");
  CHECK(streamed == "line 1\n"); // at once: nothing held back that cannot be the end marker
  capture.feed("line 2\nferry-en");
  capture.feed("d-1 0 exit\n");
  const CapturedStream out = std::move(capture).finish();
  CHECK(streamed == "line 1\nline 2\n");
  CHECK(out.bytes == "li2\n");
  CHECK(out.dropped == 10); // the job's bytes past the cap, not the launcher's last line
}

TEST_CASE("a job line that only starts like the end marker is the job's", "[capture]")
{
  std::string streamed;
  OutputCapture capture("s", 100, "ferry-end-1",
                        [&](std::string_view bytes) { streamed += bytes; });
  capture.feed("s\nferry-end-2 0 exit\n");
  const CapturedStream out = std::move(capture).finish();
  CHECK(streamed == "ferry-end-2 0 exit\n");
  CHECK(out.bytes == "ferry-end-2 0 exit\n");
}

TEST_CASE("the launcher's report names how the job ended", "[launcher]")
{
  const auto timeout = parse_launcher_report("124 timeout\n");
  REQUIRE(timeout);
  CHECK(timeout->code == 124);
  CHECK(timeout->cause == LauncherCause::timeout);
  CHECK(parse_launcher_report("0 exit\n")->cause == LauncherCause::exited);
  CHECK(parse_launcher_report("143 stopped\n")->cause == LauncherCause::stopped);
  for (const char* bad : {"", "0 exit", "x exit\n", "0 other\n", "0\n", " exit\n"}) {
    INFO(bad);
    CHECK_FALSE(parse_launcher_report(bad));
  }
  CHECK(parse_launcher_report("0 exit\n")->result == ReportedResult::unknown);
}

TEST_CASE("the launcher's report carries result.json's bytes, framed by their size", "[launcher]")
{
  // The bytes may hold anything, a line that looks like the clean line or the end marker.
  const std::string bytes = "{\"a\": \"clean removed\\n\"}\nclean removed\nferry-end-1 0 exit\n";
  const auto report = parse_launcher_report(
      fmt::format("3 exit\nresult file {}\n{}clean removed\n", bytes.size(), bytes));
  REQUIRE(report);
  CHECK(report->code == 3);
  CHECK(report->result == ReportedResult::file);
  CHECK(report->result_bytes == bytes);
  CHECK(report->run_dir_removed);
  const auto kept = parse_launcher_report("0 exit\nresult fetch\nclean kept\n");
  REQUIRE(kept);
  CHECK(kept->result == ReportedResult::fetch);
  CHECK_FALSE(kept->run_dir_removed);
  CHECK(parse_launcher_report("0 exit\nresult link\nclean failed\n")->result ==
        ReportedResult::link);
  CHECK(parse_launcher_report("0 exit\nresult none\nclean removed\n")->result ==
        ReportedResult::none);
  // A frame whose size does not match, or anything after the clean line: the result is
  // fetched and the directory cleaned by ferry, as without a frame.
  for (const char* garbled :
       {"0 exit\nresult file 5\nabcclean removed\n", "0 exit\nresult file 2\nabcclean removed\n",
        "0 exit\nresult none\nclean removed\nstray\n", "0 exit\nresult maybe\nclean removed\n",
        "0 exit\nresult file\nclean removed\n", "0 exit\nresult none\n"}) {
    INFO(garbled);
    const auto read = parse_launcher_report(garbled);
    REQUIRE(read);
    CHECK(read->result == ReportedResult::unknown);
    CHECK_FALSE(read->run_dir_removed);
  }
}

TEST_CASE("the launcher's report names the GPUs it locked for the job (--gpus)", "[launcher]")
{
  const std::string text = "0 exit\ngpus 4 GPU-0000-aa 6 GPU-0000-bb\nresult none\nclean removed\n";
  const auto report = parse_launcher_report(text);
  REQUIRE(report);
  CHECK(report->gpus == std::vector<PickedGpu>{{4, "GPU-0000-aa"}, {6, "GPU-0000-bb"}});
  CHECK(report->result == ReportedResult::none);
  CHECK(report->run_dir_removed);
  CHECK(is_whole_launcher_report(text));
  CHECK(parse_launcher_report("0 exit\nresult none\nclean removed\n")->gpus.empty());
  // A line that is not the launcher's own (odd bytes for a UUID, a word missing): no GPUs, and
  // the report's rest is not read past it.
  for (const char* odd : {"0 exit\ngpus 4 GPU-\x1b[31m\nresult none\nclean removed\n",
                          "0 exit\ngpus 4\nresult none\nclean removed\n",
                          "0 exit\ngpus x GPU-1\nresult none\nclean removed\n",
                          "0 exit\ngpus 1 -rf\nresult none\nclean removed\n"}) {
    INFO(odd);
    const auto read = parse_launcher_report(odd);
    REQUIRE(read);
    CHECK(read->gpus.empty());
    CHECK(read->result == ReportedResult::unknown);
  }
}

TEST_CASE("a GPU request reaches the launcher, not the job, and keeps the run off the standby",
          "[launcher]")
{
  LauncherSpec spec = python_launcher("/r/ferry-1-ab", "j.py", "j", "S");
  CHECK(make_launcher(spec).find("nvidia-smi") == std::string::npos); // no picker without --gpus
  spec.env[k_launcher_gpus_var] = gpu_request(3, 20);
  const std::string text = make_launcher(spec);
  CHECK(text.find("[ \"$gpu_got\" -ge 3 ] && return 0") != std::string::npos);
  CHECK(text.find("[ \"$gpu_waited\" -ge 20 ]") != std::string::npos);
  CHECK(text.find("FERRY_GPUS") == std::string::npos); // not one of the job's variables
  CHECK(text.substr(text.find('\n') + 1, 2) == "#\n");
  CHECK_FALSE(runs_on_standby(spec));
}

TEST_CASE("a whole report ends at its clean line: there a staying standby's run ends", "[launcher]")
{
  CHECK(is_whole_launcher_report("0 exit\nresult none\nclean removed\n"));
  CHECK(is_whole_launcher_report("7 exit\nresult file 3\n{}\nclean kept\n"));
  for (const char* part :
       {"", "0 exit\n", "0 exit\nresult none\n", "0 exit\nresult file 9\n{}\n",
        "0 exit\nresult none\nclean removed", "0 exit\nresult none\nclean removed\nx\n",
        "0 exit\nresult file 3\n{}clean removed\n"}) {
    INFO(part);
    CHECK_FALSE(is_whole_launcher_report(part));
  }
  // What a capture holds after the end marker so far: nothing before the marker, the report
  // as it grows; stderr has the marker only when asked (a python standby's `stay`).
  ExecRequest request;
  request.sentinel = "ferry-start-1";
  request.end_marker = "ferry-end-1";
  OutputCapture out = capture_for(request, OutputStream::out);
  out.feed("ferry-start-1\njob\n");
  CHECK_FALSE(out.report_so_far());
  out.feed("ferry-end-1 0 exit\nresult none\n");
  CHECK(out.report_so_far() == std::string_view("0 exit\nresult none\n"));
  OutputCapture err = capture_for(request, OutputStream::err, true);
  err.feed("ferry-start-1\noops\nferry-end-1 st");
  CHECK_FALSE(err.report_so_far() == std::string_view("stay\n"));
  err.feed("ay\n");
  CHECK(err.report_so_far() == std::string_view("stay\n"));
  CHECK(std::move(err).finish().bytes == "oops\n");
  OutputCapture plain = capture_for(request, OutputStream::err);
  plain.feed("ferry-start-1\nferry-end-1 stay\n");
  CHECK_FALSE(plain.report_so_far());
}

TEST_CASE("a report may be as long as its cap, and no longer", "[capture]")
{
  const std::string report =
      "0 exit\nresult file 100\n" + std::string(100, 'r') + "clean removed\n";
  OutputCapture fits("s", 1000, "ferry-end-1", {}, 200);
  fits.feed("s\njob\nferry-end-1 " + report);
  const CapturedStream got = std::move(fits).finish();
  CHECK(got.bytes == "job\n");
  CHECK(got.launcher_report == report);
  OutputCapture over("s", 1000, "ferry-end-1", {}, 100);
  over.feed("s\njob\nferry-end-1 " + report);
  const CapturedStream spilled = std::move(over).finish();
  CHECK_FALSE(spilled.launcher_report);
  CHECK(spilled.bytes == "job\nferry-end-1 " + report);
}

TEST_CASE("a stale run directory is removed only when no launcher can still need it", "[sweep]")
{
  const long long now = 1'000'000;
  // A live launcher keeps its directory whatever the clock says.
  CHECK_FALSE(is_stale_run({now, 0, std::string("42 1\n"), true}));
  // A dead launcher: only after its deadline and a minute's margin.
  CHECK_FALSE(
      is_stale_run({now, now - 10, std::string("42 " + std::to_string(now - 30) + "\n"), false}));
  CHECK(is_stale_run({now, now - 10, std::string("42 " + std::to_string(now - 61) + "\n"), false}));
  // Today's launchers write how long the run may take, counted from the directory's mtime.
  CHECK_FALSE(is_stale_run({now, now - 100, std::string("42 +50\n"), false}));
  CHECK(is_stale_run({now, now - 200, std::string("42 +50\n"), false}));
  CHECK_FALSE(is_stale_run({now, now - 200, std::string("42 +150\n"), false}));
  // No launcher ever ran there (an upload broke off): left a day.
  CHECK_FALSE(is_stale_run({now, now - 3600, std::nullopt, false}));
  CHECK(is_stale_run({now, now - 25 * 3600, std::nullopt, false}));
  CHECK(state_file_pid("4242 99\n") == 4242L);
  CHECK_FALSE(state_file_pid("x 99\n"));
  CHECK(is_run_dir_name("ferry-20261130T221500Z-0123456789abcdef0123456789abcdef"));
  CHECK_FALSE(is_run_dir_name("ferry-20261130T221500Z-0123456789abcdef0123456789abcdeg"));
  CHECK_FALSE(is_run_dir_name("ferry-x"));
  CHECK_FALSE(is_run_dir_name("other-20261130T221500Z-0123456789abcdef0123456789abcdef"));
}

TEST_CASE("terminal_safe leaves text and shows controls", "[text]")
{
  CHECK(terminal_safe("plain: ümlaut, 日本, tab\there") == "plain: ümlaut, 日本, tab\there");
  CHECK(terminal_safe("a\nb") == "a\\x0ab");
  CHECK(terminal_safe("a\nb", Newlines::keep) == "a\nb");
  CHECK(terminal_safe("\x1b]52;c;aGk=\x07") == "\\x1b]52;c;aGk=\\x07");
  CHECK(terminal_safe("\x7f") == "\\x7f");
  CHECK(terminal_safe("\xc2\x9b"
                      "31m") == "\\xc2\\x9b31m"); // C1 CSI
  CHECK(terminal_safe("\xe2\x80\xae"
                      "evil") == "\\u{202E}evil"); // right-to-left override
  CHECK(terminal_safe("\xff") == "\\xff");
}

TEST_CASE("a detach request reaches the launcher, not the job, and keeps the run off the standby",
          "[launcher][detach]")
{
  LauncherSpec spec = python_launcher("/r/ferry-1-ab", "j.py", "j", "S");
  CHECK(make_launcher(spec).find("\ndetach=''\n") != std::string::npos);
  spec.env[k_launcher_detach_var] = "604800";
  const std::string text = make_launcher(spec);
  CHECK(text.find("\ndetach=604800\n") != std::string::npos);
  CHECK(text.find("FERRY_DETACH") == std::string::npos); // not one of the job's variables
  CHECK(text.substr(text.find('\n') + 1, 2) == "#\n");
  CHECK_FALSE(runs_on_standby(spec));
  // Anything but digits is no detach request (nothing of it reaches the shell).
  spec.env[k_launcher_detach_var] = "1; rm -rf ~";
  CHECK(make_launcher(spec).find("\ndetach=''\n") != std::string::npos);
  // The output cap travels with it: the host keeps the output files within it.
  spec.env[k_launcher_detach_var] = detach_request(60, 1u << 20);
  CHECK(make_launcher(spec).find("\ndetach=60\n") != std::string::npos);
  CHECK(make_launcher(spec).find("[ 1048576 -gt 0 ]") != std::string::npos);
  spec.env[k_launcher_detach_var] = "60:1; rm -rf ~";
  CHECK(make_launcher(spec).find("\ndetach=''\n") != std::string::npos);
  CHECK(make_launcher(spec).find("rm -rf ~") == std::string::npos);
}
