#include "ferry/remote/launcher.hpp"
#include "ferry/remote/standby_boot.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "ferry/util.hpp"
#include "remote/remote_scripts.hpp"

namespace ferry {

std::string sh_quote(std::string_view text)
{
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string fill_template(std::string_view script, const std::map<std::string, std::string>& fields)
{
  std::string out;
  out.reserve(script.size() + 512);
  std::size_t pos = 0;
  while (pos < script.size()) {
    const std::size_t at = script.find('@', pos);
    if (at == std::string_view::npos) {
      break;
    }
    const std::size_t close = script.find('@', at + 1);
    const auto field = close == std::string_view::npos
                           ? fields.end()
                           : fields.find(std::string(script.substr(at + 1, close - at - 1)));
    if (field == fields.end()) {
      out.append(script.substr(pos, at + 1 - pos));
      pos = at + 1;
      continue;
    }
    out.append(script.substr(pos, at - pos));
    out.append(field->second);
    pos = close + 1;
  }
  out.append(script.substr(pos));
  return out;
}

std::string_view remote_script(std::string_view file_name)
{
  for (const auto& file : remote_script_files()) {
    if (file.file_name == file_name) {
      return file.bytes;
    }
  }
  throw std::logic_error(fmt::format("no remote script {} was embedded", file_name));
}

namespace {

// Takes the next line (without its newline) off `text`; nullopt when no newline is left.
std::optional<std::string_view> take_line(std::string_view& text)
{
  const auto newline = text.find('\n');
  if (newline == std::string_view::npos) {
    return std::nullopt;
  }
  const std::string_view line = text.substr(0, newline);
  text.remove_prefix(newline + 1);
  return line;
}

template <typename Number> std::optional<Number> whole_number(std::string_view text)
{
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<LauncherReport> parse_end_line(std::string_view line)
{
  const auto space = line.find(' ');
  if (space == std::string_view::npos) {
    return std::nullopt;
  }
  LauncherReport report;
  const auto code = whole_number<int>(line.substr(0, space));
  if (!code) {
    return std::nullopt;
  }
  report.code = *code;
  const std::string_view cause = line.substr(space + 1);
  if (cause == "exit") {
    report.cause = LauncherCause::exited;
  } else if (cause == "timeout") {
    report.cause = LauncherCause::timeout;
  } else if (cause == "stopped") {
    report.cause = LauncherCause::stopped;
  } else {
    return std::nullopt;
  }
  return report;
}

// `gpus INDEX UUID ...`: the line's words in pairs, each checked as the launcher checked them.
std::optional<std::vector<PickedGpu>> parse_gpus_line(std::string_view line)
{
  std::vector<PickedGpu> gpus;
  std::vector<std::string_view> words;
  for (std::size_t at = 0; at <= line.size();) {
    const auto space = std::min(line.find(' ', at), line.size());
    words.push_back(line.substr(at, space - at));
    at = space + 1;
  }
  if (words.size() < 3 || words.size() % 2 == 0 || words[0] != "gpus") {
    return std::nullopt;
  }
  for (std::size_t i = 1; i < words.size(); i += 2) {
    const auto index = whole_number<int>(words[i]);
    const std::string_view uuid = words[i + 1];
    if (!index || uuid.empty() || uuid.front() == '-' ||
        uuid.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-") !=
            std::string_view::npos) {
      return std::nullopt;
    }
    gpus.push_back({*index, std::string(uuid)});
  }
  return gpus;
}

// Takes a `gpus` line off the front of `rest` into `report`, when there is one.
void take_gpus_line(std::string_view& rest, LauncherReport& report)
{
  std::string_view after = rest;
  const auto line = take_line(after);
  if (!line || !line->starts_with("gpus ")) {
    return;
  }
  if (auto gpus = parse_gpus_line(*line)) {
    report.gpus = std::move(*gpus);
    rest = after;
  }
}

std::optional<ReportedResult> result_kind(std::string_view word)
{
  static constexpr std::pair<std::string_view, ReportedResult> kinds[] = {
      {"none", ReportedResult::none},           {"file", ReportedResult::file},
      {"fetch", ReportedResult::fetch},         {"link", ReportedResult::link},
      {"directory", ReportedResult::directory}, {"special", ReportedResult::special}};
  for (const auto& [name, kind] : kinds) {
    if (name == word) {
      return kind;
    }
  }
  return std::nullopt;
}

// The result and clean sections; false (and `report` untouched) when they are not exactly as
// the launcher prints them.
bool parse_result_sections(std::string_view rest, LauncherReport& report)
{
  const auto header = take_line(rest);
  if (!header || header->substr(0, 7) != "result ") {
    return false;
  }
  const std::string_view words = header->substr(7);
  const auto space = words.find(' ');
  const auto kind = result_kind(words.substr(0, space));
  if (!kind) {
    return false;
  }
  std::string_view bytes;
  if (*kind == ReportedResult::file) {
    const auto size = whole_number<std::size_t>(
        space == std::string_view::npos ? std::string_view() : words.substr(space + 1));
    if (!size || *size > rest.size()) {
      return false;
    }
    bytes = rest.substr(0, *size);
    rest.remove_prefix(*size);
  }
  const auto clean = take_line(rest);
  if (!clean || !rest.empty() ||
      (*clean != "clean removed" && *clean != "clean kept" && *clean != "clean failed")) {
    return false;
  }
  report.result = *kind;
  report.result_bytes = std::string(bytes);
  report.run_dir_removed = *clean == "clean removed";
  return true;
}

} // namespace

std::optional<LauncherReport> parse_launcher_report(std::string_view text)
{
  const auto line = take_line(text);
  if (!line) {
    return std::nullopt;
  }
  auto report = parse_end_line(*line);
  if (report) {
    take_gpus_line(text, *report);
  }
  if (report && !text.empty()) {
    // A garbled result section (a process the job left behind wrote into the stream) leaves
    // the result to be fetched as before.
    (void)parse_result_sections(text, *report);
  }
  return report;
}

bool is_whole_launcher_report(std::string_view text)
{
  const auto line = take_line(text);
  if (!line) {
    return false;
  }
  auto report = parse_end_line(*line);
  if (report) {
    take_gpus_line(text, *report);
  }
  return report && parse_result_sections(text, *report);
}

namespace {
// After the deadline, a margin before the sweep touches a directory; one a launcher never ran in
// (an upload that broke off) is left a day, as an upload may still be under way.
constexpr long long k_sweep_margin_s = 60;
constexpr long long k_unstarted_age_s = 24 * 3600;

std::optional<long long> number(std::string_view text)
{
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}
} // namespace

std::optional<long> state_file_pid(std::string_view state)
{
  const auto space = state.find(' ');
  const auto pid = number(state.substr(0, space));
  return pid && *pid > 1 ? std::optional<long>(static_cast<long>(*pid)) : std::nullopt;
}

bool is_stale_run(const StaleRunCheck& check)
{
  if (check.launcher_alive) {
    return false;
  }
  if (!check.state) {
    return check.now - check.modified > k_unstarted_age_s;
  }
  std::string_view state = *check.state;
  while (!state.empty() && (state.back() == '\n' || state.back() == '\r')) {
    state.remove_suffix(1);
  }
  const auto space = state.find(' ');
  std::string_view when = space == std::string_view::npos ? "" : state.substr(space + 1);
  // `+SECONDS` counts from the directory's last change (which is never earlier than the
  // launcher's start); a plain number is an epoch deadline (earlier launchers).
  const bool relative = !when.empty() && when.front() == '+';
  const auto deadline = number(relative ? when.substr(1) : when);
  // A launcher that could not tell its deadline: the directory's own age stands in for it.
  const long long until = !deadline || *deadline <= 0 ? check.modified + k_unstarted_age_s
                          : relative                  ? check.modified + *deadline
                                                      : *deadline;
  return check.now > until + k_sweep_margin_s;
}

bool is_run_dir_name(std::string_view name)
{
  // ferry- + 16 (20261130T221500Z) + - + 32 hex
  if (name.size() != 6 + 16 + 1 + 32 || name.substr(0, 6) != "ferry-" || name[22] != '-') {
    return false;
  }
  const std::string_view hex = name.substr(23);
  return hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

std::string gpu_request(int gpus, int wait_s)
{
  return fmt::format("{} {}", gpus, wait_s);
}

namespace {
// The GPUs a spec asks for and how long the launcher may wait for them (gpu_request's words).
struct GpuAsk {
  int gpus = 0;
  int wait_s = 0;
};
GpuAsk gpu_ask(const LauncherSpec& spec)
{
  const auto request = spec.env.find(k_launcher_gpus_var);
  if (request == spec.env.end()) {
    return {};
  }
  const std::string_view text = request->second;
  const auto space = text.find(' ');
  const auto gpus = whole_number<int>(text.substr(0, space));
  const auto wait_s = space == std::string_view::npos ? std::optional<int>(0)
                                                      : whole_number<int>(text.substr(space + 1));
  return gpus && wait_s ? GpuAsk{*gpus, *wait_s} : GpuAsk{};
}

// The GPU picker (src/remote/gpus.sh) for a spec that asks for GPUs, else nothing: a run without
// them does not carry its bytes.
std::string gpu_picker(const LauncherSpec& spec)
{
  const GpuAsk ask = gpu_ask(spec);
  if (ask.gpus <= 0) {
    return ":";
  }
  return fill_template(remote_script("gpus.sh"),
                       {{"gpu_count", std::to_string(ask.gpus)},
                        {"wait_gpus", std::to_string(std::max(ask.wait_s, 0))},
                        {"gpu_memory_free", std::to_string(k_gpu_memory_free_mib)},
                        {"gpus_refused_prefix", k_launcher_gpus_refused_prefix},
                        {"gpus_refused_exit", std::to_string(k_launcher_gpus_refused_exit)}});
}

// The seconds a detached run waits for collection (`which` 0), or its output cap (1, 0 for
// none), from detach_request's `SECONDS[:CAP]`; '' for a run the channel follows.
std::string detach_field(const LauncherSpec& spec, int which)
{
  const auto detach = spec.env.find(k_launcher_detach_var);
  if (detach == spec.env.end()) {
    return "''";
  }
  const std::string& value = detach->second;
  const auto colon = value.find(':');
  const std::string seconds = value.substr(0, colon);
  const std::string cap = colon == std::string::npos ? "0" : value.substr(colon + 1);
  if (!whole_number<long long>(seconds) || !whole_number<long long>(cap)) {
    return "''";
  }
  return which == 0 ? seconds : cap;
}

// One `set -- "$@" 'NAME=value'` line a variable: the value is quoted text, never code.
std::string env_lines(const std::map<std::string, std::string>& env)
{
  std::string lines;
  for (const auto& [name, value] : env) {
    if (name == k_launcher_gpus_var || name == k_launcher_detach_var) {
      continue; // the launcher's own requests, not the job's
    }
    lines += "set -- \"$@\" " + sh_quote(name + "=" + value) + "\n";
  }
  return lines.empty() ? ":" : lines.substr(0, lines.size() - 1);
}

// The `# ferry-standby 2` line (src/remote/standby.py reads it): launch.sh's fields in hex, in
// this list's order, the interpreter last. The list is the line's only definition: standby.py
// gets the prefix and the fields' names from it (standby_script() fills them in).
constexpr std::string_view k_standby_prefix = "# ferry-standby 2";
struct StandbyField {
  std::string_view name;
  std::string (*value)(const LauncherSpec&);
};
const StandbyField k_standby_fields[] = {
    {"run_dir", [](const LauncherSpec& s) { return s.run_dir; }},
    {"job_name", [](const LauncherSpec& s) { return s.job_name; }},
    {"job_file", [](const LauncherSpec& s) { return s.job_file; }},
    {"sentinel", [](const LauncherSpec& s) { return s.sentinel; }},
    {"end_marker", [](const LauncherSpec& s) { return s.end_marker; }},
    {"timeout", [](const LauncherSpec& s) { return std::to_string(s.timeout_s); }},
    {"grace", [](const LauncherSpec& s) { return std::to_string(s.grace_s); }},
    {"timeout_marker", [](const LauncherSpec&) { return std::string(k_launcher_timeout_marker); }},
    {"timeout_exit", [](const LauncherSpec&) { return std::to_string(k_launcher_timeout_exit); }},
    {"state_file", [](const LauncherSpec&) { return std::string(k_launcher_state_file); }},
    {"launch_file", [](const LauncherSpec&) { return std::string(k_launcher_file); }},
    {"params_size", [](const LauncherSpec& s) { return std::to_string(s.params.size()); }},
    {"frame_limit", [](const LauncherSpec& s) { return std::to_string(s.result_frame_limit); }},
    {"keep", [](const LauncherSpec& s) { return std::string(s.keep_run_dir ? "1" : "0"); }},
    {"job_sha256", [](const LauncherSpec& s) { return s.job_sha256; }},
    {"interpreter", [](const LauncherSpec& s) { return s.interpreter; }},
};

// That line for `spec`; `#` for a job the standby does not run (a declared environment, which
// could change how the interpreter starts).
std::string standby_line(const LauncherSpec& spec)
{
  if (!runs_on_standby(spec)) {
    return "#";
  }
  std::string line(k_standby_prefix);
  for (const auto& field : k_standby_fields) {
    const std::string value = field.value(spec);
    line += " " + (value.empty() ? std::string("-") : lower_hex(value));
  }
  return line;
}

// The names of those fields, in order, as standby.py's @standby_fields@.
std::string standby_field_names()
{
  std::string names;
  for (const auto& field : k_standby_fields) {
    names += (names.empty() ? "" : " ") + std::string(field.name);
  }
  return names;
}
} // namespace

std::string detach_request(long long keep_for_s, std::size_t output_cap)
{
  return std::to_string(keep_for_s) + ":" + std::to_string(output_cap);
}

bool runs_on_standby(const LauncherSpec& spec)
{
  return spec.env.empty();
}

bool runs_on_python_ahead(const LauncherSpec& spec)
{
  return spec.interpreter == "python3" && runs_on_standby(spec);
}

std::string make_launcher(const LauncherSpec& spec)
{
  return fill_template(remote_script("launch.sh"),
                       {
                           {"run_dir", sh_quote(spec.run_dir)},
                           {"job_name", sh_quote(spec.job_name)},
                           {"sentinel", sh_quote(spec.sentinel)},
                           {"end_marker", sh_quote(spec.end_marker)},
                           {"interpreter", sh_quote(spec.interpreter)},
                           {"job_file", sh_quote(spec.job_file)},
                           {"timeout", std::to_string(spec.timeout_s)},
                           {"grace", std::to_string(spec.grace_s)},
                           {"timeout_marker", k_launcher_timeout_marker},
                           {"timeout_exit", std::to_string(k_launcher_timeout_exit)},
                           {"no_interp_prefix", k_launcher_no_interpreter_prefix},
                           {"no_interp_exit", std::to_string(k_launcher_no_interpreter_exit)},
                           {"state_file", k_launcher_state_file},
                           {"launch_file", k_launcher_file},
                           {"params_size", std::to_string(spec.params.size())},
                           {"frame_limit", std::to_string(spec.result_frame_limit)},
                           {"keep", spec.keep_run_dir ? "1" : "0"},
                           {"env", env_lines(spec.env)},
                           {"job_sha256", sh_quote(spec.job_sha256)},
                           {"cache_refused_prefix", k_launcher_cache_refused_prefix},
                           {"cache_refused_exit", std::to_string(k_launcher_cache_refused_exit)},
                           {"standby", standby_line(spec)},
                           {"gpu_picker", gpu_picker(spec)},
                           {"detach", detach_field(spec, 0)},
                           {"detach_cap", detach_field(spec, 1)},
                           {"stdout_file", k_detached_stdout},
                           {"stderr_file", k_detached_stderr},
                           {"done_file", k_detached_done},
                       }) +
         spec.params;
}

namespace {

// The python standby as it goes into a job cache: a loader, then src/remote/standby.py as the
// string BODY. ferry never has a python run that file: its standby channel's sh execs
// k_standby_verifier (below), which reads the entry, checks its sha256 and runs the bytes it
// checked. A python compiles a whole file before it runs any of it, and compiling the standby took
// a third of its start (10 of 32 ms on the development VM); so the loader keeps the compiled code
// beside itself in the job cache, `ferry-job-SHA256.TAG` (TAG: the python's cache tag without its
// dash, e.g. cpython311; a name the cache's cleanup knows), written as a job's entry is (a
// temporary name, mode 0400, a rename), and uses it only when its sha256 is the one ferry was told
// by the standby that wrote it in the same session (`_ferry_tag_sha`, from the verifier's
// arguments). Else BODY compiles, and the code goes to a new `.TAG` whose sha256 the standby tells
// ferry on its ready line (k_standby_ready). Run as a file (no verifier), it only compiles.
constexpr std::string_view k_standby_loader_head =
    R"py(# ferry's python standby: this loader, then src/remote/standby.py as BODY (src/remote/launcher.cpp)
import marshal
import sys


def _ferry_code():
    # (code, the sha256 of the .TAG file it is in, or "-")
    import posix as os
    import time
    tag = "".join(c for c in (sys.implementation.cache_tag or "") if c.isalnum())
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    path = __file__[:-3] + "." + tag if tag and __file__.endswith(".py") else None
    known = globals().get("_ferry_tag_sha", "-")
    sha256 = globals().get("_ferry_sha256")
    if path is None or sha256 is None:
        return compile(BODY, __file__, "exec", dont_inherit=True), "-"
    if known != "-":
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                data = b""
                while True:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
            if data.startswith(magic) and sha256(data).hexdigest() == known:
                code = marshal.loads(data[len(magic):])
                if time.time() - st.st_mtime > 86400:
                    os.utime(path)
                return code, known
        except (OSError, ValueError, EOFError, TypeError):
            pass
    code = compile(BODY, __file__, "exec", dont_inherit=True)
    upload = path[:path.rfind("/")] + "/.ferry-job-" + os.urandom(16).hex()
    data = magic + marshal.dumps(code)
    try:
        fd = os.open(upload, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(upload, path)
    except OSError:
        try:
            os.unlink(upload)
        except OSError:
            pass
        return code, "-"
    return code, sha256(data).hexdigest()


BODY = r""")py";
constexpr std::string_view k_standby_loader_tail = R"py("""
_ferry_run, _ferry_tag = _ferry_code()
if "_ferry_tag_sha" in globals():
    sys.modules["posix"].write(1, b"@ready@ " + _ferry_tag.encode() + b"\n")
del _ferry_code, _ferry_tag
exec(_ferry_run)
)py";

// What the standby channel's sh execs as the python standby (standby_boot_line): reads ENTRY
// (argv 1: the script in the job cache, a regular file, not followed as a link), runs its bytes
// only when their sha256 is SHA (argv 2, which ferry computed from its own copy), compiled here,
// never from a file; tells the loader the sha256 of its compiled code (argv 3, or "-"). An entry
// that cannot be read or does not match ends it with k_standby_refused_exit before anything of it
// runs. Only ferry's constant text: no quote in it, so it travels inside '...'.
constexpr std::string_view k_standby_verifier = R"py(import sys
def _ferry_verify():
    import posix
    try:
        import _sha2 as m
    except ImportError:
        try:
            import _sha256 as m
        except ImportError:
            import hashlib as m
    entry, sha = sys.argv[1], sys.argv[2]
    data = b""
    try:
        fd = posix.open(entry, posix.O_RDONLY | posix.O_NOFOLLOW)
        try:
            while True:
                chunk = posix.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            posix.close(fd)
    except OSError as e:
        posix.write(2, b"ferry-standby: cannot read " + entry.encode() + b": " + e.strerror.encode() + b"\n")
        posix._exit(@refused@)
    if m.sha256(data).hexdigest() != sha:
        posix.write(2, b"ferry-standby: " + entry.encode() + b" does not match its sha256\n")
        posix._exit(@refused@)
    main = sys.modules["__main__"]
    main.__file__ = entry
    main._ferry_tag_sha = sys.argv[3]
    main._ferry_sha256 = m.sha256
    return compile(data, entry, "exec", dont_inherit=True)
exec(_ferry_verify())
del _ferry_verify
)py";

} // namespace

std::string_view standby_script()
{
  static const std::string text = [] {
    const std::string body =
        fill_template(remote_script(k_standby_script),
                      {{"standby_prefix", std::string(k_standby_prefix)},
                       {"standby_fields", standby_field_names()},
                       {"entry_refused", std::string(k_standby_entry_refused_prefix)},
                       {"entry_mismatch", std::string(k_standby_entry_mismatch)},
                       {"entry_unlike", std::string(k_standby_entry_unlike)}});
    if (body.find(R"(""")") != std::string::npos || body.ends_with("\\")) {
      throw std::logic_error("src/remote/standby.py cannot go in a raw string literal");
    }
    return std::string(k_standby_loader_head) + body +
           fill_template(std::string(k_standby_loader_tail),
                         {{"ready", std::string(k_standby_ready)}});
  }();
  return text;
}

std::string standby_boot_line(const std::string& entry, const std::string& tag_sha256, bool once)
{
  // One line (`exec("...")`), so that the standby's command line reads as one in ps and /proc.
  static const std::string verifier = [] {
    std::string text = "exec(\"";
    for (const char c : fill_template(std::string(k_standby_verifier),
                                      {{"refused", std::to_string(k_standby_refused_exit)}})) {
      if (c == '\'') {
        throw std::logic_error("the python standby's verifier cannot go in '...'");
      }
      text += c == '\n'               ? std::string("\\n")
              : c == '"' || c == '\\' ? std::string("\\") + c
                                      : std::string(1, c);
    }
    return text + "\")";
  }();
  static const std::string script_sha256 = sha256_hex(standby_script());
  return fmt::format("exec python3 -I -S -c '{}' {} {} {}{}{}\n", verifier, entry, script_sha256,
                     tag_sha256.empty() ? "-" : tag_sha256, once ? " once" : "",
                     k_ahead_process_tail);
}

} // namespace ferry
