// known_hosts matching as OpenSSH does it: patterns, negation, ports, hashed names, markers.
#include <catch2/catch.hpp>

#include "transport/ssh/known_hosts.hpp"

using namespace ferry::known_hosts;

namespace {
std::string hex(const std::string& bytes)
{
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}
} // namespace

TEST_CASE("HMAC-SHA1 and base64 give the published test vectors", "[known_hosts]")
{
  // RFC 2202 test cases 1, 2 and 6 (a key longer than the block).
  CHECK(hex(hmac_sha1(std::string(20, '\x0b'), "Hi There")) ==
        "b617318655057264e28bc0b6fb378c8ef146be00");
  CHECK(hex(hmac_sha1("Jefe", "what do ya want for nothing?")) ==
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
  CHECK(hex(hmac_sha1(std::string(80, '\xaa'),
                      "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "aa4ae5e15272d00e95705637ce8a3b55ed402112");
  CHECK(base64_decode("Zm9vYmFy") == "foobar");
  CHECK(base64_decode("Zm9vYg==") == "foob");
  CHECK(base64_decode("Zm9=YmFy").empty());
  CHECK(base64_decode("Zm9").empty());
  CHECK(base64_decode("Zm9v!mFy").empty());
}

TEST_CASE("hashed host names match only the name they hash, port included", "[known_hosts]")
{
  // Made with Python's hmac for salt bytes 0..19, as `ssh-keygen -H` writes them.
  const std::string with_port = "|1|AAECAwQFBgcICQoLDA0ODxAREhM=|zKYaAqmSav3Qxr2sffNqWFIcbe4=";
  const std::string plain = "|1|AAECAwQFBgcICQoLDA0ODxAREhM=|YxdeKHUDpSO4Rkxe2B5x3/QXd+A=";
  CHECK(host_matches(with_port, "127.0.0.1", 2222));
  CHECK_FALSE(host_matches(with_port, "127.0.0.1", 2223));
  CHECK_FALSE(host_matches(with_port, "127.0.0.1", 22));
  CHECK(host_matches(plain, "gpu1.example.com", 22));
  CHECK_FALSE(host_matches(plain, "gpu2.example.com", 22));
  CHECK_FALSE(host_matches("|1|not base64|x", "gpu1.example.com", 22));
  CHECK_FALSE(host_matches("|1|", "gpu1.example.com", 22));
}

TEST_CASE("host patterns: lists, wildcards, negation, case and ports", "[known_hosts]")
{
  CHECK(host_matches("gpu1,gpu2", "gpu2", 22));
  CHECK_FALSE(host_matches("gpu1,gpu2", "gpu3", 22));
  CHECK(host_matches("GPU1.Example.COM", "gpu1.example.com", 22));
  CHECK(host_matches("*.example.com", "gpu1.example.com", 22));
  CHECK_FALSE(host_matches("*.example.com", "example.com", 22));
  CHECK(host_matches("gpu?", "gpu7", 22));
  CHECK_FALSE(host_matches("gpu?", "gpu17", 22));
  CHECK(host_matches("*", "anything", 22));
  CHECK(host_matches("*", "127.0.0.1", 2222)); // `*` matches "[127.0.0.1]:2222" too
  CHECK_FALSE(host_matches("*,!gpu9", "gpu9", 22));
  CHECK_FALSE(host_matches("!gpu9,*", "gpu9", 22));
  CHECK_FALSE(host_matches("!gpu9", "gpu1", 22)); // a negation alone admits nothing
  CHECK(host_matches("[127.0.0.1]:2222", "127.0.0.1", 2222));
  CHECK_FALSE(host_matches("127.0.0.1", "127.0.0.1", 2222));
  CHECK_FALSE(host_matches("[127.0.0.1]:2222", "127.0.0.1", 22));
  CHECK(host_matches("[127.0.0.1]:*", "127.0.0.1", 2222));
  CHECK_FALSE(host_matches("", "gpu1", 22));
  CHECK_FALSE(host_matches(",", "gpu1", 22));
  CHECK(lookup_name("gpu1", 22) == "gpu1");
  CHECK(lookup_name("gpu1", 2222) == "[gpu1]:2222");
}

TEST_CASE("known_hosts lines: markers, comments and malformed lines", "[known_hosts]")
{
  const auto entries = parse("# comment\n"
                             "\n"
                             "gpu1,10.0.0.1 ssh-ed25519 AAAA1\n"
                             "  @revoked * ssh-ed25519 AAAA2\n"
                             "@cert-authority *.example.com ssh-rsa AAAA3 comment words\n"
                             "@unknown-marker gpu1 ssh-ed25519 AAAA4\n"
                             "@revoked gpu1 ssh-ed25519\n"
                             "gpu2 ssh-ed25519\n"
                             "\tgpu3\tssh-ed25519\tAAAA5\r\n",
                             "kh");
  REQUIRE(entries.size() == 4);
  CHECK(entries[0].marker == Marker::none);
  CHECK(entries[0].hosts == "gpu1,10.0.0.1");
  CHECK(entries[0].key_type == "ssh-ed25519");
  CHECK(entries[0].key_base64 == "AAAA1");
  CHECK(entries[0].line == 3);
  CHECK(entries[0].file == "kh");
  CHECK(entries[1].marker == Marker::revoked);
  CHECK(entries[1].hosts == "*");
  CHECK(entries[1].line == 4);
  CHECK(entries[2].marker == Marker::cert_authority);
  CHECK(entries[2].key_base64 == "AAAA3");
  CHECK(entries[3].hosts == "gpu3");
  CHECK(entries[3].key_base64 == "AAAA5");
  CHECK(entries[3].line == 9);
  CHECK(read_files({"/nonexistent/known_hosts"}).empty());
}
