// Streaming the big members of a run record: stdout and stderr can be 16 MiB each, and
// building a JSON value and its dump would hold three copies of them at once.
#include <array>

#include "ferry/run_record.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace {

class ChunkWriter {
public:
  explicit ChunkWriter(std::FILE* out) : m_out(out) {}
  ~ChunkWriter() { flush(); }
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;

  void put(char c)
  {
    if (m_used == m_buffer.size()) {
      flush();
    }
    m_buffer[m_used++] = c;
  }
  void put(std::string_view text)
  {
    for (const char c : text) {
      put(c);
    }
  }
  void flush()
  {
    std::fwrite(m_buffer.data(), 1, m_used, m_out);
    m_used = 0;
  }

private:
  std::FILE* m_out;
  std::array<char, 65536> m_buffer{};
  std::size_t m_used = 0;
};

// Length of the valid UTF-8 sequence starting at text[i], or 0 when it is invalid.
std::size_t utf8_sequence(std::string_view text, std::size_t i)
{
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  std::size_t length = 0;
  std::uint32_t code = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
    code = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    code = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    code = c & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) {
    return 0;
  }
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      return 0;
    }
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool surrogate = code >= 0xD800 && code <= 0xDFFF;
  return overlong || surrogate || code > 0x10FFFF ? 0 : length;
}

// How many bytes at `i` (where no valid sequence starts) one U+FFFD stands for: the longest
// prefix of a well-formed sequence, at least one byte (Unicode's "maximal subpart" practice,
// which is also what nlohmann::json's error_handler_t::replace does).
std::size_t broken_prefix(std::string_view text, std::size_t i)
{
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0xC2 || c > 0xF4) {
    return 1;
  }
  const std::size_t length = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  const unsigned char low = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  const unsigned char high = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  std::size_t k = 1;
  for (; k < length && i + k < text.size(); ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if (k == 1 ? (b < low || b > high) : (b < 0x80 || b > 0xBF)) {
      break;
    }
  }
  return k;
}

void write_escaped(ChunkWriter& w, std::string_view text)
{
  static constexpr char hex[] = "0123456789abcdef";
  w.put('"');
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
      case '"': w.put("\\\""); break;
      case '\\': w.put("\\\\"); break;
      case '\n': w.put("\\n"); break;
      case '\r': w.put("\\r"); break;
      case '\t': w.put("\\t"); break;
      case '\b': w.put("\\b"); break;
      case '\f': w.put("\\f"); break;
      default:
        if (c < 0x20) {
          w.put("\\u00");
          w.put(hex[c >> 4]);
          w.put(hex[c & 0xF]);
        } else {
          w.put(static_cast<char>(c));
        }
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence(text, i);
    if (length == 0) {
      w.put("\\ufffd"); // one per maximal broken subpart, as nlohmann's replace handler does
      i += broken_prefix(text, i);
    } else {
      w.put(text.substr(i, length));
      i += length;
    }
  }
  w.put('"');
}

} // namespace

bool is_valid_utf8(std::string_view text)
{
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence(text, i);
    if (length == 0) {
      return false;
    }
    i += length;
  }
  return true;
}

void write_json_string(std::FILE* out, std::string_view text)
{
  ChunkWriter writer(out);
  write_escaped(writer, text);
}

void write_json_line(std::FILE* out, const RunRecord& record, const nlohmann::json& extra)
{
  nlohmann::json small = to_json(record, false);
  for (const auto& [key, value] : extra.items()) {
    small[key] = value;
  }
  std::string head = to_json_line(small);
  head.pop_back(); // the closing brace: stdout and stderr follow
  ChunkWriter writer(out);
  writer.put(head);
  writer.put(",\"stdout\":");
  write_escaped(writer, record.stdout_text);
  writer.put(",\"stderr\":");
  write_escaped(writer, record.stderr_text);
  writer.put("}\n");
}

} // namespace ferry
