// libFuzzer target: the run-record JSON reader (docs/record.md; the archive reads every
// stored record back through it) and the two writers of a record: to_json / to_json_line and
// the streaming write_json_line / write_json_string that `ferry run --json` uses.
//
// Invariants beyond "no crash, no sanitizer report, no exception":
//  - a record that was read writes back to JSON that reads again, to the same JSON;
//  - write_json_line gives one line of valid JSON equal to to_json_line's;
//  - write_json_string gives exactly nlohmann's bytes for valid UTF-8, and for any bytes a
//    valid JSON string that keeps every valid UTF-8 sequence.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/run_record.hpp"
#include "fuzz_common.hpp"

namespace {

using nlohmann::json;

// Captures what a FILE*-writer writes.
class MemoryFile {
public:
  MemoryFile() : m_file(open_memstream(&m_data, &m_size)) { FUZZ_CHECK(m_file != nullptr); }
  ~MemoryFile()
  {
    if (m_file != nullptr) {
      std::fclose(m_file);
    }
    std::free(m_data);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::FILE* get() { return m_file; }
  std::string take()
  {
    std::fclose(m_file);
    m_file = nullptr;
    return std::string(m_data, m_size);
  }

private:
  char* m_data = nullptr;
  std::size_t m_size = 0;
  std::FILE* m_file;
};

bool valid_utf8(const std::string& text)
{
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

std::string without_replacement_chars(std::string text)
{
  static constexpr std::string_view k_fffd = "\xEF\xBF\xBD";
  for (auto at = text.find(k_fffd); at != std::string::npos; at = text.find(k_fffd, at)) {
    text.erase(at, k_fffd.size());
  }
  return text;
}

void check_json_string(const std::string& bytes)
{
  MemoryFile out;
  ferry::write_json_string(out.get(), bytes);
  const std::string written = out.take();
  const json back = json::parse(written, nullptr, false);
  FUZZ_CHECK(!back.is_discarded());
  FUZZ_CHECK(back.is_string());
  if (valid_utf8(bytes)) {
    FUZZ_CHECK(written == json(bytes).dump());
    FUZZ_CHECK(back.get_ref<const std::string&>() == bytes);
  } else {
    // Invalid bytes become U+FFFD; nothing else is lost or added (nlohmann's replace mode
    // may use fewer U+FFFD for one broken sequence, but keeps the same valid text).
    const std::string reference = json(bytes).dump(-1, ' ', false, json::error_handler_t::replace);
    const json reference_back = json::parse(reference);
    FUZZ_CHECK(without_replacement_chars(back.get<std::string>()) ==
               without_replacement_chars(reference_back.get<std::string>()));
  }
}

// Two JSON strings that must say the same thing: equal, or for invalid UTF-8 (the
// streaming writer and nlohmann's replace mode may put different numbers of U+FFFD for one
// broken sequence) equal once the U+FFFD are left out.
bool same_stream(const json& streamed, const json& expected, const std::string& raw)
{
  if (!streamed.is_string() || !expected.is_string()) {
    return false;
  }
  if (valid_utf8(raw)) {
    return streamed == expected;
  }
  return without_replacement_chars(streamed.get<std::string>()) ==
         without_replacement_chars(expected.get<std::string>());
}

void check_written_line(const ferry::RunRecord& record, const json& extra)
{
  MemoryFile out;
  ferry::write_json_line(out.get(), record, extra);
  const std::string line = out.take();
  FUZZ_CHECK(!line.empty() && line.back() == '\n');
  FUZZ_CHECK(line.find('\n') == line.size() - 1); // JSON Lines: exactly one line
  json streamed = json::parse(line, nullptr, false);
  FUZZ_CHECK(!streamed.is_discarded());
  FUZZ_CHECK(streamed.is_object());
  json expected_json = ferry::to_json(record);
  for (const auto& [key, value] : extra.items()) {
    expected_json[key] = value;
  }
  json expected = json::parse(ferry::to_json_line(expected_json), nullptr, false);
  FUZZ_CHECK(!expected.is_discarded());
  FUZZ_CHECK(same_stream(streamed["stdout"], expected["stdout"], record.stdout_text));
  FUZZ_CHECK(same_stream(streamed["stderr"], expected["stderr"], record.stderr_text));
  for (auto* j : {&streamed, &expected}) {
    j->erase("stdout");
    j->erase("stderr");
  }
  FUZZ_CHECK(streamed == expected);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  check_json_string(bytes);

  const json j = json::parse(bytes, nullptr, false);
  if (j.is_discarded()) {
    return 0;
  }
  auto record = ferry::run_record_from_json(j);
  if (!record) {
    FUZZ_CHECK(record.error().kind == ferry::ErrorKind::failed);
    return 0;
  }

  // Written and read back (in memory): it reads, and it is a fixed point from then on.
  const json written = ferry::to_json(*record);
  auto again = ferry::run_record_from_json(written);
  FUZZ_CHECK(again);
  FUZZ_CHECK(ferry::to_json(*again) == written);
  FUZZ_CHECK(ferry::to_json(*record, false).dump() == ferry::to_json(*again, false).dump());

  // As text (what the archive and `run --json` hold): to_json_line parses back.
  const std::string line = ferry::to_json_line(written);
  const json reparsed = json::parse(line, nullptr, false);
  FUZZ_CHECK(!reparsed.is_discarded());
  FUZZ_CHECK(ferry::run_record_from_json(reparsed));

  // The streaming writer, plain and with the `replay --json` extra member.
  check_written_line(*record, json::object());
  if (const auto compare = j.find("compare"); compare != j.end()) {
    check_written_line(*record, json{{"compare", *compare}});
  }
  // Raw stream bytes (the archive keeps them unrepaired) through the streaming writer.
  ferry::RunRecord raw = *record;
  raw.stdout_text = bytes.substr(0, bytes.size() / 2);
  raw.stderr_text = bytes.substr(bytes.size() / 2);
  check_written_line(raw, json::object());
  return 0;
}
