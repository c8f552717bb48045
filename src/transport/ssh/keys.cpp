#include "transport/ssh/keys.hpp"

#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "ferry/text.hpp"
#include "ferry/util.hpp"
#include "transport/ssh/known_hosts.hpp"

namespace ferry::ssh {

namespace {

// Reads the SSH wire format: uint32/uint64 big-endian, string = uint32 length + bytes.
class WireReader {
public:
  explicit WireReader(std::string_view data) : m_data(data) {}

  bool ok() const { return m_ok; }
  std::size_t offset() const { return m_offset; }
  std::string_view data() const { return m_data; }

  std::uint64_t number(int bytes)
  {
    if (!m_ok || m_data.size() - m_offset < static_cast<std::size_t>(bytes)) {
      m_ok = false;
      return 0;
    }
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) {
      value = (value << 8) | static_cast<unsigned char>(m_data[m_offset++]);
    }
    return value;
  }
  std::string_view string()
  {
    const auto length = number(4);
    if (!m_ok || m_data.size() - m_offset < length) {
      m_ok = false;
      return {};
    }
    const auto out = m_data.substr(m_offset, length);
    m_offset += length;
    return out;
  }

private:
  std::string_view m_data;
  std::size_t m_offset = 0;
  bool m_ok = true;
};

std::string put_string(std::string_view bytes)
{
  std::string out;
  const auto n = static_cast<std::uint32_t>(bytes.size());
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  }
  return out.append(bytes);
}

bool ends_with(std::string_view text, std::string_view tail)
{
  return text.size() >= tail.size() && text.substr(text.size() - tail.size()) == tail;
}

// How many strings/mpints a certificate of this type carries for its public key.
int key_fields(std::string_view type)
{
  if (type.rfind("ssh-rsa-", 0) == 0) {
    return 2; // e, n
  }
  if (type.rfind("ssh-dss-", 0) == 0) {
    return 4; // p, q, g, y
  }
  if (type.rfind("ecdsa-", 0) == 0) {
    return 2; // curve, point
  }
  if (type.rfind("ssh-ed25519-", 0) == 0) {
    return 1;
  }
  if (type.rfind("sk-ssh-ed25519-", 0) == 0) {
    return 2; // key, application
  }
  if (type.rfind("sk-ecdsa-", 0) == 0) {
    return 3; // curve, point, application
  }
  return 0;
}

std::string plain_type(std::string_view cert_type)
{
  std::string plain(
      cert_type.substr(0, cert_type.size() - std::string_view("-cert-v01@openssh.com").size()));
  return plain.rfind("sk-", 0) == 0 ? plain + "@openssh.com" : plain;
}

std::string utc_date(std::uint64_t seconds)
{
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02} UTC", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min);
}

} // namespace

