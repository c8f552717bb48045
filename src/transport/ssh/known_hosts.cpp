#include "transport/ssh/known_hosts.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>

#include <fmt/format.h>

#include "ferry/util.hpp"
#include "transport/ssh/config.hpp"

namespace ferry::known_hosts {
namespace {

// SHA-1 (FIPS 180-4). Only for hashed known_hosts names, where OpenSSH fixed the algorithm.
std::array<std::uint8_t, 20> sha1(std::string_view message)
{
  std::uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  std::string data(message);
  const std::uint64_t bit_length = static_cast<std::uint64_t>(message.size()) * 8;
  data.push_back('\x80');
  while (data.size() % 64 != 56) {
    data.push_back('\0');
  }
  for (int i = 7; i >= 0; --i) {
    data.push_back(static_cast<char>((bit_length >> (i * 8)) & 0xff));
  }
  const auto rotl = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
  for (std::size_t block = 0; block < data.size(); block += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(data.data() + block + i * 4);
      w[i] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
             (std::uint32_t{p[2]} << 8) | p[3];
    }
    for (int i = 16; i < 80; ++i) {
      w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f = 0, k = 0;
      if (i < 20) {
        f = (b & c) | (~b & d), k = 0x5A827999;
      } else if (i < 40) {
        f = b ^ c ^ d, k = 0x6ED9EBA1;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDC;
      } else {
        f = b ^ c ^ d, k = 0xCA62C1D6;
      }
      const std::uint32_t t = rotl(a, 5) + f + e + k + w[i];
      e = d, d = c, c = rotl(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
  }
  std::array<std::uint8_t, 20> digest{};
  for (int i = 0; i < 20; ++i) {
    digest[i] = static_cast<std::uint8_t>(h[i / 4] >> (24 - 8 * (i % 4)));
  }
  return digest;
}

char lower(char c)
{
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// OpenSSH's match_pattern on a host name already in lower case; the pattern is lowered too.
bool wildcard_match(std::string_view text, std::string_view pattern)
{
  std::string lowered(pattern);
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), lower);
  return ssh::match_pattern(text, lowered);
}

bool hashed_match(std::string_view field, std::string_view name)
{
  // |1|salt|hash
  const std::string_view rest = field.substr(3);
  const auto bar = rest.find('|');
  if (bar == std::string_view::npos) {
    return false;
  }
  const std::string salt = base64_decode(rest.substr(0, bar));
  const std::string hash = base64_decode(rest.substr(bar + 1));
  return !salt.empty() && hash.size() == 20 && hmac_sha1(salt, name) == hash;
}

} // namespace

std::string hmac_sha1(std::string_view key, std::string_view message)
{
  std::string block(64, '\0');
  if (key.size() > 64) {
    const auto digest = sha1(key);
    std::copy(digest.begin(), digest.end(), block.begin());
  } else {
    std::copy(key.begin(), key.end(), block.begin());
  }
  std::string inner(64, '\0'), outer(64, '\0');
  for (int i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(block[i] ^ 0x36);
    outer[i] = static_cast<char>(block[i] ^ 0x5c);
  }
  const auto inner_digest = sha1(inner.append(message));
  outer.append(reinterpret_cast<const char*>(inner_digest.data()), inner_digest.size());
  const auto digest = sha1(outer);
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

std::string base64_decode(std::string_view text)
{
  static constexpr std::string_view alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (text.size() % 4 != 0) {
    return {};
  }
  std::string out;
  std::uint32_t buffer = 0;
  int bits = 0;
  std::size_t padding = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      if (i + 2 < text.size() || ++padding > 2) {
        return {};
      }
      continue;
    }
    const auto value = alphabet.find(c);
    if (value == std::string_view::npos || padding > 0) {
      return {};
    }
    buffer = (buffer << 6) | static_cast<std::uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

std::string lookup_name(std::string_view host, unsigned port)
{
  return port == 22 ? std::string(host) : fmt::format("[{}]:{}", host, port);
}

bool host_matches(std::string_view patterns, std::string_view host, unsigned port)
{
  return name_matches(patterns, lookup_name(host, port));
}

std::string sha1_hex(std::string_view message)
{
  std::string out;
  for (const auto byte : sha1(message)) {
    out += fmt::format("{:02x}", byte);
  }
  return out;
}

bool name_matches(std::string_view patterns, std::string_view lookup)
{
  std::string name(lookup);
  if (patterns.rfind("|1|", 0) == 0) {
    return hashed_match(patterns, name);
  }
  for (char& c : name) {
    c = lower(c);
  }
  bool positive = false;
  while (!patterns.empty()) {
    const auto comma = patterns.find(',');
    std::string_view pattern = patterns.substr(0, comma);
    patterns = comma == std::string_view::npos ? std::string_view{} : patterns.substr(comma + 1);
    const bool negated = !pattern.empty() && pattern[0] == '!';
    if (negated) {
      pattern.remove_prefix(1);
    }
    if (!pattern.empty() && wildcard_match(name, pattern)) {
      if (negated) {
        return false;
      }
      positive = true;
    }
  }
  return positive;
}

std::vector<Entry> parse(std::string_view text, const std::string& file)
{
  std::vector<Entry> entries;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::string first;
    if (!(fields >> first) || first[0] == '#') {
      continue;
    }
    Entry entry;
    entry.file = file;
    entry.line = number;
    if (first[0] == '@') {
      if (first == "@revoked") {
        entry.marker = Marker::revoked;
      } else if (first == "@cert-authority") {
        entry.marker = Marker::cert_authority;
      } else {
        continue;
      }
      if (!(fields >> entry.hosts)) {
        continue;
      }
    } else {
      entry.hosts = first;
    }
    if (!(fields >> entry.key_type >> entry.key_base64)) {
      continue;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<Entry> read_files(const std::vector<std::string>& files)
{
  std::vector<Entry> entries;
  for (const auto& file : files) {
    if (const auto text = read_file(file)) { // a file that is missing or unreadable has none
      auto more = parse(*text, file);
      entries.insert(entries.end(), std::make_move_iterator(more.begin()),
                     std::make_move_iterator(more.end()));
    }
  }
  return entries;
}

} // namespace ferry::known_hosts
