#pragma once
// An SSH session as the targets built on it see it (the Slurm target, which submits through a
// login node): the run-level seam, and below it a plain command on a channel of its own and a
// file written over SFTP.
#include <memory>
#include <string>
#include <string_view>

#include "ferry/sessions.hpp"
#include "transport/exec_request.hpp"

namespace ferry::ssh {

class Remote : public SshConnection {
public:
  // A command of shell-neutral tokens on a channel of its own (never one kept ahead).
  [[nodiscard]] virtual Expected<ExecOutcome> exec(const ExecRequest& request) = 0;
  // Runs are staged without the job cache: the job goes into each run directory (the Slurm
  // target's run base is a shared scratch, where nothing of a run stays behind it).
  virtual void without_job_cache() = 0;
  // A new 0600 file (O_EXCL), written in place.
  [[nodiscard]] virtual Expected<void> put_file(const std::string& path,
                                                std::string_view bytes) = 0;
};

[[nodiscard]] std::unique_ptr<Remote> make_remote(const SshTarget& target);

} // namespace ferry::ssh
