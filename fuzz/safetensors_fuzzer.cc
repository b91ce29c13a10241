// Fuzzes the safetensors reader (checkpoint/safetensors.h): the input is a whole file, opened with
// SafetensorsFile::Open. For a file that opens, every accessor runs on every tensor and must agree
// with what Open validated: Info's byte range matches dtype and shape, Get, GetCopy and GetSlice
// return the bytes the checksum was computed over, out-of-range slices are errors. Then the
// tensors are written again with WriteSafetensors and the new file must open with the same
// tensors, the same bytes, the same metadata and checksums that verify.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace {

using cpptrain::Crc32c;
using cpptrain::SafetensorsFile;
using cpptrain::SafetensorsTensorInfo;

uint32_t BytesCrc(const at::Tensor& t) {
  return Crc32c(static_cast<const char*>(t.data_ptr()),
                static_cast<size_t>(t.numel()) * t.element_size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = cpptrain::fuzz::ScratchPath("input.safetensors");
  static const std::string rewritten = cpptrain::fuzz::ScratchPath("rewritten.safetensors");
  cpptrain::fuzz::WriteFileOrDie(path, data, size);
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return 0;

  std::vector<std::pair<std::string, at::Tensor>> copies;
  std::vector<uint32_t> crcs;
  FUZZ_CHECK(std::set<std::string>((*file)->names().begin(), (*file)->names().end()).size() ==
                 (*file)->names().size(),
             "names() repeats a tensor");
  for (const std::string& name : (*file)->names()) {
    FUZZ_CHECK((*file)->Has(name), name);
    const auto info = (*file)->Info(name);
    FUZZ_CHECK(info.ok(), info.status());
    int64_t numel = 1;
    for (int64_t dim : info->shape) numel *= dim;  // Open checked that the bytes fit int64
    FUZZ_CHECK(
        info->end - info->begin == numel * static_cast<int64_t>(c10::elementSize(info->dtype)),
        name << ": data_offsets [" << info->begin << ", " << info->end
             << ") do not match dtype and shape");
    const auto stored = (*file)->StoredCrc32c(name);
    FUZZ_CHECK(stored.ok(), stored.status());
    const auto computed = (*file)->ComputeCrc32c(name);
    FUZZ_CHECK(computed.ok(), computed.status());
    const absl::Status verified = (*file)->VerifyCrc32c(name);
    FUZZ_CHECK(verified.ok() == (!stored->has_value() || **stored == *computed), verified);

    const auto view = (*file)->Get(name);
    FUZZ_CHECK(view.ok(), view.status());
    FUZZ_CHECK(view->sizes().vec() == info->shape && view->scalar_type() == info->dtype, name);
    FUZZ_CHECK(BytesCrc(*view) == *computed, name << ": Get's bytes are not the file's");
    const auto copy = (*file)->GetCopy(name);
    FUZZ_CHECK(copy.ok(), copy.status());
    FUZZ_CHECK(BytesCrc(*copy) == *computed, name << ": GetCopy's bytes are not the file's");

    if (info->shape.empty()) {
      FUZZ_CHECK(!(*file)->GetSlice(name, 0, 1).ok(), name << ": GetSlice of a 0-d tensor");
    } else {
      const int64_t rows = info->shape[0];
      const auto all = (*file)->GetSlice(name, 0, rows);
      FUZZ_CHECK(all.ok(), all.status());
      FUZZ_CHECK(BytesCrc(*all) == *computed, name << ": GetSlice of every row differs");
      const auto tail = (*file)->GetSlice(name, rows / 2, rows);
      FUZZ_CHECK(tail.ok() && tail->size(0) == rows - rows / 2, name);
      (void)BytesCrc(*tail);  // reads the rows' bytes
      FUZZ_CHECK(!(*file)->GetSlice(name, -1, rows).ok(), name << ": rows from -1");
      FUZZ_CHECK(!(*file)->GetSlice(name, 0, rows + 1).ok(), name << ": one row past the end");
      FUZZ_CHECK(!(*file)->GetSlice(name, rows, rows - 1).ok(), name << ": begin after end");
    }
    copies.emplace_back(name, *copy);
    crcs.push_back(*computed);
  }

  // Written again (the reference writer's layout, with checksums), the tensors read back alike.
  const absl::Status written = cpptrain::WriteSafetensors(rewritten, copies, (*file)->metadata());
  FUZZ_CHECK(written.ok(), "tensors and metadata read from a file cannot be written: " << written);
  auto again = SafetensorsFile::Open(rewritten);
  FUZZ_CHECK(again.ok(), "the rewritten file does not open: " << again.status());
  FUZZ_CHECK((*again)->metadata() == (*file)->metadata(), "metadata changed in the rewrite");
  FUZZ_CHECK((*again)->names().size() == copies.size(), "the rewrite has another tensor count");
  for (size_t i = 0; i < copies.size(); ++i) {
    const std::string& name = copies[i].first;
    const auto before = (*file)->Info(name);
    const auto after = (*again)->Info(name);
    FUZZ_CHECK(after.ok(), name << " is missing from the rewrite");
    FUZZ_CHECK(after->dtype == before->dtype && after->shape == before->shape, name);
    FUZZ_CHECK((*again)->ComputeCrc32c(name).value() == crcs[i], name << ": bytes changed");
    const auto stored = (*again)->StoredCrc32c(name);
    FUZZ_CHECK(stored.ok() && stored->has_value() && **stored == crcs[i],
               name << ": the writer's checksum is not the bytes'");
  }
  return 0;
}
