// The second half of the example: a small decoder trained for a few steps on the library's
// character-level arithmetic corpus, its predictions on held-out lines written as JSON lines
// (trainer/predictions.h), and completions of a prompt generated through the library's
// generation room (generation/generate.h): greedy, and sampled twice from one seed (the same
// tokens both times).
//
//   CT_RETURN_IF_ERROR(TrainDecoderAndGenerate("/tmp/run/decoder", std::cout));
#ifndef CPPTRAIN_EXAMPLES_DECODER_GENERATION_H_
#define CPPTRAIN_EXAMPLES_DECODER_GENERATION_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace example {

// Trains in `output_dir` (created), writes output_dir/predictions.jsonl and prints the
// completions to `out`. Errors: a failure of the library, an empty completion, or two samples
// from one seed that differ.
absl::Status TrainDecoderAndGenerate(const std::string& output_dir, std::ostream& out);

}  // namespace example

#endif  // CPPTRAIN_EXAMPLES_DECODER_GENERATION_H_
