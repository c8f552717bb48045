#pragma once
// The decisions of the speed machinery (ahead.hpp; docs/persistence.md, "The next run's channel,
// opened ahead"; docs/run-protocol.md, "Exec"), as pure functions over what the session knows at
// the moment: how many channels the host takes, what is open, whether the python standby's
// script is in the job cache, how many runs are planned. Ahead acts on them.
#include <chrono>
#include <cstddef>
#include <limits>
#include <optional>

namespace ferry::ssh::standby {

using Clock = std::chrono::steady_clock;

// Python standbys that stayed after runs side by side, kept for the next ones.
inline constexpr std::size_t k_max_spares = 8;
// Runs whose files wait in memory for the python standby that is to make them.
inline constexpr std::size_t k_max_deferred = 64;
// How often an idle holder looks again at the python standby's script in the job cache.
inline constexpr std::chrono::minutes k_script_look_every{10};
// The holder's own SFTP steps wait until the runs' have been quiet this long, at most so long.
inline constexpr std::chrono::milliseconds k_runs_quiet{20};
inline constexpr std::chrono::seconds k_runs_first_at_most{30};

// What the session knows now (holding its lock).
struct Facts {
  bool python_ready = false; // the python standby's command is known and starts on this host
  int channel_limit = std::numeric_limits<int>::max(); // exec channels the host takes at once
  int execs = 0;                                       // exec channels open now
  bool has_standby = false;                            // a channel opened ahead waits
  std::size_t spares = 0;
  std::size_t deferred = 0;    // runs whose files wait for their standby
  bool names_run_dirs = false; // SFTP has made the session's first run directory
  bool connected = true;
};

// The runs a session was told it will get (a fan-out's jobs for one host), how many run at once,
// and how many started.
struct RunsPlan {
  std::size_t expected = 0; // 0: unknown (a holder's session): standbys stay
  std::size_t at_once = 1;
  std::size_t started = 0;
};
// A run starts: whether no later run will take the python standby it runs on, which then ends
// with it. Runs start as others end (-j), so a standby that stays serves the run that starts
// `at_once` runs later, if there is one; one that stays for nothing would start an interpreter
// that only the connection's close ends.
[[nodiscard]] bool last_on_its_channel(RunsPlan& plan);

// The session's first run: whether a direct fan-out's later python3 runs go to python standbys.
// Not for a session's only run: on its own, the standby's two python starts cost the host what
// launch.sh's helpers would; its gain is the later runs', on the standbys that stay.
[[nodiscard]] bool fans_out_python(bool python_job, const RunsPlan& plan);

// Whether the next run's files may wait for the python standby that will run it (no SFTP step):
// only with a python standby to be had, room for it and SFTP beside it, and the base checked.
[[nodiscard]] bool defers_staging(const Facts& facts);

// Whether a channel is opened ahead for the next run (a holder, while nobody waits): only when
// none is there, and the host has room for it and one more channel: it never keeps a run waiting.
[[nodiscard]] bool opens_ahead(const Facts& facts);

// Where a python standby that stayed after its run goes. `may_keep` false: a host that allows one
// channel at a time, where it would hold the slot SFTP needs.
enum class Keep { standby, spare, none };
[[nodiscard]] Keep keep_after_run(bool may_keep, const Facts& facts);

// Which channel kept ahead goes when a run or SFTP needs its slot: a spare first.
enum class Close { spare, standby, none };
[[nodiscard]] Close to_close(const Facts& facts);

// Whether the holder looks (again) at the standby's script in the job cache (an SFTP round trip):
// until its command is known, and then every k_script_look_every (other runs' sweeps prune the
// cache).
[[nodiscard]] bool script_look_due(bool command_known, Clock::time_point now,
                                   Clock::time_point last_look);

// Whether the holder's own SFTP step may go now, or until when it waits: it waits while runs
// make their files or run their jobs (`runs_busy`), then until they have been quiet a moment,
// and never past `started` + k_runs_first_at_most.
struct Wait {
  bool for_runs = false;                  // wait until the runs are no longer busy
  std::optional<Clock::time_point> until; // at most until then; neither: go now
};
[[nodiscard]] Wait runs_first(bool runs_busy, Clock::time_point last_activity,
                              Clock::time_point started, Clock::time_point now);

} // namespace ferry::ssh::standby
