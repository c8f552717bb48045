// How both exec loops stop a job (src/transport/stop_schedule.hpp), against a clock the test
// moves: TERM at the deadline, a stop or a launcher that never started; KILL and giving up after
// the grace and a slack, sooner when a user waits.
#include <catch2/catch.hpp>

#include "transport/stop_schedule.hpp"

using namespace ferry;
using namespace std::chrono_literals;
using Step = StopSchedule::Step;

namespace {

const StopSchedule::Clock::time_point k_t0{};

ExecRequest request_for(std::chrono::seconds deadline, std::chrono::seconds grace,
                        std::chrono::seconds start_limit = 20s)
{
  ExecRequest request;
  request.deadline = deadline;
  request.grace = grace;
  request.start_limit = start_limit;
  request.stop = StopToken::make();
  return request;
}

} // namespace

TEST_CASE("stop schedule: nothing happens before the deadline", "[stop_schedule]")
{
  StopSchedule schedule(k_t0, request_for(10s, 2s));
  CHECK(schedule.next(k_t0) == Step::none);
  CHECK(schedule.next(k_t0 + 10s) == Step::none);
  CHECK_FALSE(schedule.reason());
}

TEST_CASE("stop schedule: past the deadline, TERM, then KILL after grace + 3 s, then give up "
          "after grace + 8 s, each once",
          "[stop_schedule]")
{
  StopSchedule schedule(k_t0, request_for(10s, 2s));
  const auto termed = k_t0 + 10s + 1ms;
  CHECK(schedule.next(termed) == Step::term);
  CHECK(schedule.reason() == ExecEnd::deadline);
  CHECK(schedule.next(termed + 1s) == Step::none);
  CHECK(schedule.next(termed + 5s) == Step::none);
  CHECK(schedule.next(termed + 5s + 1ms) == Step::kill);
  CHECK(schedule.next(termed + 6s) == Step::none);
  CHECK(schedule.next(termed + 10s) == Step::none);
  CHECK(schedule.next(termed + 10s + 1ms) == Step::give_up);
  CHECK(schedule.next(termed + 60s) == Step::none);
  CHECK(schedule.reason() == ExecEnd::deadline);
}

TEST_CASE("stop schedule: a stop is taken at once, and a waiting user gets KILL after grace + 1 s "
          "and the end after grace + 3 s",
          "[stop_schedule]")
{
  const ExecRequest request = request_for(300s, 2s);
  StopSchedule schedule(k_t0, request);
  CHECK(schedule.next(k_t0 + 1s) == Step::none);
  request.stop.request_stop();
  const auto termed = k_t0 + 1s + 1ms;
  CHECK(schedule.next(termed) == Step::term);
  CHECK(schedule.reason() == ExecEnd::interrupted);
  CHECK(schedule.next(termed + 3s) == Step::none);
  CHECK(schedule.next(termed + 3s + 1ms) == Step::kill);
  CHECK(schedule.next(termed + 5s + 1ms) == Step::give_up);
}

TEST_CASE("stop schedule: a launcher that never started is stopped after the start limit, only "
          "while it has not",
          "[stop_schedule]")
{
  SECTION("never started")
  {
    StopSchedule schedule(k_t0, request_for(300s, 2s, 20s));
    CHECK(schedule.next(k_t0 + 20s, false) == Step::none);
    CHECK(schedule.next(k_t0 + 20s + 1ms, false) == Step::term);
    CHECK(schedule.reason() == ExecEnd::no_start);
    CHECK(schedule.next(k_t0 + 23s + 2ms, false) == Step::kill);
  }
  SECTION("started: the deadline alone counts")
  {
    StopSchedule schedule(k_t0, request_for(300s, 2s, 20s));
    CHECK(schedule.next(k_t0 + 25s, true) == Step::none);
    CHECK_FALSE(schedule.reason());
  }
}
