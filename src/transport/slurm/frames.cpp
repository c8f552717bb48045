#include "transport/slurm/frames.hpp"

#include <charconv>

#include <fmt/format.h>

#include "ferry/text.hpp"

namespace ferry::slurm {

namespace {
constexpr std::size_t k_max_line = 4096;

// "3" -> 3; -1 for anything but a plain number.
int task_number(std::string_view word)
{
  int task = -1;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), task);
  return !word.empty() && ec == std::errc() && end == word.data() + word.size() ? task : -1;
}
} // namespace

std::vector<std::string_view> split_words(std::string_view line)
{
  std::vector<std::string_view> words;
  std::size_t pos = 0;
  while (pos < line.size()) {
    const auto start = line.find_first_not_of(' ', pos);
    if (start == std::string_view::npos) {
      break;
    }
    const auto end = std::min(line.find(' ', start), line.size());
    words.push_back(line.substr(start, end - start));
    pos = end;
  }
  return words;
}

FrameReader::FrameReader(std::string tag, LineHandler on_line, BytesHandler on_bytes, bool by_task)
    : m_tag(std::move(tag)), m_on_line(std::move(on_line)), m_on_bytes(std::move(on_bytes)),
      m_by_task(by_task)
{
}

void FrameReader::feed(std::string_view data)
{
  while (!data.empty() && !m_broken) {
    if (m_left > 0) {
      const std::size_t n = std::min(m_left, data.size());
      m_on_bytes(m_stream, data.substr(0, n));
      m_left -= n;
      data.remove_prefix(n);
      continue;
    }
    const auto newline = data.find('\n');
    if (newline == std::string_view::npos) {
      m_line.append(data);
      if (m_line.size() > k_max_line) {
        m_broken = fmt::format("a line of {}+ bytes without a newline", m_line.size());
      }
      return;
    }
    m_line.append(data.substr(0, newline));
    data.remove_prefix(newline + 1);
    const std::string line = std::move(m_line);
    m_line.clear();
    header(line);
  }
}

void FrameReader::header(std::string_view line)
{
  const auto words = split_words(line);
  if (words.size() < 2 || words[0] != m_tag) {
    m_broken = fmt::format("an unexpected line \"{}\"", shorten(line, 120));
    return;
  }
  std::vector<std::string_view> rest(words.begin() + 1, words.end());
  m_task = m_by_task ? task_number(rest[0]) : -1;
  if (m_task >= 0) {
    rest.erase(rest.begin());
    if (rest.empty()) {
      m_broken = fmt::format("a frame with nothing after its task \"{}\"", shorten(line, 120));
      return;
    }
  }
  if (rest[0] != "out" && rest[0] != "err") {
    m_on_line(rest);
    return;
  }
  std::size_t size = 0;
  const std::string_view count = rest.size() == 2 ? rest[1] : std::string_view();
  const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), size);
  if (count.empty() || ec != std::errc() || end != count.data() + count.size() ||
      size > k_max_frame_bytes) {
    m_broken = fmt::format("a bad chunk header \"{}\"", shorten(line, 120));
    return;
  }
  m_stream = rest[0] == "out" ? OutputStream::out : OutputStream::err;
  m_left = size;
}

} // namespace ferry::slurm
