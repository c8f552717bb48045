#include <charconv>

#include "archive/errors.hpp"
#include "archive/resolve.hpp"

namespace ferry::archive {

namespace fs = std::filesystem;

namespace {

// `last` is 0, `last~N` is N; nullopt for anything that does not start with "last".
Expected<std::optional<std::int64_t>> runs_back(std::string_view ref)
{
  if (ref == "last") {
    return std::optional<std::int64_t>(0);
  }
  if (!ref.starts_with("last~")) {
    return std::optional<std::int64_t>();
  }
  const std::string_view digits = ref.substr(5);
  std::int64_t back = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), back);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || back < 0) {
    return fail(ErrorKind::usage,
                "run '{}': after 'last~' give how many runs back, as a number (last~1 is the run "
                "before the last)",
                ref);
  }
  return std::optional<std::int64_t>(back);
}

std::string narrowing_text(const RunNarrowing& narrow)
{
  std::string text;
  if (narrow.job) {
    text += fmt::format(" of job '{}'", *narrow.job);
  }
  if (narrow.host) {
    text += fmt::format(" on host '{}'", *narrow.host);
  }
  return text;
}

// The newest run but BACK, among those NARROW lets through.
Expected<std::string> nth_newest(Database& db, const fs::path& path, std::string_view ref,
                                 std::int64_t back, const RunNarrowing& narrow)
{
  std::string sql = "SELECT run_id FROM runs WHERE 1";
  if (narrow.job) {
    sql += " AND job = ?1";
  }
  if (narrow.host) {
    sql += " AND (host = ?2 OR host_label = ?2)";
  }
  sql += " ORDER BY started_at DESC, rowid DESC LIMIT 1 OFFSET ?3";
  FERRY_TRY_ASSIGN(auto stmt, explained(db.prepare(sql), path, "read archive", &db));
  if (narrow.job) {
    stmt.bind(1, *narrow.job);
  }
  if (narrow.host) {
    stmt.bind(2, *narrow.host);
  }
  stmt.bind(3, back);
  FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read archive", &db));
  if (!row) {
    const std::string held = back == 0 ? "no runs" : fmt::format("fewer than {} runs", back + 1);
    return fail(ErrorKind::usage, "no run '{}'{}: archive {} holds {}{}; `ferry log` lists them",
                ref, narrowing_text(narrow), path.string(), held,
                narrow.job || narrow.host ? " of that kind" : " yet");
  }
  return stmt.column_bytes(0);
}

// The smallest string greater than every string that starts with `prefix`; empty: none.
std::string prefix_upper_bound(std::string prefix)
{
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last != 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return prefix;
}

struct Candidate {
  std::string run_id;
  std::string line; // "ID  JOB @ HOST  STARTED"
};

// The run whose whole id is REF, if any: the primary key's index answers it, where the prefix
// search below reads every run (no index covers the part after the timestamp).
Expected<bool> has_run(Database& db, const fs::path& path, std::string_view ref)
{
  FERRY_TRY_ASSIGN(auto stmt, explained(db.prepare("SELECT 1 FROM runs WHERE run_id = ?1"), path,
                                        "read archive", &db));
  stmt.bind(1, ref);
  return explained(stmt.step(), path, "read archive", &db);
}

// The runs whose id, or whose random part (after the timestamp's '-'), starts with PREFIX; the
// whole id itself first. At most max_listed_candidates + 1.
Expected<std::vector<Candidate>> candidates(Database& db, const fs::path& path,
                                            std::string_view prefix)
{
  const std::string upper = prefix_upper_bound(std::string(prefix));
  const std::string below = upper.empty() ? "" : " AND {0} < ?2";
  const std::string random_part = "substr(run_id, instr(run_id, '-') + 1)";
  const std::string sql = fmt::format(
      "SELECT run_id, job, host_label, started_at FROM runs WHERE run_id = ?1 OR (run_id >= ?1{}) "
      "OR ({} >= ?1{}) ORDER BY run_id = ?1 DESC, started_at DESC LIMIT {}",
      fmt::format(fmt::runtime(below), "run_id"), random_part,
      fmt::format(fmt::runtime(below), random_part), max_listed_candidates + 1);
  FERRY_TRY_ASSIGN(auto stmt, explained(db.prepare(sql), path, "read archive", &db));
  stmt.bind(1, prefix);
  if (!upper.empty()) {
    stmt.bind(2, upper);
  }
  std::vector<Candidate> found;
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read archive", &db));
    if (!row) {
      return found;
    }
    found.push_back({stmt.column_bytes(0),
                     fmt::format("{}  {} @ {}  {}", stmt.column_bytes(0), stmt.column_bytes(1),
                                 stmt.column_bytes(2), stmt.column_bytes(3))});
  }
}

