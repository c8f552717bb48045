#pragma once
// Text helpers, each in one copy: lines, trimming, UTF-8, and bytes made safe for a terminal.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// The lines of `text` without their "\n" (and a "\r" before it); a last line without a newline
// is kept, an empty text has no lines.
[[nodiscard]] std::vector<std::string_view> split_lines(std::string_view text);

// `text` without leading and trailing spaces, tabs, carriage returns and newlines.
[[nodiscard]] std::string_view trim(std::string_view text);

// The last non-empty line of `text` (trailing newlines ignored).
[[nodiscard]] std::string_view last_line(std::string_view text);

// Length of the well-formed UTF-8 sequence at text[i] (1 for ASCII), 0 when none starts there.
[[nodiscard]] std::size_t utf8_length(std::string_view text, std::size_t i);

// How many bytes at text[i], where no well-formed sequence starts, one U+FFFD stands for: the
// maximal subpart (Unicode's practice, and nlohmann::json's error_handler_t::replace), >= 1.
[[nodiscard]] std::size_t utf8_broken_length(std::string_view text, std::size_t i);

[[nodiscard]] bool is_valid_utf8(std::string_view text);

// How many bytes at the end of `text` start a UTF-8 sequence that is not complete yet (0-3):
// text that arrives in pieces holds them back for the next piece.
[[nodiscard]] std::size_t utf8_incomplete_tail(std::string_view text);

// At most `width` characters (code points, never a split sequence), cut with "…".
[[nodiscard]] std::string shorten(std::string_view text, std::size_t width);

// Bytes made safe to show on a terminal inside ferry's own output: well-formed UTF-8 is kept,
// except C0 controls (tab kept; newline kept only with Newlines::keep), DEL, C1 controls and the
// bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069), which are shown as
// \xNN (bytes) or \u{XXXX} (code points); malformed bytes are shown as \xNN. No escape
// sequence, clipboard write (OSC 52) or title change survives it.
enum class Newlines { escape, keep };
[[nodiscard]] std::string terminal_safe(std::string_view bytes,
                                        Newlines newlines = Newlines::escape);

// How deeply arrays and objects nest in JSON text (0 for a scalar), found by a scan that needs
// no recursion, so it is safe on any input. JSON ferry reads may nest at most this deep.
[[nodiscard]] std::size_t json_nesting_depth(std::string_view json_text);
inline constexpr std::size_t k_max_json_depth = 512;

} // namespace ferry
