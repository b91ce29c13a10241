// absl flags keep only the last occurrence of a flag; --set is meant to be repeated. This
// takes every `--NAME=VALUE` and `--NAME VALUE` out of argv (in order) before absl parses it.
//
//   std::vector<std::string> sets = TakeRepeatedFlag("set", argc, argv);
//   absl::ParseCommandLine(argc, argv);
#ifndef CPPTRAIN_TOOLS_REPEATED_FLAG_H_
#define CPPTRAIN_TOOLS_REPEATED_FLAG_H_

#include <string>
#include <vector>

namespace cpptrain {

// Removes the occurrences from argv and lowers argc accordingly.
std::vector<std::string> TakeRepeatedFlag(const std::string& name, int& argc, char** argv);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_REPEATED_FLAG_H_
