// The standby machinery's decisions (src/transport/ssh/standby/policy.hpp), each against the
// facts a session has at the moment and a clock the test moves.
#include <catch2/catch.hpp>

#include "transport/ssh/standby/policy.hpp"

using ferry::ssh::standby::Close;
using ferry::ssh::standby::defers_staging;
using ferry::ssh::standby::Facts;
using ferry::ssh::standby::fans_out_python;
using ferry::ssh::standby::k_max_deferred;
using ferry::ssh::standby::k_max_spares;
using ferry::ssh::standby::Keep;
using ferry::ssh::standby::keep_after_run;
using ferry::ssh::standby::last_on_its_channel;
using ferry::ssh::standby::opens_ahead;
using ferry::ssh::standby::runs_first;
using ferry::ssh::standby::RunsPlan;
using ferry::ssh::standby::script_look_due;
using ferry::ssh::standby::to_close;
using ferry::ssh::standby::Wait;
using namespace std::chrono_literals;

namespace {
const ferry::ssh::standby::Clock::time_point k_start{};

// A held session with the python standby's script in the job cache, room to spare.
Facts ready()
{
  Facts facts;
  facts.python_ready = true;
  facts.names_run_dirs = true;
  return facts;
}
} // namespace

TEST_CASE("standby policy: the runs with fewer than -j after them end their standby",
          "[standby_policy]")
{
  SECTION("a holder's session is told nothing: its standbys stay")
  {
    RunsPlan plan;
    for (int i = 0; i < 5; ++i) {
      CHECK_FALSE(last_on_its_channel(plan));
    }
  }
  SECTION("six runs, three at a time: runs 4 to 6 end theirs")
  {
    RunsPlan plan{6, 3, 0};
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan)); // more runs than planned: still the last
  }
  SECTION("one at a time: only the last run")
  {
    RunsPlan plan{3, 1, 0};
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan));
  }
  SECTION("-j 0 counts as one at a time")
  {
    RunsPlan plan{2, 0, 0};
    CHECK_FALSE(last_on_its_channel(plan));
    CHECK(last_on_its_channel(plan));
  }
}

TEST_CASE("standby policy: a direct fan-out's python3 runs go to python standbys unless it has "
          "one run",
          "[standby_policy]")
{
  CHECK(fans_out_python(true, RunsPlan{})); // unknown count
  CHECK(fans_out_python(true, RunsPlan{2, 1, 0}));
  CHECK_FALSE(fans_out_python(true, RunsPlan{1, 1, 0}));
  CHECK_FALSE(fans_out_python(false, RunsPlan{5, 2, 0}));
}

TEST_CASE("standby policy: a run's files wait for its python standby only when one can stage them",
          "[standby_policy]")
{
  CHECK(defers_staging(ready()));
  Facts facts = ready();
  facts.python_ready = false;
  CHECK_FALSE(defers_staging(facts));
  facts = ready();
  facts.names_run_dirs = false; // the base not yet checked, the sweep not done
  CHECK_FALSE(defers_staging(facts));
  facts = ready();
  facts.channel_limit = 2; // the standby and SFTP fill the host's MaxSessions
  CHECK_FALSE(defers_staging(facts));
  facts.channel_limit = 3;
  CHECK(defers_staging(facts));
  facts.deferred = k_max_deferred;
  CHECK_FALSE(defers_staging(facts));
}

TEST_CASE("standby policy: a channel is opened ahead only with room for it and one more",
          "[standby_policy]")
{
  CHECK(opens_ahead(ready()));
  Facts facts = ready();
  facts.has_standby = true;
  CHECK_FALSE(opens_ahead(facts));
  facts = ready();
  facts.channel_limit = 3;
  facts.execs = 2;
  CHECK_FALSE(opens_ahead(facts));
  facts.execs = 1;
  CHECK(opens_ahead(facts));
  facts.connected = false;
  CHECK_FALSE(opens_ahead(facts));
}

TEST_CASE("standby policy: a python standby that stays is the standby, else a spare, never on a "
          "host with one channel",
          "[standby_policy]")
{
  CHECK(keep_after_run(true, ready()) == Keep::standby);
  Facts facts = ready();
  facts.has_standby = true;
  CHECK(keep_after_run(true, facts) == Keep::spare);
  facts.spares = k_max_spares - 1;
  CHECK(keep_after_run(true, facts) == Keep::spare);
  facts.spares = k_max_spares;
  CHECK(keep_after_run(true, facts) == Keep::none);
  CHECK(keep_after_run(false, ready()) == Keep::none); // a host with one channel at a time
}

TEST_CASE("standby policy: a slot is freed by a spare first, then the standby", "[standby_policy]")
{
  Facts facts = ready();
  CHECK(to_close(facts) == Close::none);
  facts.has_standby = true;
  CHECK(to_close(facts) == Close::standby);
  facts.spares = 2;
  CHECK(to_close(facts) == Close::spare);
}

TEST_CASE("standby policy: the script's place in the cache is looked at again every 10 minutes",
          "[standby_policy]")
{
  CHECK(script_look_due(false, k_start, k_start)); // not known yet: looked at whenever asked
  CHECK_FALSE(script_look_due(true, k_start + 9min + 59s, k_start));
  CHECK(script_look_due(true, k_start + 10min, k_start));
}

TEST_CASE("standby policy: the holder's own steps let the runs go first, for 30 s at most",
          "[standby_policy]")
{
  SECTION("runs busy: wait for them, bounded")
  {
    const Wait wait = runs_first(true, k_start, k_start, k_start + 1s);
    CHECK(wait.for_runs);
    CHECK(wait.until == k_start + 30s);
  }
  SECTION("quiet for less than 20 ms: wait until it has been")
  {
    const Wait wait = runs_first(false, k_start + 5s, k_start, k_start + 5s + 5ms);
    CHECK_FALSE(wait.for_runs);
    CHECK(wait.until == k_start + 5s + 20ms);
  }
  SECTION("quiet long enough: go")
  {
    const Wait wait = runs_first(false, k_start + 5s, k_start, k_start + 5s + 20ms);
    CHECK_FALSE(wait.for_runs);
    CHECK_FALSE(wait.until);
  }
  SECTION("after 30 s the step goes, busy or not")
  {
    const Wait wait = runs_first(true, k_start + 29s, k_start, k_start + 30s);
    CHECK_FALSE(wait.for_runs);
    CHECK_FALSE(wait.until);
  }
  SECTION("the quiet wait never passes the bound")
  {
    const Wait wait = runs_first(false, k_start + 30s - 5ms, k_start, k_start + 30s - 10ms);
    CHECK(wait.until == k_start + 30s);
  }
}
