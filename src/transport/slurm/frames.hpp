#pragma once
// What the submit script on the login node tells ferry, read back from its stdout: control lines
// ("TAG job 4242", "TAG state PENDING Resources", "TAG end COMPLETED 0:0 n1 scontrol") and the
// launcher's own output as counted chunks ("TAG out 512" and 512 bytes). The job's bytes are
// only ever payload, so nothing a job prints can pose as a control line (docs/slurm.md). The
// follower of a job array puts the task a frame is about after the tag ("TAG 3 out 512").
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/transport.hpp"

namespace ferry::slurm {

class FrameReader {
public:
  using LineHandler = std::function<void(const std::vector<std::string_view>& words)>;
  using BytesHandler = std::function<void(OutputStream, std::string_view)>;

  // `by_task`: frames may name a task (a number) after the tag; see task().
  FrameReader(std::string tag, LineHandler on_line, BytesHandler on_bytes, bool by_task = false);
  void feed(std::string_view data);
  // While a handler runs: the task its frame names, -1 for a frame about no task.
  [[nodiscard]] int task() const { return m_task; }
  // Why the stream stopped making sense (then nothing more is read from it); nullopt while it
  // does.
  [[nodiscard]] const std::optional<std::string>& broken() const { return m_broken; }
  // A chunk or a line was cut off by the end of the stream.
  [[nodiscard]] bool midway() const { return m_left > 0 || !m_line.empty(); }

private:
  void header(std::string_view line);

  std::string m_tag;
  LineHandler m_on_line;
  BytesHandler m_on_bytes;
  std::string m_line;
  std::size_t m_left = 0; // payload bytes still to come
  OutputStream m_stream = OutputStream::out;
  bool m_by_task = false;
  int m_task = -1;
  std::optional<std::string> m_broken;
};

// A chunk is at most this large; the script sends 1 MiB at a time.
inline constexpr std::size_t k_max_frame_bytes = 8u << 20;

// "A B  C" -> {"A", "B", "C"}
[[nodiscard]] std::vector<std::string_view> split_words(std::string_view line);

} // namespace ferry::slurm
