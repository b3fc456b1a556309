#include "cli/cli.hpp"

int main(int argc, char **argv) {
  return tessera::cli::main(argc, argv);
}
