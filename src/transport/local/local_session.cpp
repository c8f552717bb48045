// The local target: the same launcher contract in a private temp dir, through Boost.Process,
// so a job behaves the same here as on a host.
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/process.hpp>

#include "ferry/bundle.hpp"
#include "ferry/fd.hpp"
#include "ferry/remote/launcher.hpp"
#include "ferry/sessions.hpp"
#include "ferry/util.hpp"
#include "transport/exec_request.hpp"
#include "transport/run_files.hpp"
#include "transport/stop_schedule.hpp"

namespace ferry {
namespace {

namespace bp = boost::process;
namespace fs = std::filesystem;

// The run directory's files, written as on any target (run_files.hpp).
class LocalWriter final : public RunDirWriter {
public:
  Expected<void> make_dir(const std::string& path) override
  {
    if (::mkdir(path.c_str(), 0700) != 0) {
      return fail(ErrorKind::failed, "cannot create the directory {}: {}", path,
                  std::strerror(errno));
    }
    ::chmod(path.c_str(), 0700); // the umask is not trusted
    return {};
  }
  Expected<void> put_file(const std::string& path, std::string_view bytes) override
  {
    return write_file_atomic(path, bytes, 0600);
  }
};

class LocalSession final : public HostSession {
public:
  explicit LocalSession(LocalTarget target) : m_target(std::move(target)) {}

  nlohmann::json target() const override { return {{"local", true}}; }
  std::string label() const override { return "local"; }

  Expected<void> connect() override { return {}; }

  Expected<StagedRun> stage(const RunBundle& bundle, const StopToken& stop) override
  {
    FERRY_TRY_ASSIGN(const std::string dir, create_run_dir());
    LocalWriter writer;
    auto cached = write_run_files(writer, bundle, dir);
    if (!cached) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      return Unexpected{cached.error()};
    }
    return staged_run(bundle, dir, stop);
  }

  Expected<ExecOutcome> launch(StagedRun& run, const LaunchRequest& request) override
  {
    return exec(launcher_request(run, request));
  }

  Expected<FetchedFile> fetch(const StagedRun& run, const std::string& rel, const ChunkSink& sink,
                              std::uint64_t offset) override
  {
    return fetch_stream(run.run_dir + "/" + rel, sink, offset);
  }

  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun& run,
                                                      const std::string& rel) override
  {
    return list_local_dir(rel.empty() ? run.run_dir : run.run_dir + "/" + rel);
  }

  Expected<void> finish(StagedRun& run, Finish how) override
  {
    if (how != Finish::remove) {
      return {};
    }
    std::error_code ec;
    fs::remove_all(run.run_dir, ec);
    if (ec) {
      return fail(ErrorKind::failed, "cannot remove the run directory {}: {}", run.run_dir,
                  ec.message());
    }
    return {};
  }

private:
  Expected<std::string> create_run_dir()
  {
    std::error_code ec;
    const fs::path base =
        m_target.base.empty() ? fs::temp_directory_path(ec) : fs::path(m_target.base);
    if (ec) {
      return fail(ErrorKind::failed, "no temporary directory for the local run: {}", ec.message());
    }
    const fs::path dir =
        base /
        fmt::format("ferry-{}-{}", utc_compact(std::chrono::system_clock::now()), random_hex(16));
    if (::mkdir(dir.c_str(), 0700) != 0) {
      return fail(ErrorKind::failed, "cannot create the run directory {}: {}", dir.string(),
                  std::strerror(errno));
    }
    ::chmod(dir.c_str(), 0700); // the umask is not trusted
    sweep_stale(base, dir);
    return dir.string();
  }
  Expected<ExecOutcome> exec(const ExecRequest& request);
  Expected<FetchedFile> fetch_stream(const std::string& path, const ChunkSink& sink,
                                     std::uint64_t offset);
  void sweep_stale(const fs::path& base, const fs::path& new_dir);

  LocalTarget m_target;
  bool m_swept = false;
};

std::optional<std::string> read_small(const fs::path& path)
{
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) {
    return std::nullopt;
  }
  std::string bytes(4096, '\0');
  const ssize_t n = ::read(fd.get(), bytes.data(), bytes.size());
  if (n < 0) {
    return std::nullopt;
  }
  bytes.resize(static_cast<std::size_t>(n));
  return bytes;
}

bool launcher_alive(const fs::path& dir, const std::string& state)
{
  const auto pid = state_file_pid(state);
  if (!pid || ::kill(static_cast<pid_t>(*pid), 0) != 0) {
    return false;
  }
  const auto cmdline = read_small(fmt::format("/proc/{}/cmdline", *pid));
  return !cmdline || cmdline->find(dir.string()) != std::string::npos; // no /proc: assume it is
}

