#pragma once
#include <string_view>

namespace ferry {
[[nodiscard]] std::string_view version();
} // namespace ferry
