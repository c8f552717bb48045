#pragma once
// `ferry mcp`: an MCP server over stdio (protocol revision 2025-06-18, and 2025-11-25 when the
// client asks for it). Its tools are the jobs and its targets are fixed when it starts; nothing
// a client sends names a host, a path, an interpreter or a command. One thread reads the input
// and answers what is quick; each tools/call runs on a worker of its own, so a running call
// never holds up ping or cancellation.
#include <chrono>
#include <vector>

#include "ferry/archive.hpp"
#include "ferry/exit_code.hpp"
#include "ferry/job.hpp"
#include "ferry/runner.hpp"
#include "mcp/call.hpp"
#include "run/session_pool.hpp"

namespace ferry::mcp {

// The protocol revisions ferry speaks: the first unless the client asks for the second.
inline constexpr std::string_view k_protocol_version = "2025-06-18";
inline constexpr std::string_view k_newer_protocol_version = "2025-11-25";

struct ServerConfig {
  std::vector<Job> jobs; // one tool each (jobs that cannot be tools are left out before)
  std::vector<PoolTarget> targets;
  CallArchive archive;
  RunOptions run_options; // resolved as `ferry run` resolves them (env, interpreters, config)
  // How long a session stays connected after a call for the next one.
  std::chrono::steady_clock::duration idle_limit = std::chrono::minutes(5);
  std::size_t max_calls = 16; // tools/call requests running at once
};

// Serves on `in_fd`/`out_fd` until the input ends, the client goes away or ferry is
// interrupted; running calls are stopped (as Ctrl-C stops a run) and archived first.
// ExitCode::interrupted after SIGINT/SIGTERM, else ok.
[[nodiscard]] ExitCode serve(ServerConfig config, int in_fd, int out_fd);

} // namespace ferry::mcp
