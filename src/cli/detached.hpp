#pragma once
// Detached runs on the command line: `run --detach` (its view) and `attach`, `stop`, `ps`
// (cmd_detached.cpp).
#include <cstdio>

#include "cli/cli.hpp"
#include "ferry/run_record.hpp"

namespace ferry::cli {

// `run --detach`'s view: one line per run started, its id (`--json`: its record, `running`);
// a run that did not start is shown as `run` shows it.
class DetachView final : public RunObserver {
public:
  DetachView(Reporter& reporter, bool json) : m_reporter(reporter), m_json(json) {}
  void run_finished(RunRecord& record) override
  {
    if (record.detached.is_null()) {
      m_reporter.run_finished(record);
    } else if (m_json) {
      write_json_line(stdout, record);
    } else {
      std::fprintf(stdout, "%s\n", record.run_id.c_str());
    }
    std::fflush(stdout);
  }

private:
  Reporter& m_reporter;
  bool m_json;
};

} // namespace ferry::cli
