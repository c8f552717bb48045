#pragma once
// The only exec string that means the same in sh, bash, dash, zsh, fish, tcsh and csh is one
// whose tokens match [A-Za-z0-9/._-]+, separated by single spaces (docs/run-protocol.md).
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"

namespace ferry {

[[nodiscard]] bool is_shell_neutral_token(std::string_view token);
[[nodiscard]] bool is_shell_neutral_command(std::string_view command);

// Joins argv with single spaces, refusing any token outside the neutral alphabet.
[[nodiscard]] Expected<std::string> shell_neutral_command(const std::vector<std::string>& argv);

} // namespace ferry
