#include "transport/held/wire.hpp"

#include <cerrno>
#include <cstdint>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ferry/bundle.hpp"

namespace ferry::held {

namespace {

using Clock = std::chrono::steady_clock;

// A peer that takes no byte for this long is stopped or stuck: it counts as gone, and a holder's
// thread serving it, or a ferry waiting on a holder, is not held up for ever.
constexpr auto k_send_stall = std::chrono::seconds(20);

bool write_all(int fd, const std::uint8_t* data, std::size_t size)
{
  auto progress = Clock::now();
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() - progress >= k_send_stall) {
        return false;
      }
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) < 0 && errno != EINTR) {
        return false;
      }
      continue;
    }
    if (n <= 0) {
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
    progress = Clock::now();
  }
  return true;
}

// Reads exactly `size` bytes by `until`; `started` says whether a partial read is a break.
Received read_exact(int fd, std::uint8_t* data, std::size_t size, Clock::time_point until,
                    bool started)
{
  std::size_t got = 0;
  while (got < size) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) {
      return started || got > 0 ? Received::broken : Received::timeout;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 200)));
    if (ready < 0 && errno != EINTR) {
      return Received::broken;
    }
    if (ready <= 0) {
      continue;
    }
    const ssize_t n = ::recv(fd, data + got, size - got, 0);
    if (n == 0) {
      return started || got > 0 ? Received::broken : Received::closed;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        continue;
      }
      return Received::broken;
    }
    got += static_cast<std::size_t>(n);
  }
  return Received::message;
}

std::string kind_name(FetchedFile::Kind kind)
{
  switch (kind) {
  case FetchedFile::Kind::regular:
    return "regular";
  case FetchedFile::Kind::other:
    return "other";
  case FetchedFile::Kind::missing:
    break;
  }
  return "missing";
}

Message encode(const CapturedStream& stream)
{
  Message m = {{"bytes", bytes_of(stream.bytes)},
               {"truncated", stream.truncated},
               {"dropped", stream.dropped},
               {"before", bytes_of(stream.before_sentinel)},
               {"saw_sentinel", stream.saw_sentinel}};
  if (stream.launcher_report) {
    m["report"] = bytes_of(*stream.launcher_report);
  }
  return m;
}

CapturedStream decode_stream(const Message& m)
{
  CapturedStream stream;
  stream.bytes = text_of(m.at("bytes"));
  stream.truncated = m.at("truncated").get<bool>();
  stream.dropped = m.at("dropped").get<std::uint64_t>();
  stream.before_sentinel = text_of(m.at("before"));
  stream.saw_sentinel = m.at("saw_sentinel").get<bool>();
  if (m.contains("report")) {
    stream.launcher_report = text_of(m.at("report"));
  }
  return stream;
}

long long ms_of(std::chrono::steady_clock::duration d)
{
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

} // namespace

bool send_message(int fd, const Message& message)
{
  const std::vector<std::uint8_t> body = Message::to_cbor(message);
  const auto size = static_cast<std::uint32_t>(body.size());
  const std::uint8_t head[4] = {
      static_cast<std::uint8_t>(size >> 24), static_cast<std::uint8_t>(size >> 16),
      static_cast<std::uint8_t>(size >> 8), static_cast<std::uint8_t>(size)};
  return body.size() <= k_max_message && write_all(fd, head, sizeof head) &&
         write_all(fd, body.data(), body.size());
}

Received receive_message(int fd, Message& message, std::chrono::milliseconds limit)
{
  const auto until = Clock::now() + limit;
  std::uint8_t head[4];
  if (const auto got = read_exact(fd, head, sizeof head, until, false); got != Received::message) {
    return got;
  }
  const std::size_t size = (std::size_t{head[0]} << 24) | (std::size_t{head[1]} << 16) |
                           (std::size_t{head[2]} << 8) | head[3];
  if (size > k_max_message) {
    return Received::broken;
  }
  std::vector<std::uint8_t> body(size);
  // Once a message has started, the rest of it comes at once: a generous bound for a big one.
  const auto rest = std::max(until, Clock::now() + std::chrono::seconds(30));
  if (read_exact(fd, body.data(), size, rest, true) != Received::message) {
    return Received::broken;
  }
  message = Message::from_cbor(body, true, false);
  return message.is_discarded() ? Received::broken : Received::message;
}

