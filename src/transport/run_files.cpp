#include "transport/run_files.hpp"

#include <set>

namespace ferry {

std::string launcher_for(const RunBundle& bundle, const std::string& run_dir)
{
  LauncherSpec spec = bundle.launcher;
  spec.run_dir = run_dir;
  return make_launcher(spec);
}

StagedRun staged_run(const RunBundle& bundle, std::string run_dir, const StopToken& stop)
{
  StagedRun run;
  run.launcher = bundle.launcher;
  run.launcher.params.clear();
  run.launcher.run_dir = run_dir;
  run.run_dir = std::move(run_dir);
  run.stop = stop;
  return run;
}

namespace {

// The directories above a file sent (`conf/a/b.json`: conf, conf/a), each made once per run.
Expected<void> make_parent_dirs(RunDirWriter& writer, const std::string& run_dir,
                                const std::string& path, std::set<std::string>& made)
{
  for (auto slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    if (std::string dir = path.substr(0, slash); made.insert(dir).second) {
      FERRY_TRY(writer.make_dir(run_dir + "/" + dir));
    }
  }
  return {};
}

} // namespace

Expected<bool> write_run_files(RunDirWriter& writer, const RunBundle& bundle,
                               const std::string& run_dir)
{
  const std::string job_path = run_dir + "/" + bundle.launcher.job_file;
  bool cached = false;
  if (bundle.files.empty()) {
    FERRY_TRY_ASSIGN(cached, writer.put_job(job_path, bundle.job_bytes, bundle.job_sha256,
                                            bundle.job_cache_refused));
  } else {
    FERRY_TRY(writer.put_file(job_path, bundle.job_bytes));
  }
  FERRY_TRY(writer.put_file(run_dir + "/" + k_launcher_file, launcher_for(bundle, run_dir)));
  std::set<std::string> made;
  for (const auto& file : bundle.files) {
    FERRY_TRY(make_parent_dirs(writer, run_dir, file.path, made));
    FERRY_TRY(writer.put_file(run_dir + "/" + file.path, file.bytes));
  }
  return cached;
}

Expected<FetchedFile> fetch_capped(HostSession& session, const StagedRun& run,
                                   const std::string& rel, std::size_t cap)
{
  std::string bytes;
  bool over = false;
  const ChunkSink keep = [&](std::string_view chunk) -> Expected<void> {
    bytes.append(chunk);
    if (bytes.size() > cap) {
      over = true; // cap + 1 bytes tell the caller it is over the cap; no need to read on
      bytes.resize(cap + 1);
      return fail(ErrorKind::failed, "over the cap");
    }
    return {};
  };
  auto fetched = session.fetch(run, rel, keep, 0);
  if (over) {
    return FetchedFile{FetchedFile::Kind::regular, std::move(bytes), {}};
  }
  if (fetched) {
    fetched->bytes = std::move(bytes);
  }
  return fetched;
}

} // namespace ferry
