#include "ferry/fd.hpp"

#include <cerrno>

#include <unistd.h>

namespace ferry {

void Fd::reset(int fd)
{
  if (m_fd >= 0) {
    ::close(m_fd);
  }
  m_fd = fd;
}

int Fd::close()
{
  if (m_fd < 0) {
    return 0;
  }
  const int rc = ::close(std::exchange(m_fd, -1));
  return rc == 0 ? 0 : errno;
}

} // namespace ferry
