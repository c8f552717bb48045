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

// Append new versions here; never edit a step that has shipped.
constexpr std::array steps{
    Migration{1, v1},
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
