#pragma once
// `--sweep KEY=V1,V2,...`: a job run once per value, and with several sweeps once per
// combination (docs/cli.md, "Sweeps"). Values are text typed like `-p KEY=VALUE`.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"

namespace ferry {

struct Sweep {
  std::string key;
  std::vector<std::string> values; // each as -p would take it
};

// More combinations than this is surely a mistake (and would flood the archive).
inline constexpr std::size_t k_max_sweep_runs = 10000;

// `KEY=V1,V2` or `KEY=["a,b", 2]` (a JSON list: a string element is its text, any other value
// its JSON text).
[[nodiscard]] Expected<Sweep> parse_sweep(std::string_view option);

// Every --sweep, checked: no key twice, none also given with -p (`assignments`), at most
// k_max_sweep_runs combinations.
[[nodiscard]] Expected<std::vector<Sweep>>
parse_sweeps(const std::vector<std::string>& options, const std::vector<std::string>& assignments);

// The cartesian product as -p assignments ("KEY=VALUE"), the first sweep varying slowest.
[[nodiscard]] std::vector<std::vector<std::string>>
sweep_combinations(const std::vector<Sweep>& sweeps);

} // namespace ferry
