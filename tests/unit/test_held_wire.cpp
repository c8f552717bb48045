// The messages between ferry and a connection holder: every field and every byte survive the
// trip, and a broken or silent peer is told apart from a message.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include "ferry/bundle.hpp"
#include "ferry/fd.hpp"
#include "transport/held/wire.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

struct Pair {
  Fd a;
  Fd b;
};

Pair socket_pair()
{
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  return {Fd(fds[0]), Fd(fds[1])};
}

held::Message round_trip(const held::Message& message)
{
  auto [a, b] = socket_pair();
  REQUIRE(held::send_message(a.get(), message));
  held::Message got;
  REQUIRE(held::receive_message(b.get(), got, 1s) == held::Received::message);
  return got;
}

// Bytes that must come back untouched: NUL, invalid UTF-8, an escape sequence. 21 of them: a
// length past the literal's end reads beyond it (ASan stops the test binary before main).
const std::string k_raw("\x00\xff\xfe bytes \x1b[2J \xc3\x28 end", 21);
static_assert(sizeof("\x00\xff\xfe bytes \x1b[2J \xc3\x28 end") == 21 + 1);

} // namespace

TEST_CASE("holder messages: an exec outcome comes back field for field, bytes untouched")
{
  ExecOutcome outcome;
  outcome.end = ExecEnd::lost;
  outcome.exit_code = 124;
  outcome.out.bytes = k_raw;
  outcome.out.truncated = true;
  outcome.out.dropped = 1ull << 40;
  outcome.out.before_sentinel = "login noise\n";
  outcome.out.saw_sentinel = true;
  outcome.out.launcher_report = "0 exit\nresult none\nclean removed\n";
  outcome.err.bytes = "err";
  outcome.lost_reason = "the connection dropped";
  outcome.start_limit_s = 20.5;
  outcome.output_held_open = true;
  outcome.verdict = ExecOutcome::Verdict{ExecOutcome::Verdict::Kind::timeout, "TIMEOUT"};
  const auto back = held::decode_outcome(round_trip(held::encode(outcome)));
  CHECK(back.end == ExecEnd::lost);
  CHECK(back.exit_code == 124);
  CHECK(back.out.bytes == k_raw);
  CHECK(back.out.truncated);
  CHECK(back.out.dropped == 1ull << 40);
  CHECK(back.out.before_sentinel == "login noise\n");
  CHECK(back.out.saw_sentinel);
  CHECK(back.out.launcher_report == outcome.out.launcher_report);
  CHECK(back.err.bytes == "err");
  CHECK_FALSE(back.err.launcher_report);
  CHECK(back.lost_reason == outcome.lost_reason);
  CHECK(back.start_limit_s == 20.5);
  CHECK(back.output_held_open);
  REQUIRE(back.verdict);
  CHECK(back.verdict->kind == ExecOutcome::Verdict::Kind::timeout);
  CHECK(back.verdict->message == "TIMEOUT");
  ExecOutcome plain;
  const auto none = held::decode_outcome(round_trip(held::encode(plain)));
  CHECK_FALSE(none.exit_code);
  CHECK_FALSE(none.verdict);
}