nlohmann::json::binary_t bytes_of(std::string_view text)
{
  return nlohmann::json::binary_t(std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::string text_of(const nlohmann::json& bytes)
{
  if (bytes.is_binary()) {
    const auto& raw = bytes.get_binary();
    return {raw.begin(), raw.end()};
  }
  return bytes.is_string() ? bytes.get<std::string>() : std::string{};
}

Message ok_message(Message fields)
{
  fields["ok"] = true;
  return fields;
}

Message error_message(const Error& error)
{
  return {{"error",
           {{"kind", static_cast<int>(error.kind)},
            {"message", error.message},
            {"unreached", static_cast<int>(error.unreached)}}}};
}

std::optional<Error> error_in(const Message& reply)
{
  if (!reply.is_object() || !reply.contains("error")) {
    return std::nullopt;
  }
  const auto& e = reply.at("error");
  return Error{static_cast<ErrorKind>(e.value("kind", static_cast<int>(ErrorKind::failed))),
               e.value("message", std::string("the connection holder failed")),
               static_cast<Unreached>(e.value("unreached", static_cast<int>(Unreached::none)))};
}

Message encode(const ExecOutcome& outcome)
{
  Message m = {{"end", static_cast<int>(outcome.end)},
               {"out", encode(outcome.out)},
               {"err", encode(outcome.err)},
               {"lost_reason", outcome.lost_reason},
               {"start_limit_s", outcome.start_limit_s},
               {"held_open", outcome.output_held_open}};
  if (outcome.exit_code) {
    m["exit_code"] = *outcome.exit_code;
  }
  if (!outcome.standby_refused.empty()) {
    m["standby_refused"] = outcome.standby_refused;
  }
  if (outcome.verdict) {
    m["verdict"] = {{"kind", static_cast<int>(outcome.verdict->kind)},
                    {"message", outcome.verdict->message}};
  }
  return m;
}

ExecOutcome decode_outcome(const Message& m)
{
  ExecOutcome outcome;
  outcome.end = static_cast<ExecEnd>(m.at("end").get<int>());
  outcome.out = decode_stream(m.at("out"));
  outcome.err = decode_stream(m.at("err"));
  outcome.lost_reason = m.at("lost_reason").get<std::string>();
  outcome.start_limit_s = m.at("start_limit_s").get<double>();
  outcome.output_held_open = m.at("held_open").get<bool>();
  if (m.contains("exit_code")) {
    outcome.exit_code = m.at("exit_code").get<int>();
  }
  if (m.contains("standby_refused")) {
    outcome.standby_refused = m.at("standby_refused").get<std::string>();
  }
  if (m.contains("verdict")) {
    outcome.verdict = ExecOutcome::Verdict{
        static_cast<ExecOutcome::Verdict::Kind>(m.at("verdict").at("kind").get<int>()),
        m.at("verdict").at("message").get<std::string>()};
  }
  return outcome;
}

Message encode(const FetchedFile& file)
{
  return {{"kind", kind_name(file.kind)}, {"bytes", bytes_of(file.bytes)}, {"other", file.other}};
}

FetchedFile decode_file(const Message& m)
{
  FetchedFile file;
  const auto kind = m.at("kind").get<std::string>();
  file.kind = kind == "regular" ? FetchedFile::Kind::regular
              : kind == "other" ? FetchedFile::Kind::other
                                : FetchedFile::Kind::missing;
  file.bytes = text_of(m.at("bytes"));
  file.other = m.at("other").get<std::string>();
  return file;
}

Message encode(const LauncherSpec& spec)
{
  return {{"run_dir", spec.run_dir},
          {"job_file", spec.job_file},
          {"job_name", bytes_of(spec.job_name)},
          {"interpreter", spec.interpreter},
          {"timeout_s", spec.timeout_s},
          {"grace_s", spec.grace_s},
          {"sentinel", spec.sentinel},
          {"end_marker", spec.end_marker},
          {"params", bytes_of(spec.params)},
          {"frame_limit", spec.result_frame_limit},
          {"keep_run_dir", spec.keep_run_dir},
          {"env", spec.env},
          {"job_sha256", spec.job_sha256}};
}

LauncherSpec decode_launcher(const Message& m)
{
  LauncherSpec spec;
  spec.run_dir = m.at("run_dir").get<std::string>();
  spec.job_file = m.at("job_file").get<std::string>();
  spec.job_name = text_of(m.at("job_name"));
  spec.interpreter = m.at("interpreter").get<std::string>();
  spec.timeout_s = m.at("timeout_s").get<int>();
  spec.grace_s = m.at("grace_s").get<int>();
  spec.sentinel = m.at("sentinel").get<std::string>();
  spec.end_marker = m.at("end_marker").get<std::string>();
  spec.params = text_of(m.at("params"));
  spec.result_frame_limit = m.at("frame_limit").get<std::size_t>();
  spec.keep_run_dir = m.at("keep_run_dir").get<bool>();
  spec.env = m.at("env").get<std::map<std::string, std::string>>();
  spec.job_sha256 = m.at("job_sha256").get<std::string>();
  return spec;
}

Message encode(const RunBundle& bundle)
{
  Message files = Message::array();
  for (const auto& file : bundle.files) {
    files.push_back({file.path, bytes_of(file.bytes), file.mode});
  }
  return {{"launcher", encode(bundle.launcher)},
          {"job", bytes_of(bundle.job_bytes)},
          {"sha256", bundle.job_sha256},
          {"cache_refused", bundle.job_cache_refused},
          {"files", files},
          {"scheduler", bundle.scheduler}};
}

RunBundle decode_bundle(const Message& m)
{
  RunBundle bundle;
  bundle.launcher = decode_launcher(m.at("launcher"));
  bundle.job_bytes = text_of(m.at("job"));
  bundle.job_sha256 = m.at("sha256").get<std::string>();
  bundle.job_cache_refused = m.at("cache_refused").get<bool>();
  for (const auto& file : m.at("files")) {
    bundle.files.push_back(
        {file.at(0).get<std::string>(), text_of(file.at(1)), file.at(2).get<unsigned>()});
  }
  bundle.scheduler = m.at("scheduler");
  return bundle;
}

Message encode(const StagedRun& run)
{
  Message m = {{"run_dir", run.run_dir},
               {"launcher", encode(run.launcher)},
               {"cached", run.job_from_cache},
               {"id", run.id}};
  if (!run.job_cache_remade.empty()) {
    m["cache_remade"] = run.job_cache_remade;
  }
  return m;
}

StagedRun decode_run(const Message& m)
{
  StagedRun run;
  run.run_dir = m.at("run_dir").get<std::string>();
  run.launcher = decode_launcher(m.at("launcher"));
  run.job_from_cache = m.at("cached").get<bool>();
  if (m.contains("cache_remade")) {
    run.job_cache_remade = m.at("cache_remade").get<std::string>();
  }
  run.id = m.at("id").get<std::uint64_t>();
  return run;
}

Message encode(const LaunchRequest& request)
{
  return {{"output_cap", request.output_cap},
          {"report_cap", request.report_cap},
          {"deadline_ms", ms_of(request.deadline)},
          {"grace_ms", ms_of(request.grace)}};
}

LaunchRequest decode_launch(const Message& m)
{
  LaunchRequest request;
  request.output_cap = m.at("output_cap").get<std::size_t>();
  request.report_cap = m.at("report_cap").get<std::size_t>();
  request.deadline = std::chrono::milliseconds(m.at("deadline_ms").get<long long>());
  request.grace = std::chrono::milliseconds(m.at("grace_ms").get<long long>());
  return request;
}

Message encode(const std::optional<std::vector<DirEntry>>& entries)
{
  if (!entries) {
    return nullptr;
  }
  Message list = Message::array();
  for (const auto& entry : *entries) {
    list.push_back({entry.name, static_cast<int>(entry.kind), entry.size, entry.what});
  }
  return list;
}

std::optional<std::vector<DirEntry>> decode_entries(const Message& m)
{
  if (m.is_null()) {
    return std::nullopt;
  }
  std::vector<DirEntry> entries;
  for (const auto& e : m) {
    entries.push_back(DirEntry{e.at(0).get<std::string>(),
                               static_cast<DirEntry::Kind>(e.at(1).get<int>()),
                               e.at(2).get<std::uint64_t>(), e.at(3).get<std::string>()});
  }
  return entries;
}

// The server's texts go as bytes: untrusted, maybe not UTF-8; the client shows them through
// terminal_safe.
Message encode(const PromptRound& round)
{
  Message prompts = Message::array();
  for (const auto& prompt : round.prompts) {
    prompts.push_back({{"text", bytes_of(prompt.text)}, {"echo", prompt.echo}});
  }
  return {{"host", round.host},
          {"name", bytes_of(round.name)},
          {"instruction", bytes_of(round.instruction)},
          {"prompts", std::move(prompts)}};
}

PromptRound decode_round(const Message& m)
{
  PromptRound round;
  round.host = m.at("host").get<std::string>();
  round.name = text_of(m.at("name"));
  round.instruction = text_of(m.at("instruction"));
  for (const auto& prompt : m.at("prompts")) {
    round.prompts.push_back({text_of(prompt.at("text")), prompt.at("echo").get<bool>()});
  }
  return round;
}

} // namespace ferry::held
