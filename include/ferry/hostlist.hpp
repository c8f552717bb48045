#pragma once
// Hostlists in the folded syntax of ClusterShell and pdsh: "gpu[01-16]", "node[1-4,7]",
// "r[1-2]n[1-2]" (several bracket groups expand as a product, the first one outermost).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"

namespace ferry {

// More hosts than this from one command line is a typo ("gpu[1-100000000]"), not a fleet.
inline constexpr std::size_t k_max_hostlist_hosts = 100000;

// The entries of a comma-separated list, split at the commas outside brackets ("a,n[1,3],b":
// "a", "n[1,3]", "b"), each trimmed; empty entries are kept for the caller to refuse.
[[nodiscard]] std::vector<std::string> split_hostlist(std::string_view list);

// The hosts one entry names, in order: a zero-padded range keeps its width ("[08-11]": 08, 09,
// 10, 11), "[1-9/2]" steps by 2, and "user@" and ":port" stay on every host. A bracket right at
// the start of the host holding a ':' is an IPv6 literal ("[::1]:22", "me@[fe80::1]"), kept as
// written. A backwards or non-numeric range, an unbalanced bracket, or more than `cap` hosts is
// ErrorKind::usage naming the entry.
[[nodiscard]] Expected<std::vector<std::string>>
expand_hostlist(std::string_view entry, std::size_t cap = k_max_hostlist_hosts);

} // namespace ferry
