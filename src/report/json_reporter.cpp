// The JSON Lines reporter: one JSON object per line on stdout; errors and notes stay on stderr.
#include <cstdlib>

#include <unistd.h>

#include "ferry/reporter.hpp"
#include "ferry/text.hpp"

namespace ferry {

namespace {

// JSON text with every character outside ASCII (and DEL) written as a \u escape: the same JSON,
// but nothing in it a terminal would take as a control (C1) or reorder (bidi). Outside strings
// JSON text is ASCII, so every such character sits in a string, where an escape is valid.
std::string ascii_json(std::string_view text)
{
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t length = c < 0x80 ? 1 : utf8_length(text, i);
    if (c < 0x7f || length == 0) {
      out += text[i++]; // ASCII (the writers replaced malformed UTF-8 already)
      continue;
    }
    unsigned code = length == 1 ? c : c & (0xffU >> (length + 1));
    for (std::size_t k = 1; k < length; ++k) {
      code = (code << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    }
    if (code > 0xffff) { // a surrogate pair
      code -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (code >> 10), 0xdc00 + (code & 0x3ff));
    } else {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(code));
    }
    i += length;
  }
  return out;
}

class JsonReporter final : public Reporter {
public:
  JsonReporter(std::FILE* out, std::FILE* err, bool stream)
      : m_out(out), m_err(err), m_stream(stream), m_terminal(isatty(fileno(out)) != 0)
  {
  }

  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override
  {
    if (!m_stream) {
      return;
    }
    line({{"event", "output"},
          {"host", run.host},
          {"job", run.job},
          {"stream", stream == OutputStream::out ? "stdout" : "stderr"},
          {"data", std::string(bytes)}});
    std::fflush(m_out);
  }

  ReportFormat format() const override { return ReportFormat::json_lines; }

  void record(const RunRecord& record, const nlohmann::json& extra) override
  {
    if (!m_terminal) {
      write_json_line(m_out, record, extra); // streamed: no copy of the output is built
    } else {
      // For a person at a terminal: the line built in memory, then made ASCII.
      char* buffer = nullptr;
      std::size_t size = 0;
      if (std::FILE* memory = open_memstream(&buffer, &size); memory != nullptr) {
        write_json_line(memory, record, extra);
        std::fclose(memory);
        const std::string text = ascii_json(std::string_view(buffer, size));
        std::fwrite(text.data(), 1, text.size(), m_out);
      }
      std::free(buffer);
    }
    std::fflush(m_out);
  }

  void table(const Table& table) override
  {
    for (const auto& object : table.objects) {
      line(object);
    }
    std::fflush(m_out);
  }

  void document(std::string_view, const nlohmann::json& json) override
  {
    line(json);
    std::fflush(m_out);
  }

  void bytes(std::string_view bytes) override
  {
    std::fwrite(bytes.data(), 1, bytes.size(), m_out);
    std::fflush(m_out);
  }

  // Notes and errors are lines for a person, with what hosts and jobs said in them escaped.
  void note(std::string_view text) override
  {
    std::fflush(m_out);
    fmt::print(m_err, "ferry: {}\n", terminal_safe(text, Newlines::keep));
  }

  void error(const Error& error) override
  {
    std::fflush(m_out);
    fmt::print(m_err, "ferry: error: {}\n", terminal_safe(error.message, Newlines::keep));
  }

private:
  void line(const nlohmann::json& json)
  {
    const std::string text =
        (m_terminal ? ascii_json(to_json_line(json)) : to_json_line(json)) + "\n";
    std::fwrite(text.data(), 1, text.size(), m_out);
  }

  std::FILE* m_out;
  std::FILE* m_err;
  bool m_stream;
  bool m_terminal; // stdout is a terminal: JSON made ASCII
};

} // namespace

std::unique_ptr<Reporter> make_json_reporter(std::FILE* out, std::FILE* err, bool stream)
{
  return std::make_unique<JsonReporter>(out, err, stream);
}

} // namespace ferry