// Once per process, as over SSH: this user's run directories in the base that no launcher will
// ever remove.
void LocalSession::sweep_stale(const fs::path& base, const fs::path& new_dir)
{
  if (std::exchange(m_swept, true)) {
    return;
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const fs::path& path = entry.path();
    struct stat st {};
    if (path == new_dir || !is_run_dir_name(path.filename().string()) ||
        ::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    StaleRunCheck check{now, st.st_mtime, read_small(path / k_launcher_state_file), false};
    check.launcher_alive = check.state && launcher_alive(path, *check.state);
    if (is_stale_run(check)) {
      fs::remove_all(path, ec);
    }
  }
}

std::string_view file_type_name(mode_t mode)
{
  if (S_ISDIR(mode)) {
    return "a directory";
  }
  if (S_ISLNK(mode)) {
    return "a symbolic link";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO";
  }
  return "a socket or device";
}

Expected<FetchedFile> LocalSession::fetch_stream(const std::string& path, const ChunkSink& sink,
                                                 std::uint64_t offset)
{
  // lstat first, and O_NONBLOCK: a FIFO is never opened for a read that could block, a link
  // never followed (the same rule as over SFTP).
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return FetchedFile{};
    }
    return fail(ErrorKind::failed, "cannot inspect {}: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return FetchedFile{FetchedFile::Kind::other, {}, std::string(file_type_name(st.st_mode))};
  }
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat opened {};
  if (!fd || ::fstat(fd.get(), &opened) != 0 || !S_ISREG(opened.st_mode)) {
    return fail(ErrorKind::failed, "cannot read {}: {}", path,
                fd ? "it changed into something other than a regular file" : std::strerror(errno));
  }
  if (offset > 0 && ::lseek(fd.get(), static_cast<off_t>(offset), SEEK_SET) < 0) {
    return fail(ErrorKind::failed, "cannot seek in {}: {}", path, std::strerror(errno));
  }
  std::vector<char> buffer(256 * 1024);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return fail(ErrorKind::failed, "cannot read {}: {}", path, std::strerror(errno));
    }
    if (n == 0) {
      break;
    }
    FERRY_TRY(sink(std::string_view(buffer.data(), static_cast<std::size_t>(n))));
  }
  return FetchedFile{FetchedFile::Kind::regular, {}, {}};
}

// Reads what is ready on the job's two pipes into their captures; a closed pipe is dropped.
void drain(pollfd (&fds)[2], OutputCapture* (&captures)[2], int& open_streams,
           std::vector<char>& buffer)
{
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
      continue;
    }
    const ssize_t n = ::read(fds[i].fd, buffer.data(), buffer.size());
    if (n > 0) {
      captures[i]->feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    } else if (n == 0 || errno != EINTR) {
      fds[i].fd = -1;
      --open_streams;
    }
  }
}

// Signals the launcher as the stop schedule says (its trap stops the job's process group).
void apply_stop_step(StopSchedule& schedule, const bp::child& child, bool started)
{
  switch (schedule.next(std::chrono::steady_clock::now(), started)) {
  case StopSchedule::Step::term:
    ::kill(child.id(), SIGTERM);
    break;
  case StopSchedule::Step::kill:
    ::kill(child.id(), SIGKILL);
    break;
  case StopSchedule::Step::give_up: // the exit linger below ends the wait
  case StopSchedule::Step::none:
    break;
  }
}

Expected<ExecOutcome> LocalSession::exec(const ExecRequest& request)
{
  bp::pipe out_pipe;
  bp::pipe err_pipe;
  std::error_code spawn_error;
  bp::child child(bp::exe = request.argv.front(),
                  bp::args = std::vector<std::string>(request.argv.begin() + 1, request.argv.end()),
                  bp::std_in<bp::null, bp::std_out> out_pipe, bp::std_err > err_pipe, spawn_error);
  if (spawn_error) {
    return fail(ErrorKind::failed, "cannot start {}: {}", request.argv.front(),
                spawn_error.message());
  }
  OutputCapture out = capture_for(request, OutputStream::out);
  OutputCapture err = capture_for(request, OutputStream::err);
  pollfd fds[2] = {{out_pipe.native_source(), POLLIN, 0}, {err_pipe.native_source(), POLLIN, 0}};
  OutputCapture* captures[2] = {&out, &err};
  int open_streams = 2;
  StopSchedule schedule(std::chrono::steady_clock::now(), request);
  std::optional<std::chrono::steady_clock::time_point> exited_at;
  ExecOutcome outcome;
  outcome.start_limit_s = std::chrono::duration<double>(request.start_limit).count();
  std::vector<char> buffer(65536);
  while (open_streams > 0) {
    if (::poll(fds, 2, 100) < 0 && errno != EINTR) {
      break;
    }
    drain(fds, captures, open_streams, buffer);
    const auto now = std::chrono::steady_clock::now();
    if (!exited_at && !child.running()) {
      exited_at = now;
    } else if (exited_at && now - *exited_at > k_output_linger) {
      outcome.output_held_open = true;
      break;
    }
    apply_stop_step(schedule, child, out.started() || err.started());
  }
  std::error_code wait_error;
  child.wait(wait_error);
  const int status = child.native_exit_code();
  if (WIFEXITED(status)) {
    outcome.exit_code = WEXITSTATUS(status);
  }
  outcome.end = schedule.reason().value_or(ExecEnd::exited);
  outcome.out = std::move(out).finish();
  outcome.err = std::move(err).finish();
  return outcome;
}

} // namespace

std::unique_ptr<HostSession> make_local_session(const LocalTarget& target)
{
  return std::make_unique<LocalSession>(target);
}

} // namespace ferry
