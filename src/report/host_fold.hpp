#pragma once
// Host names folded the way ClusterShell and pdsh write a set of nodes ("gpu[01-08,17]"): the
// terminal's fleet summary names each group of hosts this way. The other direction (expanding
// a hostlist a user gives) is not this file's.
#include <string>
#include <vector>

namespace ferry {

// NAMES as one nodeset, its parts separated by ",": names that differ only in their last run of
// digits share one bracket ("gpu1,gpu2,gpu3" -> "gpu[1-3]", "r2-n01-ib,r2-n02-ib" ->
// "r2-n[01-02]-ib"). Zero padding is kept as written: a range is padded to its first number's
// width ("gpu09,gpu10" -> "gpu[09-10]", "gpu01,gpu02,gpu10" -> "gpu[01-02,10]"), and "gpu1"
// and "gpu01" stay two names ("gpu[1,01]"). A name alone in its group keeps no bracket; names
// without digits, or with characters nodesets use ('[', ']', ','), are listed as they are.
// Parts come sorted by prefix and suffix, numbers ascending; a name given twice is listed once.
[[nodiscard]] std::string fold_hosts(const std::vector<std::string>& names);

} // namespace ferry
