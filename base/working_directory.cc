#include "base/working_directory.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace cpptrain {

void EnterBuildWorkingDirectory() {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (dir == nullptr || *dir == '\0') return;
  if (chdir(dir) != 0) {
    std::cerr << "cannot enter BUILD_WORKING_DIRECTORY '" << dir << "' (" << std::strerror(errno)
              << "): relative paths resolve from " << (getenv("PWD") ? getenv("PWD") : "here")
              << " instead\n";
  }
}

}  // namespace cpptrain
