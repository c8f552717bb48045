#pragma once
// One connection the holder keeps (docs/persistence.md): the host's SSH session, who uses it,
// and the work done for it while nobody waits. The holder keeps one of these per connection
// identity; its clients' threads serve their requests on it, a small fixed pool of threads
// prepares it (PreparePool), and the holder's one main loop ends it when its time is up.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/sessions.hpp"

namespace ferry::held {

using Clock = std::chrono::steady_clock;

struct HeldHost : std::enable_shared_from_this<HeldHost> {
private:
  // Ready once the host is gone: its session torn down, no preparer step or client request of
  // the holder's left on it. `ferry disconnect` is answered after that, so that nothing the
  // holder does touches the host once the command has returned.
  struct GoneMark {
    std::promise<void> mark;
    std::shared_future<void> watched = mark.get_future().share();
    GoneMark() = default;
    GoneMark(const GoneMark&) = delete;
    GoneMark& operator=(const GoneMark&) = delete;
    ~GoneMark() { mark.set_value(); }
  };
  GoneMark m_gone; // first: destroyed last

public:
  HeldHost(std::string key_, std::string label_, std::string since_)
      : key(std::move(key_)), label(std::move(label_)), since(std::move(since_))
  {
  }
  HeldHost(const HeldHost&) = delete;
  HeldHost& operator=(const HeldHost&) = delete;
  ~HeldHost();

  // Marked gone as the host's last member is destroyed (after its session).
  [[nodiscard]] std::shared_future<void> gone() const { return m_gone.watched; }

  const std::string key;   // names the connection's options (hashed), as the clients ask for it
  const std::string label; // the host as the first client named it
  const std::string since; // UTC, ISO 8601

  // Set once, by the client thread that connects it, before `state` becomes ready.
  std::unique_ptr<SshConnection> session;
  enum class State { connecting, ready, failed };
  std::mutex mutex; // guards the changes of state, failure, and the launches
  std::condition_variable settled;
  std::atomic<State> state{State::connecting};
  nlohmann::json failure; // failed: the answer to every client that waited for the connect

  // How long it stays after its last use: the latest client's --persist.
  std::atomic<Clock::rep> persist{0};
  std::atomic<int> clients{0};  // client connections bound to it
  std::atomic<int> requests{0}; // requests under way (a stage, a run, a fetch)
  std::atomic<Clock::rep> last_heard{Clock::now().time_since_epoch().count()};
  std::atomic<bool> ending{false};
  // The main loop's own: since when no client was bound, when idle work was last asked for.
  Clock::time_point idle_since = Clock::now();
  std::optional<Clock::time_point> idle_work_at;

  void heard() { last_heard = Clock::now().time_since_epoch().count(); }
  [[nodiscard]] Clock::time_point last_heard_at() const
  {
    return Clock::time_point(Clock::duration(last_heard.load()));
  }
  [[nodiscard]] Clock::duration persist_time() const { return Clock::duration(persist.load()); }

  // Marks it ending and stops its runs under way (as an interrupt would).
  void end();
  // The stop token of a launch under way, while it runs (end() stops it).
  void launching(std::uint64_t run, const StopToken& stop);
  void launched(std::uint64_t run);

  // The preparer's wishes, under the pool's lock.
  bool start_wanted = false; // prepare_ahead + prepare_interpreter, once connected
  // The start work is still to ask for: after the first run (which it would race for the
  // host's channels), or once the session is first idle.
  std::atomic<bool> start_pending{true};
  bool standby_wanted = false; // prepare_ahead
  bool idle_wanted = false;    // prepare_idle
  bool queued = false;
  bool working = false; // a pool thread prepares it now: no second one may (one session each)
  // Since when its start work has waited for other hosts' first runs (PreparePool).
  std::optional<Clock::time_point> start_held_since;

private:
  std::map<std::uint64_t, StopToken> m_launches;
};

// The threads (a fixed few) that do every host's preparing, fed by one queue; a host retired
// into it is dropped there (ahead of the work queued), so its session's teardown never holds the
// main loop up. A host's start work waits while other hosts' first runs are under way through the
// holder (a fan-out's first run: those hosts' logins, jobs and this work would share the CPUs), at
// most k_start_waits_at_most.
class PreparePool {
public:
  enum class Wish { start, standby, idle };
  static constexpr auto k_start_waits_at_most = std::chrono::seconds(30);
  explicit PreparePool(int threads);
  PreparePool(const PreparePool&) = delete;
  PreparePool& operator=(const PreparePool&) = delete;
  ~PreparePool() { stop(); }

  void want(const std::shared_ptr<HeldHost>& host, Wish wish);
  void retire(std::shared_ptr<HeldHost> host);
  // A host's first run through the holder (its client's `only_run`) is staged; it has ended.
  void first_run_began();
  void first_run_ended();
  // Drops what is queued and waits for the work under way.
  void stop();

private:
  void work();
  // Under m_mutex: the next host to prepare, or null (then `next_look`: when a held-back start
  // may go regardless).
  std::shared_ptr<HeldHost> next_host(std::optional<Clock::time_point>& next_look);

  std::mutex m_mutex;
  std::condition_variable m_wake;
  std::deque<std::shared_ptr<HeldHost>> m_queue;
  std::deque<std::shared_ptr<HeldHost>> m_held_back; // start work waiting for first runs
  int m_first_runs = 0;
  bool m_stopping = false;
  std::vector<std::thread> m_threads;
};

// Serves one client connection bound to `host` until the client goes, the host ends or the
// holder does (`exiting`).
void serve_host_client(const std::shared_ptr<HeldHost>& host, PreparePool& pool, int fd,
                       const std::atomic<bool>& exiting);

} // namespace ferry::held
