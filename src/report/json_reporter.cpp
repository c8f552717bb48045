// The JSON Lines reporter: one JSON object per line on stdout; errors and notes stay on stderr.
#include "ferry/reporter.hpp"

namespace ferry {

namespace {

class JsonReporter final : public Reporter {
public:
  JsonReporter(std::FILE* out, std::FILE* err, bool stream)
      : m_out(out), m_err(err), m_stream(stream)
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
    write_json_line(m_out, record, extra);
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

  void note(std::string_view text) override
  {
    std::fflush(m_out);
    fmt::print(m_err, "ferry: {}\n", text);
  }

  void error(const Error& error) override
  {
    std::fflush(m_out);
    fmt::print(m_err, "ferry: error: {}\n", error.message);
  }

private:
  void line(const nlohmann::json& json)
  {
    const std::string text = to_json_line(json) + "\n";
    std::fwrite(text.data(), 1, text.size(), m_out);
  }

  std::FILE* m_out;
  std::FILE* m_err;
  bool m_stream;
};

} // namespace

std::unique_ptr<Reporter> make_json_reporter(std::FILE* out, std::FILE* err, bool stream)
{
  return std::make_unique<JsonReporter>(out, err, stream);
}

} // namespace ferry
