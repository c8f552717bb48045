#pragma once
// A session that connects nowhere and does nothing: the base of the unit tests' fake sessions,
// each of which overrides only what its test is about. Base: HostSession or SshConnection.
#include "ferry/sessions.hpp"

namespace ferry::testing {

template <class Base> class StubSession : public Base {
public:
  nlohmann::json target() const override { return {{"host", "h"}}; }
  std::string label() const override { return "h"; }
  Expected<void> connect() override { return {}; }
  Expected<StagedRun> stage(const RunBundle&, const StopToken&) override { return StagedRun{}; }
  Expected<ExecOutcome> launch(StagedRun&, const LaunchRequest&) override { return ExecOutcome{}; }
  Expected<FetchedFile> fetch(const StagedRun&, const std::string&, const ChunkSink&,
                              std::uint64_t) override
  {
    return FetchedFile{};
  }
  Expected<std::optional<std::vector<DirEntry>>> list(const StagedRun&, const std::string&) override
  {
    return std::optional<std::vector<DirEntry>>{};
  }
  Expected<void> finish(StagedRun&, Finish) override { return {}; }
};

} // namespace ferry::testing
