// Reads and writes safetensors files (Hugging Face's format: an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the bytes), and
// model directories sharded with model.safetensors.index.json.
//
//   CT_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors",
//                                       {{"model.norm.weight", norm}}, {{"format", "pt"}}));
//   CT_ASSIGN_OR_RETURN(auto model, SafetensorsModelDir::Open(dir));
//   CT_ASSIGN_OR_RETURN(at::Tensor w, model->Get("model.norm.weight"));  // read-only, no copy
//   CT_ASSIGN_OR_RETURN(at::Tensor rows, model->GetSlice("lm_head.weight", 0, 1024));
//
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Writes are atomic: a file is
// written beside its destination, fsynced, renamed over it, and the directory fsynced, so a
// crash or an error leaves either the old file or the new one.
//
// Checksums: by default the writer stores a CRC-32C of each tensor's bytes (checkpoint/crc32c.h,
// computed as the bytes stream out) in the header's "__metadata__" as
// "crc32c.<tensor name>": "<8 hex digits>" (string values, as the format requires, so other
// readers, Python's safetensors and transformers among them, read the file as before).
// SafetensorsFile::StoredCrc32c and ComputeCrc32c read and recompute them:
//   CT_ASSIGN_OR_RETURN(std::optional<uint32_t> stored, file->StoredCrc32c("w"));
//   CT_ASSIGN_OR_RETURN(uint32_t now, file->ComputeCrc32c("w"));   // reads every byte of "w"
#ifndef CPPTRAIN_CHECKPOINT_SAFETENSORS_H_
#define CPPTRAIN_CHECKPOINT_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cpptrain {

inline constexpr char kSafetensorsFileName[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";
// "__metadata__" keys "crc32c.<tensor name>" hold the tensors' checksums.
inline constexpr char kChecksumMetadataPrefix[] = "crc32c.";

struct SafetensorsWriteOptions {
  // A CRC-32C per tensor in "__metadata__". Off: exactly the reference writer's bytes.
  bool checksums = true;
};

// One tensor of a safetensors file.
struct SafetensorsTensorInfo {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  // The tensor's bytes, [begin, end), counted from the first byte after the header.
  int64_t begin = 0;
  int64_t end = 0;
};

// Writes `tensors` (any device, any strides) and `metadata` (the header's "__metadata__",
// e.g. {{"format", "pt"}}) to `path` atomically, one tensor at a time (SafetensorsWriter).
// A duplicate name is an error, and `path` is then left as it was.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const SafetensorsWriteOptions& options = {});

// Writes a safetensors file holding one tensor in memory at a time (a converter's use): declare
// every entry first, which fixes the header and each tensor's place, then Append each tensor's
// bytes (in any order, each once), then Finish.
//
// The layout is the reference writer's: the header padded with spaces to a multiple of 8 bytes,
// then the tensors ordered by dtype (8-byte types first) and name, so each starts aligned.
// Bytes go to `path`.tmp.<pid>; only Finish puts them at `path`. A writer destroyed before
// Finish succeeded removes its temporary file and leaves `path` as it was. (One process must
// not run two writers to the same path at once: they would share the temporary file.)
//
//   CT_ASSIGN_OR_RETURN(auto writer,
//                       SafetensorsWriter::Create(path, {{"w", at::kBFloat16, {4096, 1024}}}));
//   CT_RETURN_IF_ERROR(writer->Append("w", LoadAndConvert("w")));
//   CT_RETURN_IF_ERROR(writer->Finish());
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
  };

  // Checks the entries (unique names, supported dtypes, no negative sizes) and the metadata
  // (no key starting with kChecksumMetadataPrefix when writing checksums), creates the
  // temporary file and writes the header (with placeholder checksums, the same width).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, const std::vector<Entry>& entries,
      const std::map<std::string, std::string>& metadata = {},
      const SafetensorsWriteOptions& options = {});

  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes the bytes of `tensor`, whose dtype and shape must match the entry `name`. A tensor
  // that is not a contiguous CPU tensor is first copied into one.
  absl::Status Append(const std::string& name, const at::Tensor& tensor);

  // Checks that every entry was appended, writes the header again with the checksums, then
  // fsyncs the file, renames it over `path` and fsyncs the directory.
  absl::Status Finish();

  // The CRC-32C of the bytes appended for `name` (once appended, with checksums on).
  absl::StatusOr<uint32_t> Crc32cOf(const std::string& name) const;

 private:
  struct Slot {
    Entry entry;
    int64_t data_offset = 0;  // from the first byte after the header
    int64_t bytes = 0;
    uint32_t crc32c = 0;
    bool written = false;
  };

  SafetensorsWriter(std::string path, std::string temp_path, std::map<std::string, Slot> slots,
                    std::vector<std::string> layout, std::map<std::string, std::string> metadata,
                    bool checksums);

  // The JSON header, padded; `final`: with the appended tensors' checksums, else placeholders.
  std::string Header(bool final) const;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int64_t data_start_ = 0;  // 8 + the header's length
  std::map<std::string, Slot> slots_;
  std::vector<std::string> layout_;  // tensor names in the order of their bytes
  std::map<std::string, std::string> metadata_;
  bool checksums_ = true;
};

