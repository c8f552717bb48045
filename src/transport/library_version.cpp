// libssh is reached only from src/transport/; its version is asked for here.
#include <libssh/libssh.h>

#include "ferry/version.hpp"
#include "transport/ssh/libssh_loader.hpp"

namespace ferry {

std::string_view ssh_library_version()
{
  if (!ssh::load_libssh()) {
    return "not loadable";
  }
  return ssh_version(0);
}

} // namespace ferry
