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
  ExecRequest request;
  request.argv = {"/bin/sh", "/run dir/launch.sh"};
  request.sentinel = "ferry-start-1";
  request.end_marker = "ferry-end-1";
  request.output_cap = 7;
  request.report_cap = 9;
  request.deadline = 3500ms;
  request.grace = 2s;
  request.start_limit = 20s;
  request.python_standby = true;
  const auto r = held::decode_request(round_trip(held::encode(request)));
  CHECK(r.argv == request.argv);
  CHECK(r.sentinel == request.sentinel);
  CHECK(r.end_marker == request.end_marker);
  CHECK(r.output_cap == 7);
  CHECK(r.report_cap == 9);
  CHECK(r.deadline == request.deadline);
  CHECK(r.grace == request.grace);
  CHECK(r.start_limit == request.start_limit);
  CHECK(r.python_standby);
  CHECK_FALSE(r.runs_on_standby);
  request.python_standby = false;
  request.runs_on_standby = true;
  const auto sh = held::decode_request(round_trip(held::encode(request)));
  CHECK_FALSE(sh.python_standby);
  CHECK(sh.runs_on_standby);

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
