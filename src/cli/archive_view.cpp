#include "cli/archive_view.hpp"

namespace ferry::cli {

namespace {

// Length of the valid UTF-8 sequence at text[i], 0 when it is not one.
std::size_t utf8_length(std::string_view text, std::size_t i)
{
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead < 0x80) {
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    low = lead == 0xE0 ? 0xA0 : 0x80;
    high = lead == 0xED ? 0x9F : 0xBF;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    low = lead == 0xF0 ? 0x90 : 0x80;
    high = lead == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) {
    return 0;
  }
  for (std::size_t k = i + 2; k < i + length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) {
      return 0;
    }
  }
  return length;
}

bool is_control(std::string_view sequence)
{
  const auto lead = static_cast<unsigned char>(sequence[0]);
  if (sequence.size() == 1) {
    return (lead < 0x20 && lead != '\t') || lead == 0x7F;
  }
  // C1 controls U+0080..U+009F.
  return sequence.size() == 2 && lead == 0xC2 && static_cast<unsigned char>(sequence[1]) < 0xA0;
}

} // namespace

int report_error(const Error& error)
{
  print_error(error.message);
  return error.kind == ErrorKind::usage ? to_int(ExitCode::usage) : to_int(ExitCode::run_failed);
}

std::string target_label(const RunRecord& run)
{
  if (!run.host_label.empty()) {
    return run.host_label;
  }
  if (const auto host = run.target.find("host"); host != run.target.end() && host->is_string()) {
    return host->get<std::string>();
  }
  return "local";
}

std::string printable(std::string_view bytes)
{
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t length = utf8_length(bytes, i);
    const std::string_view sequence = bytes.substr(i, length == 0 ? 1 : length);
    if (length == 0 || is_control(sequence)) {
      for (const char c : sequence) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      }
    } else {
      out += sequence;
    }
    i += sequence.size();
  }
  return out;
}

std::string shorten(std::string_view text, std::size_t width)
{
  const auto is_lead = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; };
  std::size_t chars = 0;
  std::size_t cut = text.size(); // byte offset of the (width)th character
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (is_lead(text[i])) {
      if (chars + 1 == width) {
        cut = i;
      }
      ++chars;
    }
  }
  if (chars <= width || width == 0) {
    return std::string(text);
  }
  return std::string(text.substr(0, cut)) + "…";
}

Expected<RunRecord> load_archived_run(const Context& ctx, std::string_view ref)
{
  FERRY_TRY_ASSIGN(auto archive, Archive::open_read_only(ctx.archive_path()));
  return archive.load(ref);
}

} // namespace ferry::cli
