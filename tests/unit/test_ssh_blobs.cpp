// Key blobs and OpenSSH certificates as ssh-keygen writes them: the certified key, principals,
// validity, fingerprints, and the public key an encrypted private key file carries.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "transport/ssh/blobs.hpp"
#include "transport/ssh/known_hosts.hpp"

using namespace ferry::ssh;
namespace fs = std::filesystem;

namespace {

struct KeyDir {
  fs::path dir;
  KeyDir()
  {
    char pattern[] = "/tmp/ferry-ssh-blobs-XXXXXX";
    dir = ::mkdtemp(pattern);
  }
  ~KeyDir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Runs a command (fixed text built from our own paths only); fails the test on an error.
  static void run(const std::string& command)
  {
    INFO(command);
    REQUIRE(std::system((command + " >/dev/null 2>&1").c_str()) == 0);
  }
  static std::string slurp(const std::string& file)
  {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // The blob of a one-line public key or certificate file ("TYPE BASE64 COMMENT").
  static std::string blob_of(const std::string& file)
  {
    std::istringstream line(slurp(file));
    std::string type, base64;
    line >> type >> base64;
    return ferry::known_hosts::base64_decode(base64);
  }
  static std::string run_output(const std::string& command)
  {
    std::string out;
    if (FILE* pipe = ::popen(command.c_str(), "r")) {
      char buffer[512];
      while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
        out += buffer;
      }
      ::pclose(pipe);
    }
    return out;
  }
};

} // namespace

TEST_CASE("certificates: the certified key, principals and validity as ssh-keygen wrote them",
          "[ssh_blobs]")
{
  KeyDir keys;
  const auto ca = keys.path("ca"), user = keys.path("user");
  KeyDir::run("ssh-keygen -q -t ed25519 -N '' -f " + ca);
  KeyDir::run("ssh-keygen -q -t ed25519 -N '' -f " + user);
  KeyDir::run("ssh-keygen -q -s " + ca + " -I key-7 -z 42 -n alice,bob -V 20200101:20200201 " +
              user + ".pub");
  const auto cert = parse_certificate(KeyDir::blob_of(user + "-cert.pub"));
  REQUIRE(cert);
  CHECK(cert->type == "ssh-ed25519-cert-v01@openssh.com");
  CHECK(cert->plain_blob == KeyDir::blob_of(user + ".pub"));
  CHECK(cert->serial == 42);
  CHECK(cert->cert_type == 1);
  CHECK(cert->key_id == "key-7");
  CHECK(cert->principals == std::vector<std::string>{"alice", "bob"});
  CHECK(cert->valid_before > cert->valid_after);

  const auto expired = certificate_doubts(*cert, "carol", cert->valid_before + 1);
  CHECK_THAT(expired, Catch::Contains("expired on 2020-02-01") &&
                          Catch::Contains("principals (alice, bob) do not include carol"));
  CHECK_THAT(certificate_doubts(*cert, "alice", 0), Catch::Contains("not valid before 2020-01-01"));
  CHECK(certificate_doubts(*cert, "bob", cert->valid_after + 10).empty());
  CHECK_FALSE(parse_certificate(KeyDir::blob_of(user + ".pub")));
  CHECK(key_type_label(cert->type) == "ED25519-CERT");
  CHECK(key_type_label("ssh-rsa") == "RSA");
  CHECK(blob_type(cert->plain_blob) == "ssh-ed25519");
}

TEST_CASE("an RSA certificate and fingerprints as ssh-keygen -l prints them", "[ssh_blobs]")
{
  KeyDir keys;
  const auto ca = keys.path("ca"), user = keys.path("rsa");
  KeyDir::run("ssh-keygen -q -t ed25519 -N '' -f " + ca);
  KeyDir::run("ssh-keygen -q -t rsa -b 2048 -N '' -f " + user);
  KeyDir::run("ssh-keygen -q -s " + ca + " -I r -n alice " + user + ".pub");
  const auto cert = parse_certificate(KeyDir::blob_of(user + "-cert.pub"));
  REQUIRE(cert);
  CHECK(cert->plain_blob == KeyDir::blob_of(user + ".pub"));
  CHECK(cert->valid_before == ~std::uint64_t{0});
  const auto listed = KeyDir::run_output("ssh-keygen -l -E sha256 -f " + user + ".pub");
  CHECK_THAT(listed, Catch::Contains(blob_fingerprint(KeyDir::blob_of(user + ".pub"))));
  // A certificate's fingerprint is its key's, as ssh -v shows it.
  CHECK(blob_fingerprint(KeyDir::blob_of(user + "-cert.pub")) ==
        blob_fingerprint(KeyDir::blob_of(user + ".pub")));
}

TEST_CASE("the public key in an encrypted OpenSSH private key file", "[ssh_blobs]")
{
  KeyDir keys;
  const auto key = keys.path("locked");
  KeyDir::run("ssh-keygen -q -t ed25519 -N 'a passphrase' -f " + key);
  const auto blob = openssh_private_key_public_blob(KeyDir::slurp(key));
  REQUIRE(blob);
  CHECK(*blob == KeyDir::blob_of(key + ".pub"));
  CHECK_FALSE(openssh_private_key_public_blob("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n"));
  CHECK(base64_encode("foob") == "Zm9vYg==");
  CHECK(base64_encode("fooba") == "Zm9vYmE=");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
}
