#include "tools/repeated_flag.h"

namespace cpptrain {

std::vector<std::string> TakeRepeatedFlag(const std::string& name, int& argc, char** argv) {
  std::vector<std::string> values;
  const std::string with_value = "--" + name + "=";
  const std::string bare = "--" + name;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {  // everything after belongs to the program
      while (i < argc) argv[out++] = argv[i++];
      break;
    }
    if (arg.rfind(with_value, 0) == 0) {
      values.push_back(arg.substr(with_value.size()));
    } else if (arg == bare && i + 1 < argc) {
      values.push_back(argv[++i]);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return values;
}

}  // namespace cpptrain
