#pragma once
// Which of a job's two output streams bytes came from: the transports capture them, the
// observers of a run (reporters, the archive, the MCP server) show or keep them.

namespace ferry {

enum class OutputStream { out, err };

} // namespace ferry
