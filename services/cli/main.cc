// cascade: the command-line tool (demo, up, generate, mkmodel, tokenize, detokenize).
#include <iostream>
#include <string>
#include <vector>

#include "services/cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return cascade::cli::RunCli(args, std::cin, std::cout, std::cerr);
}
