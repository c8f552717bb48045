#include "cli/cli.hpp"

int main(int argc, char** argv)
{
  return ferry::cli::cli_main(argc, argv);
}
