// libssh is opened on first use (src/transport/ssh/libssh_loader.cpp): the real one loads, and a
// missing or foreign library is an error that names it and what to install.
#include <catch2/catch.hpp>

#include "ferry/version.hpp"
#include "transport/ssh/libssh_loader.hpp"

using namespace ferry;

TEST_CASE("libssh loads on first use and gives its version", "[libssh]")
{
  REQUIRE(ssh::load_libssh());
  CHECK(std::string(ssh_library_version()).rfind("0.10", 0) == 0);
}

TEST_CASE("a libssh that cannot be loaded is named with what to install", "[libssh]")
{
  const auto missing = ssh::try_loading_libssh("libferry-test-no-such-library.so.0");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("libferry-test-no-such-library.so.0") != std::string::npos);
  CHECK(missing.error().message.find("libssh-4") != std::string::npos);

  // zlib loads, but has none of libssh's functions: the first one looked up is named.
  const auto foreign = ssh::try_loading_libssh("libz.so.1");
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().message.find("lacks sftp_attributes_free") != std::string::npos);
  // The process's own libssh is untouched by either.
  CHECK(ssh::load_libssh());
}
