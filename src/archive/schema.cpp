#include <array>

#include "archive/schema.hpp"

namespace ferry::archive {

namespace {

// Version 1. `record` is the run's JSON record (to_json) without "stdout"/"stderr": those, the
// script and the result file are kept byte-exact as BLOBs, since they may be any bytes.
// Columns before the BLOBs are what `log` filters and prints, so it never reads a BLOB.
constexpr std::string_view v1 = R"sql(
CREATE TABLE scripts (
  sha256 TEXT PRIMARY KEY NOT NULL,
  name   TEXT NOT NULL DEFAULT '',
  bytes  BLOB NOT NULL
);
CREATE TABLE runs (
  run_id        TEXT PRIMARY KEY NOT NULL,
  job           TEXT NOT NULL,
  job_sha256    TEXT NOT NULL,
  script_sha256 TEXT REFERENCES scripts(sha256),
  script_name   TEXT NOT NULL DEFAULT '',
  host          TEXT NOT NULL,
  host_label    TEXT NOT NULL,
  status        TEXT NOT NULL,
  exit_code     INTEGER,
  error         TEXT,
  started_at    TEXT NOT NULL,
  duration_s    REAL NOT NULL,
  replay_of     TEXT,
  ferry_version TEXT NOT NULL,
  record        TEXT NOT NULL,
  result_bytes  BLOB,
  stdout        BLOB NOT NULL,
  stderr        BLOB NOT NULL
);
CREATE INDEX runs_by_started_at ON runs(started_at);
CREATE INDEX runs_by_job ON runs(job, started_at);
CREATE INDEX runs_by_host ON runs(host, started_at);
CREATE INDEX runs_by_host_label ON runs(host_label, started_at);
CREATE INDEX runs_by_status ON runs(status, started_at);
CREATE INDEX runs_by_replay_of ON runs(replay_of) WHERE replay_of IS NOT NULL;
PRAGMA application_id = 1179800153;
)sql";

// Version 2: `log` reads only small columns. What it prints sits before the record, the start
// of the result (`result_head`) included; params and the result leave the record for columns of
// their own after it, with the BLOBs, so listing runs never reads them however big they are.
// v1 rows are moved over with SQLite's JSON functions, which copy every value's text as it is.
// A record they cannot take apart (nested deeper than SQLite's JSON depth limit) stays whole,
// with params NULL: such rows read as in v1.
constexpr std::string_view v2 = R"sql(
CREATE TABLE runs_v2 (
  run_id        TEXT PRIMARY KEY NOT NULL,
  job           TEXT NOT NULL,
  job_sha256    TEXT NOT NULL,
  script_sha256 TEXT REFERENCES scripts(sha256),
  script_name   TEXT NOT NULL DEFAULT '',
  host          TEXT NOT NULL,
  host_label    TEXT NOT NULL,
  status        TEXT NOT NULL,
  exit_code     INTEGER,
  error         TEXT,
  started_at    TEXT NOT NULL,
  duration_s    REAL NOT NULL,
  replay_of     TEXT,
  ferry_version TEXT NOT NULL,
  result_head   TEXT,
  record        TEXT NOT NULL,
  params        BLOB,
  result        BLOB,
  result_bytes  BLOB,
  stdout        BLOB NOT NULL,
  stderr        BLOB NOT NULL
);
INSERT INTO runs_v2(run_id, job, job_sha256, script_sha256, script_name, host, host_label, status,
                    exit_code, error, started_at, duration_s, replay_of, ferry_version,
                    result_head, record, params, result, result_bytes, stdout, stderr)
SELECT run_id, job, job_sha256, script_sha256, script_name, host, host_label, status, exit_code,
       error, started_at, duration_s, replay_of, ferry_version,
       CASE WHEN json_valid(record) AND json_type(record, '$.result') <> 'null'
            THEN substr(record -> '$.result', 1, 256) END,
       CASE WHEN json_valid(record) THEN json_remove(record, '$.params', '$.result')
            ELSE record END,
       CASE WHEN json_valid(record) THEN coalesce(record -> '$.params', '{}') END,
       CASE WHEN json_valid(record) AND json_type(record, '$.result') <> 'null'
            THEN record -> '$.result' END,
       result_bytes, stdout, stderr
FROM runs ORDER BY rowid;
DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX runs_by_started_at ON runs(started_at);
CREATE INDEX runs_by_job ON runs(job, started_at);
CREATE INDEX runs_by_host ON runs(host, started_at);
CREATE INDEX runs_by_host_label ON runs(host_label, started_at);
CREATE INDEX runs_by_status ON runs(status, started_at);
CREATE INDEX runs_by_replay_of ON runs(replay_of) WHERE replay_of IS NOT NULL;
)sql";

// Version 3: the files that travel with a run and the files fetched back from it. Their bytes
// are kept once per sha256 in `scripts` (the table of every blob by hash); `archived` says
// whether an output's bytes were kept (larger ones are recorded with their hash only).
constexpr std::string_view v3 = R"sql(
CREATE TABLE run_files (
  run_id   TEXT NOT NULL,
  kind     TEXT NOT NULL CHECK (kind IN ('file', 'output')),
  path     TEXT NOT NULL,
  mode     INTEGER,
  size     INTEGER NOT NULL,
  sha256   TEXT NOT NULL,
  archived INTEGER NOT NULL,
  PRIMARY KEY (run_id, kind, path)
);
)sql";

// Version 4: the invocation a run belongs to (every run of one `ferry run` shares its id), for
// `log --invocation` and `run --retry-failed`. A table of its own, not a column of `runs`: a
// column added there comes after the BLOBs, and a value after a zeroblob makes SQLite build the
// whole row in memory (the 16 MiB streams), where now it writes them in place.
constexpr std::string_view v4 = R"sql(
CREATE TABLE run_invocations (
  run_id     TEXT PRIMARY KEY NOT NULL,
  invocation TEXT NOT NULL
);
CREATE INDEX run_invocations_by_invocation ON run_invocations(invocation);
)sql";

// Version 5: detached runs not yet collected (`ferry run --detach`): the JSON record as `running`
// (with its `detached` member: where the run is and what `ferry attach` needs) and the job's bytes.
// A table apart from `runs`, so that a run is in `runs` once, with its final record; `attach` and
// `stop` move it there and remove it here.
constexpr std::string_view v5 = R"sql(
CREATE TABLE detached_runs (
  run_id     TEXT PRIMARY KEY NOT NULL,
  host_label TEXT NOT NULL,
  started_at TEXT NOT NULL,
  record     TEXT NOT NULL,
  script     BLOB NOT NULL
);
)sql";

// Append new versions here; never edit a step that has shipped.
constexpr std::array steps{
    Migration{1, v1}, Migration{2, v2}, Migration{3, v3}, Migration{4, v4}, Migration{5, v5},
};

static_assert(application_id == 1179800153, "v1 writes application_id as a decimal literal");

} // namespace

std::span<const Migration> migrations()
{
  return steps;
}

int schema_version()
{
  return steps.back().to_version;
}

} // namespace ferry::archive
