#pragma once
// The two transports behind HostSession: SSH (libssh + SFTP) and this machine (Boost.Process).
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/transport.hpp"

namespace ferry {

// One round of a server's keyboard-interactive prompts (an OTP, Duo, a password PAM asks for),
// its texts as the host sent them: untrusted bytes, shown only through terminal_safe.
struct PromptRound {
  std::string host; // what the user called the host
  std::string name;
  std::string instruction;
  struct Prompt {
    std::string text;
    bool echo = false; // the answer may be shown as it is typed
  };
  std::vector<Prompt> prompts;
};
// Asks the user for the answers (in the prompts' order), or says why it cannot (no terminal).
using Prompter = std::function<Expected<std::vector<std::string>>(const PromptRound&)>;
// Asks on the user's terminal (/dev/tty), one host at a time; with no terminal, the error that
// says to run `ferry connect HOST` in one first.
[[nodiscard]] Prompter terminal_prompter();
// The error of a host that asks for an interactive login where nobody can answer it.
[[nodiscard]] Unexpected<Error> needs_interactive_login(std::string_view host);

struct SshTarget {
  std::string spec;        // [user@]host[:port] or an alias from the ssh config
  std::string identity;    // --identity
  std::string known_hosts; // --known-hosts (default: the config's, else ~/.ssh/known_hosts)
  std::string ssh_config;  // --ssh-config (default ~/.ssh/config)
  bool accept_new_host_key = false;
  double connect_timeout_s = 0; // --connect-timeout; 0: the ssh config's ConnectTimeout, else 10 s
  int retries = 1;              // extra connect attempts after a refused/timed-out/DNS failure
  std::string remote_base;      // default $HOME/.cache/ferry/runs on the host
  StopToken stop;               // stopped (or interrupted): a connect in progress gives up
  // `-v`: the connection's story, one line a call (config files read, where it goes, the host
  // key, the keys offered); never a secret. Empty: not shown.
  std::function<void(std::string_view)> debug;
  // What the ssh config asks that ferry does not do, one line a call; shown without -v too.
  std::function<void(std::string_view)> warn;
  // Answers keyboard-interactive prompts; empty: nobody can (the MCP server), and a host that
  // asks for them fails with needs_interactive_login.
  Prompter prompt;
};

// An SSH session as a connection holder keeps it between invocations (docs/persistence.md).
class SshConnection : public HostSession {
public:
  // Names the connection's effective options: two targets that would connect the same way
  // (user, address, port, proxy, keys, agent, known_hosts, policy, run base) give the same text,
  // any difference another. Valid once the ssh config was read.
  [[nodiscard]] virtual std::string options_identity() const = 0;
  // The connection is still up: takes in what the server sent meanwhile, never waits.
  [[nodiscard]] virtual bool alive() = 0;
  // The server's key checked again against known_hosts as the files read now.
  [[nodiscard]] virtual Expected<void> recheck_host_key() = 0;
  // What the session keeps ready ahead of its runs (docs/persistence.md, "The next run's
  // channel, opened ahead"). Opens the channel of the next run ahead of it (its login shell
  // started, its /bin/sh waiting for the launcher), when the host has room for one; a holder
  // calls it while nobody waits. The next launcher run takes it.
  virtual void prepare_ahead() {}
  // Puts the script of the process that starts the next job's interpreter ahead (the python
  // one, docs/persistence.md) in the host's job cache (or finds it there) so that later channels
  // opened ahead run it, then makes (and removes) the session's first run directory, so that a
  // run's files can be left to that process. It may take round trips: a holder calls it as it
  // starts, and through prepare_idle; it gives the session's lock up between its steps, so that
  // a run that comes meanwhile waits for one step at most. After the first time it looks at the
  // script's place again only every few minutes. A plain channel opened before stays, for the
  // next run.
  virtual void prepare_interpreter() {}
  // When the holder has been idle a while: the channels that stayed after runs side by side are
  // closed (but the next run's), runs whose client went before their exec forgotten, and
  // prepare_interpreter is called; a plain channel opened ahead is then closed, for
  // prepare_ahead to open one that starts the interpreter.
  virtual void prepare_idle() {}
  // Called (holding the session's lock: it must only take note) when a run takes the channel
  // opened ahead, so that the holder opens the next one while this run's job runs.
  virtual void on_ahead_taken(std::function<void()> callback) { (void)callback; }
  // The host's run base as staging finds and judges it (resolved once per session): a holder
  // checks that a run directory a client names lies in it before it serves that run's files.
  [[nodiscard]] virtual Expected<std::string> run_base()
  {
    return fail(ErrorKind::failed, "this session names no run base");
  }
};

[[nodiscard]] std::unique_ptr<HostSession> make_ssh_session(const SshTarget& target);
// The same, with the ssh config read now, before any host is contacted: a config ssh would
// refuse (or that asks ferry to skip the host key check) is a usage error here.
[[nodiscard]] Expected<std::unique_ptr<SshConnection>>
make_checked_ssh_session(const SshTarget& target);

struct LocalTarget {
  std::string base; // default: the system temp directory
};

[[nodiscard]] std::unique_ptr<HostSession> make_local_session(const LocalTarget& target);

} // namespace ferry
