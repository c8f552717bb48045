#pragma once
// What every target does to stage a run in a directory of its own: the job (from the target's
// cache of job files where it has one), the launcher with params.json at its end, and the job's
// files beside it, their directories made on the way. The file steps are the target's.
#include <string>
#include <string_view>

#include "ferry/transport.hpp"

namespace ferry {

class RunDirWriter {
public:
  virtual ~RunDirWriter() = default;
  // A new directory, 0700; one that exists already (a link included) is an error.
  [[nodiscard]] virtual Expected<void> make_dir(const std::string& path) = 0;
  // A new file, 0600 (O_EXCL: never through an existing name or link).
  [[nodiscard]] virtual Expected<void> put_file(const std::string& path,
                                                std::string_view bytes) = 0;
  // The job's own file: where the target keeps a cache of job files, a link to the cached copy
  // (uploaded to the cache first when missing); true when the cache already held it.
  // `discard_cached`: the cache's copy was refused (RunBundle::job_cache_refused): it is removed,
  // and the job uploaded as any other file.
  [[nodiscard]] virtual Expected<bool> put_job(const std::string& path, std::string_view bytes,
                                               const std::string& /*sha256*/,
                                               bool /*discard_cached*/)
  {
    FERRY_TRY(put_file(path, bytes));
    return false;
  }
};

// launch.sh's bytes for the bundle's launcher in `run_dir`.
[[nodiscard]] std::string launcher_for(const RunBundle& bundle, const std::string& run_dir);

// The staged run's description: the bundle's launcher in `run_dir`, its params left out (they are
// on the target now).
[[nodiscard]] StagedRun staged_run(const RunBundle& bundle, std::string run_dir,
                                   const StopToken& stop);

// Writes the bundle into `run_dir` (made already): the job (through the cache only when it has
// no files beside it: an interpreter that resolves the link would look for them there),
// launch.sh, the files. Returns whether the job came from the cache.
[[nodiscard]] Expected<bool> write_run_files(RunDirWriter& writer, const RunBundle& bundle,
                                             const std::string& run_dir);

} // namespace ferry
