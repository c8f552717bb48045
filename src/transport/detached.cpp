// A detached run followed through the files its launcher writes (docs/run-protocol.md, "Detached
// runs"): the same captures as a live channel's, fed from the output files as they grow.
#include <algorithm>
#include <charconv>
#include <thread>

#include "ferry/remote/launcher.hpp"
#include "transport/exec_request.hpp"

namespace ferry {

Expected<FetchedFile> HostSession::fetch_from(const StagedRun& run, const std::string& rel,
                                              std::uint64_t offset, const ChunkSink& sink)
{
  std::uint64_t skipped = 0;
  return fetch(run, rel, [&](std::string_view chunk) -> Expected<void> {
    const auto skip =
        static_cast<std::size_t>(std::min<std::uint64_t>(offset - skipped, chunk.size()));
    skipped += skip;
    chunk.remove_prefix(skip);
    return chunk.empty() ? Expected<void>{} : sink(chunk);
  });
}

namespace {

// The done file's line, "CODE CAUSE", is at most this long.
constexpr std::size_t k_done_cap = 64;

// The done file's bytes, nullopt when it is not there yet (or not a regular file).
Expected<std::optional<std::string>> done_line(HostSession& session, const StagedRun& run)
{
  FERRY_TRY_ASSIGN(auto fetched, fetch_capped(session, run, k_detached_done, k_done_cap));
  if (fetched.kind != FetchedFile::Kind::regular) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::move(fetched.bytes));
}

// The exit status the done file gives; nullopt when it gives none.
std::optional<int> done_code(std::string_view line)
{
  int code = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), code);
  if (ec != std::errc() || end == line.data() ||
      (end != line.data() + line.size() && *end != ' ')) {
    return std::nullopt;
  }
  return code;
}

// Reads on in one output file from `offset`, into its capture.
Expected<void> read_on(HostSession& session, const StagedRun& run, const char* file,
                       std::uint64_t& offset, OutputCapture& capture)
{
  FERRY_TRY_ASSIGN(const auto fetched,
                   session.fetch_from(run, file, offset, [&](std::string_view chunk) {
                     offset += chunk.size();
                     capture.feed(chunk);
                     return Expected<void>{};
                   }));
  (void)fetched; // a file not there (yet) reads as empty
  return {};
}

// Waits `poll`; false when `stop` was asked meanwhile.
bool nap(const FollowRequest& request)
{
  constexpr auto step = std::chrono::milliseconds(50);
  for (auto waited = std::chrono::milliseconds(0); waited < request.poll; waited += step) {
    if (request.stop.stop_requested()) {
      return false;
    }
    std::this_thread::sleep_for(step);
  }
  return !request.stop.stop_requested();
}

OutputCapture capture_of(const StagedRun& run, const FollowRequest& request, OutputStream stream)
{
  std::function<void(std::string_view)> sink;
  if (request.on_output) {
    sink = [on_output = request.on_output, stream](std::string_view bytes) {
      on_output(stream, bytes);
    };
  }
  return OutputCapture(run.launcher.sentinel, request.output_cap,
                       stream == OutputStream::out ? run.launcher.end_marker : std::string(),
                       std::move(sink), request.report_cap);
}

} // namespace

Expected<std::optional<bool>> detached_done(HostSession& session, const StagedRun& run)
{
  FERRY_TRY_ASSIGN(const auto line, done_line(session, run));
  if (line) {
    return std::optional<bool>(true);
  }
  FERRY_TRY_ASSIGN(const auto listed, session.list(run, ""));
  return listed ? std::optional<bool>(false) : std::optional<bool>();
}

Expected<Followed> follow_detached(HostSession& session, const StagedRun& run,
                                   const FollowRequest& request)
{
  OutputCapture out = capture_of(run, request, OutputStream::out);
  OutputCapture err = capture_of(run, request, OutputStream::err);
  std::uint64_t out_offset = 0;
  std::uint64_t err_offset = 0;
  for (;;) {
    // The done file is looked at before the output: once it is there, this read is the last.
    FERRY_TRY_ASSIGN(const auto line, done_line(session, run));
    if (!line) {
      FERRY_TRY_ASSIGN(const auto listed, session.list(run, ""));
      if (!listed) {
        return Followed{FollowEnd::gone, {}};
      }
    }
    FERRY_TRY(read_on(session, run, k_detached_stdout, out_offset, out));
    FERRY_TRY(read_on(session, run, k_detached_stderr, err_offset, err));
    if (line) {
      Followed followed;
      followed.outcome.exit_code = done_code(*line);
      followed.outcome.out = std::move(out).finish();
      followed.outcome.err = std::move(err).finish();
      return followed;
    }
    if (!nap(request)) {
      return Followed{FollowEnd::stopped, {}};
    }
  }
}

} // namespace ferry
