#pragma once
// How a standby channel's sh becomes the python standby (docs/persistence.md, "The python
// standby"): ferry's own line for it, the standby's ready line, and its refusal.
#include <string>
#include <string_view>

namespace ferry {

// The line a standby channel's `/bin/sh -s` is given: `exec python3 -I -S -c 'VERIFIER' ENTRY
// SHA256 TAG ferry-standby`. VERIFIER, ferry's own text, runs ENTRY (the script in the job cache,
// a shell-neutral path ferry built) only when its bytes match standby_script()'s sha256, and the
// compiled code kept beside it only when that matches `tag_sha256` (empty: not known; the script
// compiles afresh). `once`: a direct connection's only run (`... TAG once ferry-standby`), for
// which the standby starts no interpreter ahead and takes a `stage-first` line.
[[nodiscard]] std::string standby_boot_line(const std::string& entry, const std::string& tag_sha256,
                                            bool once = false);
// The python standby's first line on stdout once it runs verified bytes: `PREFIX TAG_SHA256`, the
// sha256 of the compiled code it keeps in the job cache ("-": none), for the next standby's line.
inline constexpr std::string_view k_standby_ready = "ferry-standby-ready";
// The verifier's exit status when the script in the job cache cannot be read or no longer
// matches its sha256: ferry discards the entry and puts it there again.
inline constexpr int k_standby_refused_exit = 4;
// A `once` standby that found the job's entry in the job cache not as ferry leaves it says so on
// stderr before the run's sentinel, then removes it and makes it anew from the job's bytes:
// `PREFIX ENTRY REASON`, REASON one of the two below (docs/run-protocol.md, "A first run without
// SFTP").
inline constexpr std::string_view k_standby_entry_refused_prefix =
    "ferry-standby: the job cache entry ";
inline constexpr std::string_view k_standby_entry_mismatch = "does not match its sha256";
inline constexpr std::string_view k_standby_entry_unlike = "is not as ferry leaves it";

} // namespace ferry
