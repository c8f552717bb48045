// Streaming the big members of a run record: stdout and stderr can be 16 MiB each, and
// building a JSON value and its dump would hold three copies of them at once.
#include <array>

#include "ferry/run_record.hpp"
#include "ferry/text.hpp"

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

void write_escaped(ChunkWriter& w, std::string_view text)
{
  static constexpr char hex[] = "0123456789abcdef";
  w.put('"');
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
      case '"':
        w.put("\\\"");
        break;
      case '\\':
        w.put("\\\\");
        break;
      case '\n':
        w.put("\\n");
        break;
      case '\r':
        w.put("\\r");
        break;
      case '\t':
        w.put("\\t");
        break;
      case '\b':
        w.put("\\b");
        break;
      case '\f':
        w.put("\\f");
        break;
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
    const std::size_t length = utf8_length(text, i);
    if (length == 0) {
      w.put("\\ufffd"); // one per maximal broken subpart, as nlohmann's replace handler does
      i += utf8_broken_length(text, i);
    } else {
      w.put(text.substr(i, length));
      i += length;
    }
  }
  w.put('"');
}

} // namespace

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
