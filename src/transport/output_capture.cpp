#include "ferry/transport.hpp"

namespace ferry {

namespace {
// The login shell's startup noise is kept for diagnosis only, up to this much.
constexpr std::size_t k_noise_cap = 64 * 1024;
} // namespace

OutputCapture::OutputCapture(std::string sentinel, std::size_t cap, std::string end_marker)
    : m_marker(sentinel.empty() ? std::string() : sentinel + "\n"),
      m_end(end_marker.empty() ? std::string() : end_marker + "\n"), m_cap(cap + m_end.size())
{
  m_out.saw_sentinel = m_marker.empty();
}

void OutputCapture::feed(std::string_view data)
{
  if (!m_out.saw_sentinel) {
    // Only the tail that could still hold the start of the marker is worth keeping.
    m_pending.append(data);
    const std::size_t at = m_pending.find(m_marker);
    if (at == std::string::npos) {
      const std::size_t keep = m_marker.size() - 1;
      if (m_pending.size() > k_noise_cap + keep) {
        const std::size_t drop = m_pending.size() - keep;
        if (m_out.before_sentinel.size() < k_noise_cap) {
          m_out.before_sentinel.append(m_pending, 0,
                                       std::min(drop, k_noise_cap - m_out.before_sentinel.size()));
        }
        m_pending.erase(0, drop);
      }
      return;
    }
    m_out.saw_sentinel = true;
    if (m_out.before_sentinel.size() < k_noise_cap) {
      m_out.before_sentinel.append(m_pending, 0,
                                   std::min(at, k_noise_cap - m_out.before_sentinel.size()));
    }
    const std::string rest = m_pending.substr(at + m_marker.size());
    m_pending.clear();
    m_pending.shrink_to_fit();
    data = rest;
    feed(data); // rest is bounded by the pending cap
    return;
  }
  const std::size_t room = m_cap > m_out.bytes.size() ? m_cap - m_out.bytes.size() : 0;
  if (data.size() <= room) {
    m_out.bytes.append(data);
  } else {
    m_out.bytes.append(data.substr(0, room));
    m_out.dropped += data.size() - room;
    m_out.truncated = true;
  }
}

CapturedStream OutputCapture::finish() &&
{
  if (!m_out.saw_sentinel) {
    // The launcher never ran (or its marker was lost): keep what came, as it came.
    m_out.bytes = m_out.before_sentinel + m_pending;
    m_out.before_sentinel.clear();
  }
  if (!m_end.empty() && m_out.bytes.size() >= m_end.size() &&
      m_out.bytes.compare(m_out.bytes.size() - m_end.size(), m_end.size(), m_end) == 0) {
    m_out.bytes.resize(m_out.bytes.size() - m_end.size());
  }
  const std::size_t cap = m_cap - m_end.size();
  if (m_out.bytes.size() > cap) {
    m_out.dropped += m_out.bytes.size() - cap;
    m_out.bytes.resize(cap);
    m_out.truncated = true;
  }
  return std::move(m_out);
}

} // namespace ferry
