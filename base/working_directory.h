// Relative paths under `bazel run` mean what the user typed. A tool's main calls this first:
//
//   int main(int argc, char** argv) {
//     cpptrain::EnterBuildWorkingDirectory();
//     ...  // --config=jobs/a.textproto, output_dir "out" and data paths: from the user's cwd
//
// `bazel run //tools:train -- --config=jobs/a.textproto` starts the tool inside its runfiles
// tree; Bazel names the directory the command was typed in as BUILD_WORKING_DIRECTORY.
#ifndef CPPTRAIN_BASE_WORKING_DIRECTORY_H_
#define CPPTRAIN_BASE_WORKING_DIRECTORY_H_

namespace cpptrain {

// Changes into $BUILD_WORKING_DIRECTORY when it is set and not empty (the processes a launcher
// starts then inherit it); does nothing otherwise. A directory that cannot be entered is
// reported on stderr and the tool stays where it was.
void EnterBuildWorkingDirectory();

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_WORKING_DIRECTORY_H_