// A safetensors file mapped read-only into memory, with its header validated on Open. Every
// method is const and safe to call from several threads.
class SafetensorsFile {
 public:
  // Maps `path` and checks its header: length within 100,000,000 bytes and the file, strict
  // JSON, every entry with a known dtype, a shape, and data_offsets matching the shape,
  // entries covering the data exactly (no gap, no overlap), "__metadata__" string to string,
  // each checksum entry 8 hex digits for a tensor of the file.
  // Errors name the file, the tensor, the field, the value seen and what was expected.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in the order of their bytes in the file.
  const std::vector<std::string>& names() const { return names_; }
  // "__metadata__" without the checksum entries (StoredCrc32c has those).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool Has(const std::string& name) const { return infos_.count(name) > 0; }
  absl::StatusOr<SafetensorsTensorInfo> Info(const std::string& name) const;

  // The CRC-32C the writer stored for `name`; nullopt when the file holds none for it (written
  // by another tool, or without checksums).
  absl::StatusOr<std::optional<uint32_t>> StoredCrc32c(const std::string& name) const;
  // The CRC-32C of the tensor's bytes as they are in the file now (reads every one of them, in
  // 8 MiB pieces, each dropped from the resident set once read: ReleasePages).
  absl::StatusOr<uint32_t> ComputeCrc32c(const std::string& name) const;
  // DataLoss naming the file, the tensor and both values when the tensor has a stored checksum
  // its bytes no longer match; OK when they match or nothing is stored.
  absl::Status VerifyCrc32c(const std::string& name) const;

  // A CPU tensor viewing the mapped file, without a copy. It is READ-ONLY: the pages are
  // mapped without write permission, so writing to it (in-place ops, optimizer steps) kills
  // the process with SIGSEGV; use GetCopy for a tensor to modify. The mapping lives as long as
  // any tensor viewing it, even after this object is gone. A tensor whose bytes are not
  // aligned to its element size (possible in files from other writers) comes back as a copy.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;

  // An owned, writable copy of the tensor.
  absl::StatusOr<at::Tensor> GetCopy(const std::string& name) const;

  // Rows [dim0_begin, dim0_end) of the tensor along dimension 0, read-only and without a copy
  // like Get: only those rows' pages are read, so a rank can load just its shard.
  absl::StatusOr<at::Tensor> GetSlice(const std::string& name, int64_t dim0_begin,
                                      int64_t dim0_end) const;

  // Drops this process's mapped pages of the tensor (madvise MADV_DONTNEED; the page cache
  // keeps them, and a later read of a view maps them again), so that reading a file tensor by
  // tensor leaves no more than one tensor's pages in the resident set. Views stay valid.
  void ReleasePages(const std::string& name) const;

 private:
  struct Mapping;

  SafetensorsFile() = default;
  absl::StatusOr<const SafetensorsTensorInfo*> Find(const std::string& name) const;
  // The tensor at data offset `begin`: a view of the mapping, or an owned copy when `copy` is
  // set or the bytes are not aligned to the element size.
  at::Tensor View(at::ScalarType dtype, const std::vector<int64_t>& shape, int64_t begin,
                  bool copy) const;
  // ReleasePages for data bytes [begin, end) (the pages that hold them).
  void ReleaseRange(int64_t begin, int64_t end) const;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const char* data_ = nullptr;  // the first byte after the header
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsTensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, uint32_t> stored_crc32c_;
};

// Writes `dir`/model.safetensors.index.json atomically, as Hugging Face does:
// {"metadata": {"total_size": total_size}, "weight_map": {tensor name: shard file name}},
// two-space indented with sorted keys.
absl::Status WriteSafetensorsIndex(const std::string& dir,
                                   const std::map<std::string, std::string>& weight_map,
                                   int64_t total_size);

// A model directory: the shards named by model.safetensors.index.json when it exists,
// otherwise model.safetensors. Tensors are looked up by name across the files.
class SafetensorsModelDir {
 public:
  // Opens every file. With an index, each weight_map entry must be in its shard and each
  // shard's tensors in the weight_map.
  static absl::StatusOr<std::unique_ptr<SafetensorsModelDir>> Open(const std::string& dir);

  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool Has(const std::string& name) const { return file_of_.count(name) > 0; }
  // The file holding `name`.
  absl::StatusOr<const SafetensorsFile*> FileOf(const std::string& name) const;

  // As the SafetensorsFile methods of the same names.
  absl::StatusOr<SafetensorsTensorInfo> Info(const std::string& name) const;
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;
  absl::StatusOr<at::Tensor> GetCopy(const std::string& name) const;
  absl::StatusOr<at::Tensor> GetSlice(const std::string& name, int64_t dim0_begin,
                                      int64_t dim0_end) const;

 private:
  SafetensorsModelDir() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_SAFETENSORS_H_
