// libFuzzer target: the terminal escaper every printer goes through (ferry::terminal_safe).
// Properties, for any bytes and both newline modes:
//  - the output is valid UTF-8 with no C0 control but \t (and \n where kept), no DEL, no C1
//    control and no bidirectional override or isolate;
//  - text that needs no escaping comes back unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ferry/text.hpp"

namespace {

bool is_bidi(char32_t c)
{
  return (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

char32_t decode(std::string_view text, std::size_t i, std::size_t length)
{
  if (length == 1) {
    return static_cast<unsigned char>(text[i]);
  }
  const unsigned mask = length == 2 ? 0x1F : length == 3 ? 0x0F : 0x07;
  char32_t code = static_cast<unsigned char>(text[i]) & mask;
  for (std::size_t k = 1; k < length; ++k) {
    code = (code << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  }
  return code;
}

// Aborts unless `output` has the escaper's properties.
bool check(std::string_view output, ferry::Newlines newlines)
{
  for (std::size_t i = 0; i < output.size();) {
    const std::size_t length = ferry::utf8_length(output, i);
    if (length == 0) {
      std::abort(); // malformed UTF-8 reached the terminal
    }
    const char32_t c = decode(output, i, length);
    const bool allowed_control = c == '\t' || (c == '\n' && newlines == ferry::Newlines::keep);
    if (((c < 0x20 || c == 0x7F) && !allowed_control) || (c >= 0x80 && c <= 0x9F) || is_bidi(c)) {
      std::abort(); // a control reached the terminal
    }
    i += length;
  }
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const auto newlines : {ferry::Newlines::escape, ferry::Newlines::keep}) {
    const std::string output = ferry::terminal_safe(input, newlines);
    check(output, newlines);
    // Printable text round-trips: an input that already has the properties is left as it is.
    bool printable = ferry::is_valid_utf8(input);
    for (std::size_t i = 0; printable && i < input.size();) {
      const std::size_t length = ferry::utf8_length(input, i);
      const char32_t c = decode(input, i, length);
      const bool allowed_control = c == '\t' || (c == '\n' && newlines == ferry::Newlines::keep);
      printable = !(((c < 0x20 || c == 0x7F) && !allowed_control) || (c >= 0x80 && c <= 0x9F) ||
                    is_bidi(c));
      i += length;
    }
    if (printable && output != input) {
      std::abort(); // printable text was changed
    }
  }
  return 0;
}