Unexpected<Error> ambiguous(std::string_view ref, const std::vector<Candidate>& found)
{
  std::string listed;
  const auto shown = std::min<std::size_t>(found.size(), max_listed_candidates);
  for (std::size_t i = 0; i < shown; ++i) {
    listed += "\n  " + found[i].line;
  }
  return fail(ErrorKind::usage, "run '{}' is ambiguous; it matches{}:{}{}\ngive more characters",
              ref, found.size() > shown ? fmt::format(" more than {} runs", shown) : "", listed,
              found.size() > shown ? "\n  …" : "");
}

} // namespace

Expected<std::string> resolve_invocation(Database& db, const fs::path& path, std::string_view ref)
{
  if (ref.empty()) {
    return fail(ErrorKind::usage, "no invocation given: pass 'last', an invocation id or a "
                                  "unique prefix of one (`ferry log --json` shows them)");
  }
  const bool last = ref == "last";
  // Ids are digits, letters and '-': every one with the prefix sorts before prefix + '~'.
  auto stmt = db.prepare(last ? "SELECT i.invocation FROM run_invocations i JOIN runs r "
                                "USING (run_id) ORDER BY r.started_at DESC, r.rowid DESC LIMIT 1"
                              : "SELECT DISTINCT invocation FROM run_invocations WHERE invocation "
                                ">= ?1 AND invocation < ?1 || '~' ORDER BY invocation LIMIT 11");
  if (!stmt && stmt.error().message.find("no such table") != std::string::npos) {
    return fail(ErrorKind::usage,
                "invocation '{}': the runs in archive {} were recorded before ferry kept their "
                "invocation; runs from now on carry one",
                ref, path.string());
  }
  FERRY_TRY_ASSIGN(auto query, explained(std::move(stmt), path, "read archive", &db));
  if (!last) {
    query.bind(1, std::string(ref));
  }
  std::vector<std::string> found;
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, explained(query.step(), path, "read archive", &db));
    if (!row) {
      break;
    }
    found.push_back(query.column_bytes(0));
  }
  if (found.empty()) {
    return fail(ErrorKind::usage,
                "no invocation '{}' in archive {}; `ferry log --json` shows "
                "each run's invocation",
                ref, path.string());
  }
  if (found.size() > 1 && found.front() != ref) {
    return fail(
        ErrorKind::usage,
        "invocation '{}' is ambiguous; it matches {}{}; give more "
        "characters",
        ref,
        fmt::join(found.begin(), found.begin() + std::min<std::size_t>(found.size(), 10), ", "),
        found.size() > 10 ? ", …" : "");
  }
  return found.front();
}

Expected<std::string> resolve_run(Database& db, const fs::path& path, std::string_view ref,
                                  const RunNarrowing& narrow)
{
  if (ref.empty()) {
    return fail(ErrorKind::usage,
                "no run given: pass a run id, a unique prefix of one or of its random part, "
                "'last' or 'last~N'");
  }
  FERRY_TRY_ASSIGN(const auto back, runs_back(ref));
  if (back) {
    return nth_newest(db, path, ref, *back, narrow);
  }
  if (narrow.job || narrow.host) {
    return fail(ErrorKind::usage,
                "run '{}': --job and --host narrow 'last' and 'last~N' only; a run id already "
                "names one run",
                ref);
  }
  FERRY_TRY_ASSIGN(const bool whole_id, has_run(db, path, ref));
  if (whole_id) {
    return std::string(ref);
  }
  FERRY_TRY_ASSIGN(const auto found, candidates(db, path, ref));
  if (found.empty()) {
    return fail(ErrorKind::usage, "no run '{}' in archive {}; `ferry log` lists the runs", ref,
                path.string());
  }
  if (found.size() > 1 && found.front().run_id != ref) {
    return ambiguous(ref, found);
  }
  return found.front().run_id;
}

} // namespace ferry::archive
