#pragma once
// Standby channels: opened ahead of their run, their command (`/bin/sh -s`, or the python standby,
// src/remote/standby.py) waits on stdin. A launcher run takes one: the one line
// `exec /bin/sh RUN_DIR/launch.sh` starts the launcher, saving the channel's open and the login
// shell's start. A standby that has gone meanwhile is dropped and the run gets a new channel.
// A python standby takes the same line, or a `stage` line with launch.sh's bytes, and may stay
// after its run for the next one.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"
#include "transport/exec_request.hpp"
#include "transport/ssh/exec.hpp"

namespace ferry::ssh {

// A channel opened ahead of its run: its `/bin/sh -s`, or the python standby, waits on stdin
// for one line.
class Standby {
public:
  explicit Standby(ssh_session session) : channel(session, watch) {}
  ExitWatch watch; // before the channel, whose callbacks point at it
  ExecChannel channel;
  bool python = false;  // its sh becomes the python standby (src/remote/standby.py)
  std::string command;  // what it runs: `/bin/sh -s`
  bool open = false;    // the server confirmed the channel (its exec request comes next)
  bool started = false; // the server accepted the exec request
  // A python standby: the line its sh is given (standby_boot_line), then its stdout up to its
  // ready line. It takes no run before that line: the sh may have read ahead of its own line,
  // and what it read would be lost at its exec.
  std::string boot;
  bool booted = false;
  bool ready = false;
  std::string said;
  std::string tag_sha256; // from the ready line ("-": none)
};
using StandbyChannel = std::unique_ptr<Standby>;
// Whether `standby` is a python standby.
[[nodiscard]] bool is_python(const StandbyChannel& standby);

// A launcher run given a `standby` runs there instead of on a new channel (or on one of the
// `spares`, python standbys that stayed after runs side by side). With `python_command`, a
// python3 job's run (ExecRequest::python_ahead) that finds none opens its channel with that
// command and runs there as on a python standby. A python standby that stays after its run
// becomes the standby, or a spare (standby::keep_after_run).
// A run with `stage` (the line and launch.sh's bytes: src/remote/standby.py) has no files on the
// host yet: a python standby it runs on makes them itself (*staged_by_standby is set once the
// line has gone to one). Before the run goes anywhere else, `settle` (called holding the lock)
// makes them over SFTP; its argument says whether a standby was given the line first.
struct StandbyUse {
  StandbyChannel* standby = nullptr;
  bool* python_failed = nullptr; // set when a python standby could not start on the host
  std::function<void()> taken;   // called (holding the lock) once the run has taken it
  std::vector<StandbyChannel>* spares = nullptr;
  std::string python_command; // the python standby's boot line (standby_boot_line)
  std::string stage;
  std::function<Expected<void>(bool)> settle;
  bool* staged_by_standby = nullptr;
  // Asked (holding the lock) when a python standby stays after its run: whether it may be kept.
  // Not on a host that allows one channel at a time: it would hold the slot SFTP needs.
  std::function<bool()> may_keep;
  // Called (holding the lock) with the exit status of a python standby that ended before its
  // ready line (k_standby_refused_exit: its script in the job cache was refused), and with the
  // ready line's compiled code's sha256 when it got there.
  std::function<void(int)> boot_failed;
  std::function<void(const std::string&)> booted;
  // A run that finds no standby free opens a python standby of its own (python_command) for any
  // job, not only a python3 job's: a direct connection's only run, staged by it without SFTP.
  bool any_job = false;
};
// The launcher run `request` on a standby as `standby` allows, else on a new channel (exec.hpp).
[[nodiscard]] Expected<ExecOutcome> exec_launcher(ssh_session session, std::string_view label,
                                                  const ExecRequest& request,
                                                  CallWatchdog& watchdog, std::mutex& lock,
                                                  const FreeAChannel& free_a_channel,
                                                  const StandbyUse& standby);

// A standby opened step by step, never waiting: begin_standby sends the channel's open (null
// when that fails at once), advance_standby takes it one step further each time it is called
// (the exec request once the server confirmed the channel) and says where it stands, and
// finish_standby waits for the rest as open_standby does (null when it fails, `limit` passes or
// `stop` is asked for). Its owner keeps a pending standby until it is ready or failed, or the
// session ends: a freed one's confirmation would name a channel libssh no longer knows.
enum class StandbyState { pending, ready, failed };
[[nodiscard]] StandbyChannel begin_standby(ssh_session session,
                                           const std::string& python_command = {});
[[nodiscard]] StandbyState advance_standby(ssh_session session, Standby& standby);
// A python standby is ready once its ready line came; one that ended before sets *exit_code
// (when given) to its exit status.
[[nodiscard]] StandbyChannel finish_standby(ssh_session session, std::unique_lock<std::mutex>& lock,
                                            StandbyChannel standby,
                                            std::chrono::steady_clock::duration limit,
                                            const StopToken* stop = nullptr,
                                            int* exit_code = nullptr);

// Opens a standby channel, holding `lock` only while it calls libssh (not while the server
// answers); nullptr when the server refuses it, or it fails, or `limit` passes. Its command is
// `/bin/sh -s`; given `python_command` (standby_boot_line), that sh becomes the python standby,
// which starts the next job's interpreter ahead too.
[[nodiscard]] StandbyChannel open_standby(ssh_session session, std::unique_lock<std::mutex>& lock,
                                          std::chrono::steady_clock::duration limit,
                                          const std::string& python_command = {},
                                          int* exit_code = nullptr);

} // namespace ferry::ssh