std::string base64_encode(std::string_view bytes)
{
  static constexpr std::string_view alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const auto n = (std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16) |
                   (std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8) |
                   static_cast<unsigned char>(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6) {
      out.push_back(alphabet[(n >> shift) & 63]);
    }
  }
  if (i < bytes.size()) {
    std::uint32_t n = std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16;
    if (i + 1 < bytes.size()) {
      n |= std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8;
    }
    out.push_back(alphabet[(n >> 18) & 63]);
    out.push_back(alphabet[(n >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? alphabet[(n >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string blob_fingerprint(std::string_view blob)
{
  const auto cert = parse_certificate(blob);
  const std::string hex = sha256_hex(cert ? std::string_view(cert->plain_blob) : blob);
  std::string raw;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    raw.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  std::string text = base64_encode(raw);
  while (!text.empty() && text.back() == '=') {
    text.pop_back();
  }
  return "SHA256:" + text;
}

std::string key_type_label(std::string_view type)
{
  const bool cert = type.find("-cert-v01@") != std::string_view::npos;
  const bool sk = type.rfind("sk-", 0) == 0;
  std::string base = "KEY";
  if (type.find("ed25519") != std::string_view::npos) {
    base = "ED25519";
  } else if (type.find("ecdsa") != std::string_view::npos) {
    base = "ECDSA";
  } else if (type.find("rsa") != std::string_view::npos) {
    base = "RSA";
  } else if (type.find("dss") != std::string_view::npos) {
    base = "DSA";
  }
  return base + (sk ? "-SK" : "") + (cert ? "-CERT" : "");
}

std::string key_blob(ssh_key key)
{
  char* text = nullptr;
  if (key == nullptr || ssh_pki_export_pubkey_base64(key, &text) != SSH_OK || text == nullptr) {
    return {};
  }
  std::string blob = known_hosts::base64_decode(text);
  ssh_string_free_char(text);
  return blob;
}

std::string blob_type(std::string_view blob)
{
  WireReader in(blob);
  const auto type = in.string();
  return in.ok() ? std::string(type) : std::string();
}

Key key_from_blob(std::string_view blob)
{
  const std::string type = blob_type(blob);
  ssh_key raw = nullptr;
  if (type.empty() ||
      ssh_pki_import_pubkey_base64(base64_encode(blob).c_str(),
                                   ssh_key_type_from_name(type.c_str()), &raw) != SSH_OK) {
    return Key();
  }
  return Key(raw);
}

std::optional<Certificate> parse_certificate(std::string_view blob)
{
  WireReader in(blob);
  Certificate cert;
  cert.type = std::string(in.string());
  const int fields = key_fields(cert.type);
  if (!in.ok() || fields == 0 || !ends_with(cert.type, "-cert-v01@openssh.com")) {
    return std::nullopt;
  }
  in.string(); // nonce
  const std::size_t key_start = in.offset();
  for (int i = 0; i < fields; ++i) {
    in.string();
  }
  cert.plain_blob = put_string(plain_type(cert.type)) +
                    std::string(blob.substr(key_start, in.offset() - key_start));
  cert.serial = in.number(8);
  cert.cert_type = static_cast<std::uint32_t>(in.number(4));
  cert.key_id = std::string(in.string());
  WireReader principals(in.string());
  cert.valid_after = in.number(8);
  cert.valid_before = in.number(8);
  while (in.ok() && principals.ok() && principals.offset() < principals.data().size()) {
    cert.principals.emplace_back(principals.string());
  }
  if (!in.ok() || !principals.ok()) {
    return std::nullopt;
  }
  return cert;
}

std::string certificate_doubts(const Certificate& cert, const std::string& user, std::uint64_t now)
{
  std::vector<std::string> doubts;
  if (cert.cert_type != 1) {
    doubts.push_back("it is not a user certificate");
  }
  if (now >= cert.valid_before) {
    doubts.push_back(fmt::format("it expired on {}", utc_date(cert.valid_before)));
  } else if (now < cert.valid_after) {
    doubts.push_back(fmt::format("it is not valid before {}", utc_date(cert.valid_after)));
  }
  if (!cert.principals.empty() &&
      std::find(cert.principals.begin(), cert.principals.end(), user) == cert.principals.end()) {
    std::string names;
    for (const auto& p : cert.principals) {
      names += (names.empty() ? "" : ", ") + terminal_safe(p);
    }
    doubts.push_back(fmt::format("its principals ({}) do not include {}", names, user));
  }
  std::string out;
  for (const auto& doubt : doubts) {
    out += (out.empty() ? "" : "; ") + doubt;
  }
  return out;
}

std::optional<std::string> openssh_private_key_public_blob(std::string_view text)
{
  static constexpr std::string_view begin = "-----BEGIN OPENSSH PRIVATE KEY-----";
  static constexpr std::string_view end = "-----END OPENSSH PRIVATE KEY-----";
  const auto first = text.find(begin);
  const auto last = text.find(end);
  if (first == std::string_view::npos || last == std::string_view::npos || last < first) {
    return std::nullopt;
  }
  std::string body;
  for (char c : text.substr(first + begin.size(), last - first - begin.size())) {
    if (c != '\n' && c != '\r' && c != ' ' && c != '\t') {
      body += c;
    }
  }
  const std::string bytes = known_hosts::base64_decode(body);
  static constexpr std::string_view magic{"openssh-key-v1\0", 15};
  if (bytes.compare(0, magic.size(), magic) != 0) {
    return std::nullopt;
  }
  WireReader in(std::string_view(bytes).substr(magic.size()));
  in.string(); // cipher
  in.string(); // kdf
  in.string(); // kdf options
  const auto keys = in.number(4);
  const auto blob = in.string();
  if (!in.ok() || keys < 1) {
    return std::nullopt;
  }
  return std::string(blob);
}

} // namespace ferry::ssh
