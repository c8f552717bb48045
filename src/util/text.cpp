#include "ferry/text.hpp"

#include <fmt/format.h>

namespace ferry {

namespace {

unsigned byte_at(std::string_view text, std::size_t i)
{
  return static_cast<unsigned char>(text[i]);
}

// The code point of the well-formed sequence of `length` bytes at text[i].
char32_t decode(std::string_view text, std::size_t i, std::size_t length)
{
  if (length == 1) {
    return byte_at(text, i);
  }
  const unsigned lead_mask = length == 2 ? 0x1F : length == 3 ? 0x0F : 0x07;
  char32_t code = byte_at(text, i) & lead_mask;
  for (std::size_t k = 1; k < length; ++k) {
    code = (code << 6) | (byte_at(text, i + k) & 0x3F);
  }
  return code;
}

bool must_escape(char32_t code, Newlines newlines)
{
  if (code == '\t' || (code == '\n' && newlines == Newlines::keep)) {
    return false;
  }
  const bool c0_or_del = code < 0x20 || code == 0x7F;
  const bool c1 = code >= 0x80 && code <= 0x9F;
  const bool bidi = (code >= 0x202A && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069);
  return c0_or_del || c1 || bidi;
}

} // namespace

std::vector<std::string_view> split_lines(std::string_view text)
{
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::string_view trim(std::string_view text)
{
  constexpr std::string_view blanks = " \t\r\n";
  const auto first = text.find_first_not_of(blanks);
  if (first == std::string_view::npos) {
    return {};
  }
  const auto last = text.find_last_not_of(blanks);
  return text.substr(first, last - first + 1);
}

std::string_view last_line(std::string_view text)
{
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  const auto newline = text.rfind('\n');
  return newline == std::string_view::npos ? text : text.substr(newline + 1);
}

std::size_t utf8_length(std::string_view text, std::size_t i)
{
  const unsigned lead = byte_at(text, i);
  if (lead < 0x80) {
    return 1;
  }
  std::size_t length = 0;
  unsigned low = 0x80;
  unsigned high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    low = lead == 0xE0 ? 0xA0 : 0x80;  // no overlong forms
    high = lead == 0xED ? 0x9F : 0xBF; // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    low = lead == 0xF0 ? 0x90 : 0x80;
    high = lead == 0xF4 ? 0x8F : 0xBF; // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size() || byte_at(text, i + 1) < low || byte_at(text, i + 1) > high) {
    return 0;
  }
  for (std::size_t k = i + 2; k < i + length; ++k) {
    if (byte_at(text, k) < 0x80 || byte_at(text, k) > 0xBF) {
      return 0;
    }
  }
  return length;
}

std::size_t utf8_broken_length(std::string_view text, std::size_t i)
{
  const unsigned lead = byte_at(text, i);
  if (lead < 0xC2 || lead > 0xF4) {
    return 1;
  }
  const std::size_t length = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  const unsigned low = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
  const unsigned high = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
  std::size_t k = 1;
  for (; k < length && i + k < text.size(); ++k) {
    const unsigned b = byte_at(text, i + k);
    if (k == 1 ? (b < low || b > high) : (b < 0x80 || b > 0xBF)) {
      break;
    }
  }
  return k;
}

bool is_valid_utf8(std::string_view text)
{
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_length(text, i);
    if (length == 0) {
      return false;
    }
    i += length;
  }
  return true;
}

std::size_t utf8_incomplete_tail(std::string_view text)
{
  for (std::size_t k = 1; k <= 3 && k <= text.size(); ++k) {
    const unsigned lead = byte_at(text, text.size() - k);
    if (lead >= 0x80 && lead < 0xC0) {
      continue; // a continuation byte: look further back for its lead
    }
    const std::size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 1;
    return length > k ? k : 0;
  }
  return 0;
}

std::string shorten(std::string_view text, std::size_t width)
{
  if (width == 0) {
    return std::string(text);
  }
  std::size_t chars = 0;
  std::size_t cut = text.size(); // byte offset where the width-th character starts
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_length(text, i);
    if (chars + 1 == width) {
      cut = i;
    }
    ++chars;
    i += length == 0 ? 1 : length;
  }
  if (chars <= width) {
    return std::string(text);
  }
  return std::string(text.substr(0, cut)) + "…";
}

std::string terminal_safe(std::string_view bytes, Newlines newlines)
{
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t length = utf8_length(bytes, i);
    if (length == 0) {
      out += fmt::format("\\x{:02x}", byte_at(bytes, i));
      ++i;
      continue;
    }
    const char32_t code = decode(bytes, i, length);
    if (!must_escape(code, newlines)) {
      out.append(bytes.substr(i, length));
    } else if (length == 1) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(code));
    } else if (code <= 0x9F) {
      for (std::size_t k = 0; k < length; ++k) { // C1: the bytes, as before
        out += fmt::format("\\x{:02x}", byte_at(bytes, i + k));
      }
    } else {
      out += fmt::format("\\u{{{:04X}}}", static_cast<unsigned>(code));
    }
    i += length;
  }
  return out;
}

std::size_t json_nesting_depth(std::string_view json_text)
{
  std::size_t depth = 0;
  std::size_t max_depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < json_text.size(); ++i) {
    const char c = json_text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

} // namespace ferry