TEST_CASE("holder messages: requests, files, listings and errors come back whole")
{
  RunBundle bundle;
  bundle.launcher.job_file = "probe.py";
  bundle.launcher.job_name = k_raw;
  bundle.launcher.interpreter = "python3";
  bundle.launcher.timeout_s = 7;
  bundle.launcher.grace_s = 3;
  bundle.launcher.sentinel = "ferry-start-1";
  bundle.launcher.end_marker = "ferry-end-1";
  bundle.launcher.params = k_raw;
  bundle.launcher.result_frame_limit = 99;
  bundle.launcher.keep_run_dir = true;
  bundle.launcher.env = {{"A", k_raw}};
  bundle.job_bytes = k_raw;
  bundle.job_sha256 = "ab";
  bundle.files = {{"d/f.txt", k_raw, 0640}};
  bundle.scheduler = {{"partition", "gpu"}};
  const auto b = held::decode_bundle(round_trip(held::encode(bundle)));
  CHECK(b.launcher.job_file == "probe.py");
  CHECK(b.launcher.job_name == k_raw);
  CHECK(b.launcher.interpreter == "python3");
  CHECK(b.launcher.timeout_s == 7);
  CHECK(b.launcher.grace_s == 3);
  CHECK(b.launcher.sentinel == "ferry-start-1");
  CHECK(b.launcher.end_marker == "ferry-end-1");
  CHECK(b.launcher.params == k_raw);
  CHECK(b.launcher.result_frame_limit == 99);
  CHECK(b.launcher.keep_run_dir);
  CHECK(b.launcher.env == bundle.launcher.env);
  CHECK(b.job_bytes == k_raw);
  CHECK(b.job_sha256 == "ab");
  REQUIRE(b.files.size() == 1);
  CHECK(b.files[0].path == "d/f.txt");
  CHECK(b.files[0].bytes == k_raw);
  CHECK(b.files[0].mode == 0640);
  CHECK(b.scheduler == bundle.scheduler);

  StagedRun run;
  run.run_dir = "/run dir";
  run.launcher = bundle.launcher;
  run.job_from_cache = true;
  run.id = 42;
  const auto staged = held::decode_run(round_trip(held::encode(run)));
  CHECK(staged.run_dir == "/run dir");
  CHECK(staged.launcher.sentinel == "ferry-start-1");
  CHECK(staged.job_from_cache);
  CHECK(staged.id == 42);
  CHECK(staged.job_cache_remade.empty());
  run.job_cache_remade = "/base/ferry-job-ab.py";
  CHECK(held::decode_run(round_trip(held::encode(run))).job_cache_remade == run.job_cache_remade);

  LaunchRequest request;
  request.output_cap = 7;
  request.report_cap = 9;
  request.deadline = 3500ms;
  request.grace = 2s;
  const auto r = held::decode_launch(round_trip(held::encode(request)));
  CHECK(r.output_cap == 7);
  CHECK(r.report_cap == 9);
  CHECK(r.deadline == request.deadline);
  CHECK(r.grace == request.grace);

  const auto file = held::decode_file(
      round_trip(held::encode(FetchedFile{FetchedFile::Kind::regular, k_raw, {}})));
  CHECK(file.kind == FetchedFile::Kind::regular);
  CHECK(file.bytes == k_raw);
  CHECK(held::decode_file(round_trip(held::encode(FetchedFile{}))).kind ==
        FetchedFile::Kind::missing);

  const std::vector<DirEntry> entries = {{"a", DirEntry::Kind::file, 5, ""},
                                         {"d", DirEntry::Kind::other, 0, "a FIFO"}};
  const auto listed = held::decode_entries(round_trip(held::encode(entries)));
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[1].what == "a FIFO");
  CHECK((*listed)[0].size == 5);
  CHECK_FALSE(held::decode_entries(round_trip(held::encode(std::nullopt))));

  const auto error = held::error_in(
      round_trip(held::error_message({ErrorKind::unreachable, "gpu1: host key changed"})));
  REQUIRE(error);
  CHECK(error->kind == ErrorKind::unreachable);
  CHECK(error->message == "gpu1: host key changed");
  CHECK_FALSE(held::error_in(round_trip({{"ok", true}})));
  // Its failure class too: a run through the holder is classified as a direct one.
  const auto auth = held::error_in(round_trip(
      held::error_message({ErrorKind::unreachable, "gpu1: asks for more", Unreached::auth})));
  REQUIRE(auth);
  CHECK(auth->unreached == Unreached::auth);
}

TEST_CASE("holder messages: a keyboard-interactive round comes back byte for byte")
{
  PromptRound round;
  round.host = "login1";
  round.name = std::string("Duo\x1b]0;title\x07", 13);
  round.instruction = std::string("\xff\xfe not UTF-8", 12);
  round.prompts = {{"Passcode: ", false}, {"Name: ", true}};
  const PromptRound back = held::decode_round(round_trip(held::encode(round)));
  CHECK(back.host == "login1");
  CHECK(back.name == round.name);
  CHECK(back.instruction == round.instruction);
  REQUIRE(back.prompts.size() == 2);
  CHECK(back.prompts[0].text == "Passcode: ");
  CHECK_FALSE(back.prompts[0].echo);
  CHECK(back.prompts[1].echo);
}

TEST_CASE("holder messages: silence, a closed peer and a broken frame are not messages")
{
  auto [a, b] = socket_pair();
  held::Message got;
  CHECK(held::receive_message(b.get(), got, 50ms) == held::Received::timeout);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};
  REQUIRE(::write(a.get(), huge, 4) == 4);
  CHECK(held::receive_message(b.get(), got, 1s) == held::Received::broken);
  auto [c, d] = socket_pair();
  const unsigned char half[6] = {0, 0, 0, 9, 0xa1, 0x61};
  REQUIRE(::write(c.get(), half, 6) == 6);
  c.reset();
  CHECK(held::receive_message(d.get(), got, 1s) == held::Received::broken);
  auto [e, f] = socket_pair();
  e.reset();
  CHECK(held::receive_message(f.get(), got, 1s) == held::Received::closed);
}
