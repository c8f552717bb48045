#pragma once
// Files that travel with a job (metadata `files`, `--file`) and files that come back from its
// run directory (metadata `outputs`, `--fetch`): the glob and path rules both share, and the
// resolution of a job's files on this machine.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/dir_entry.hpp"
#include "ferry/expected.hpp"

namespace ferry {

struct Job;

// The entries of the directory `rel` ("" for the root) under the glob's root; nullopt when it
// does not exist.
using DirLister =
    std::function<Expected<std::optional<std::vector<DirEntry>>>(const std::string& rel)>;

struct GlobMatch {
  std::string path; // relative to the root, '/'-separated
  DirEntry entry;
};

// A glob's segments after the lexical checks: relative, no `..`, `.` and empty segments dropped.
// `what` names the pattern in errors ("files entry \"../x\" in jobs/probe.py").
[[nodiscard]] Expected<std::vector<std::string>> glob_segments(std::string_view pattern,
                                                               std::string_view what);

// Everything `pattern` matches under the lister's root, sorted by path. Each segment is an
// fnmatch(3) pattern (`*` and `?` match no `/` and no leading dot); only real directories are
// descended into, never a link.
[[nodiscard]] Expected<std::vector<GlobMatch>>
expand_glob(std::string_view pattern, std::string_view what, const DirLister& list);

// Names ferry itself writes into a run directory: no file of the job's may land there.
[[nodiscard]] bool is_reserved_run_file(std::string_view top_level_name);

// A file staged beside the job, under `path` relative to the run directory.
struct BundleFile {
  std::string path;
  unsigned mode = 0600;
  std::string sha256;
  std::string bytes;
};

inline constexpr std::uint64_t k_default_max_upload = 256ull << 20;

// The job's `files` globs (relative to the directory of its file) and the `--file` paths, read
// into job.files. A `--file` inside the current directory keeps its relative path; any other
// lands under its file name. Errors name the pattern or path and what to do.
[[nodiscard]] Expected<void> resolve_job_files(Job& job, const std::vector<std::string>& extra,
                                               std::uint64_t max_upload);

// Lists a directory of this machine without following links (for resolve_job_files and the
// local transport).
[[nodiscard]] Expected<std::optional<std::vector<DirEntry>>>
list_local_dir(const std::filesystem::path& dir);

// Where a run's fetched outputs go: `{run_id}` and `{host}` in `pattern` replaced (the host made
// safe as one path segment).
[[nodiscard]] std::string output_dir_for(std::string_view pattern, std::string_view run_id,
                                         std::string_view host);

// Opens `rel` (checked segments) for writing under `dir`, creating the directories between with
// 0700 and never passing through a link; the file itself must not exist (O_EXCL). Returns the fd.
[[nodiscard]] Expected<int> create_output_file(const std::filesystem::path& dir,
                                               const std::string& rel);

} // namespace ferry
