#include "cli/cli.hpp"

#include <string_view>

int main(int argc, char** argv)
{
  if (argc == 3 && std::string_view(argv[1]) == "__hold") {
    return ferry::cli::holder_main(argv[2]);
  }
  return ferry::cli::cli_main(argc, argv);
}
