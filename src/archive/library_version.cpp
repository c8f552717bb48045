#include <sqlite3.h>

#include "ferry/version.hpp"

namespace ferry {

std::string_view sqlite_library_version()
{
  return sqlite3_libversion();
}

} // namespace ferry
