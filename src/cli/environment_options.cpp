// --env and --interpreter, the same for every command that runs jobs.
#include "cli/cli.hpp"

namespace ferry::cli {

void add_environment_options(CLI::App& command, EnvironmentOptions& environment)
{
  command
      .add_option("--env", environment.env,
                  "KEY=VALUE in the job's environment (repeatable); KEY alone passes ferry's own "
                  "value, and only the name is archived")
      ->allow_extra_args(false);
  command
      .add_option("--interpreter", environment.interpreters,
                  "NAME=PATH runs jobs whose interpreter is NAME with PATH (repeatable; wins over "
                  "the config file)")
      ->allow_extra_args(false);
}

} // namespace ferry::cli
