#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/files.h"
#include "checkpoint/internal/json.h"

namespace cpptrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes, which this code copies as they are");

using checkpoint_internal::JsonQuote;
using checkpoint_internal::JsonValue;

// The reference implementation's MAX_HEADER_SIZE.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeSpec {
  at::ScalarType type;
  const char* name;
  int64_t size;
};

// In the reference writer's layout order (its dtype enum, descending): 8-byte types first.
constexpr DtypeSpec kDtypes[] = {
    {at::kLong, "I64", 8},  {at::kDouble, "F64", 8},    {at::kFloat, "F32", 4},
    {at::kInt, "I32", 4},   {at::kBFloat16, "BF16", 2}, {at::kHalf, "F16", 2},
    {at::kShort, "I16", 2}, {at::kChar, "I8", 1},       {at::kByte, "U8", 1},
    {at::kBool, "BOOL", 1},
};
constexpr char kSupportedDtypes[] = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";

const DtypeSpec* FindDtype(at::ScalarType type) {
  for (const DtypeSpec& spec : kDtypes) {
    if (spec.type == type) return &spec;
  }
  return nullptr;
}

const DtypeSpec* FindDtype(absl::string_view name) {
  for (const DtypeSpec& spec : kDtypes) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// numel(shape) * element_size in *bytes; false when a size is negative or the product overflows.
bool ByteSize(const std::vector<int64_t>& shape, int64_t element_size, int64_t* bytes) {
  int64_t total = element_size;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(total, dim, &total)) return false;
  }
  *bytes = total;
  return true;
}

// A JSON value as text for error messages, shortened when long.
std::string Render(const JsonValue& value) {
  std::string out = value.is_integer()  ? absl::StrCat(value.integer)
                    : value.is_string() ? JsonQuote(value.string)
                    : value.is_object() ? absl::StrCat("an object of ", value.keys.size(), " keys")
                                        : "[";
  if (value.is_array()) {
    for (size_t i = 0; i < value.values.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ", ", Render(value.values[i]));
    }
    out += "]";
  }
  return out.size() > 80 ? out.substr(0, 77) + "..." : out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writing

SafetensorsWriter::SafetensorsWriter(std::string path, std::string temp_path,
                                     std::map<std::string, Slot> slots,
                                     std::vector<std::string> layout,
                                     std::map<std::string, std::string> metadata, bool checksums)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      slots_(std::move(slots)),
      layout_(std::move(layout)),
      metadata_(std::move(metadata)),
      checksums_(checksums) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<Entry>& entries,
    const std::map<std::string, std::string>& metadata, const SafetensorsWriteOptions& options) {
  const std::string where = absl::StrCat("safetensors writer for '", path, "': ");
  std::map<std::string, Slot> slots;
  for (const Entry& entry : entries) {
    const std::string tensor = absl::StrCat(where, "tensor '", entry.name, "': ");
    if (entry.name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor, "the name is reserved for the header's metadata; rename the tensor"));
    }
    const DtypeSpec* spec = FindDtype(entry.dtype);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(tensor, "dtype ", c10::toString(entry.dtype),
                                                     " is not supported; convert it to one of ",
                                                     kSupportedDtypes));
    }
    Slot slot{entry};
    if (!ByteSize(entry.shape, spec->size, &slot.bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor, "shape ", ShapeString(entry.shape),
          " has a negative size or more bytes than fit in 64 bits; expected sizes >= 0"));
    }
    if (!slots.emplace(entry.name, std::move(slot)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor, "the name appears twice; each tensor needs a unique name"));
    }
  }

  // The reference writer's layout: by dtype (kDtypes order), then by name (slots is sorted).
  std::vector<std::string> layout;
  for (const auto& [name, slot] : slots) layout.push_back(name);
  std::stable_sort(layout.begin(), layout.end(), [&](const std::string& a, const std::string& b) {
    return FindDtype(slots.at(a).entry.dtype) < FindDtype(slots.at(b).entry.dtype);
  });
  int64_t offset = 0;
  for (const std::string& name : layout) {
    Slot& slot = slots.at(name);
    slot.data_offset = offset;
    offset += slot.bytes;
  }
  if (options.checksums) {
    for (const auto& [key, value] : metadata) {
      if (absl::StartsWith(key, kChecksumMetadataPrefix)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "metadata key \"", key, "\" starts with \"", kChecksumMetadataPrefix,
            "\", which the writer's checksums use; rename it, or write without checksums"));
      }
    }
  }

  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter(
      path, TempPathFor(path), std::move(slots), std::move(layout), metadata, options.checksums));
  // The checksums are not known yet: same-width placeholders, overwritten by Finish.
  const std::string header = writer->Header(/*final=*/false);
  if (header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "the header would be ", header.size(), " bytes, over the format's limit of ",
        kMaxHeaderBytes, "; split the tensors into shards"));
  }
  writer->data_start_ = 8 + static_cast<int64_t>(header.size());
  CT_ASSIGN_OR_RETURN(writer->fd_, CreateTemp(writer->temp_path_));
  // Owns fd and the temporary file from here: an error below removes both.
  uint64_t length = header.size();
  char length_bytes[8];
  std::memcpy(length_bytes, &length, 8);
  CT_RETURN_IF_ERROR(WriteAt(writer->fd_, length_bytes, 8, 0, path));
  CT_RETURN_IF_ERROR(
      WriteAt(writer->fd_, header.data(), static_cast<int64_t>(header.size()), 8, path));
  return writer;
}

std::string SafetensorsWriter::Header(bool final) const {
  std::map<std::string, std::string> metadata = metadata_;
  if (checksums_) {
    for (const auto& [name, slot] : slots_) {
      metadata[kChecksumMetadataPrefix + name] = Crc32cHex(final ? slot.crc32c : 0);
    }
  }
  std::string header = "{";
  if (!metadata.empty()) {
    absl::StrAppend(&header, JsonQuote(kMetadataKey), ":{",
                    absl::StrJoin(metadata, ",",
                                  [](std::string* out, const auto& kv) {
                                    absl::StrAppend(out, JsonQuote(kv.first), ":",
                                                    JsonQuote(kv.second));
                                  }),
                    "}");
  }
  for (const std::string& name : layout_) {
    const Slot& slot = slots_.at(name);
    absl::StrAppend(&header, header.size() > 1 ? "," : "", JsonQuote(name), ":{\"dtype\":\"",
                    FindDtype(slot.entry.dtype)->name, "\",\"shape\":[",
                    absl::StrJoin(slot.entry.shape, ","), "],\"data_offsets\":[", slot.data_offset,
                    ",", slot.data_offset + slot.bytes, "]}");
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

absl::Status SafetensorsWriter::Append(const std::string& name, const at::Tensor& tensor) {
  const std::string where =
      absl::StrCat("safetensors writer for '", path_, "': tensor '", name, "': ");
  auto it = slots_.find(name);
  if (it == slots_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "no entry of that name was declared in Create (", slots_.size(), " were)"));
  }
  Slot& slot = it->second;
  if (fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat(where, "Finish was already called"));
  if (slot.written) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "already appended; append each tensor once"));
  }
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "the tensor is undefined"));
  }
  if (tensor.scalar_type() != slot.entry.dtype ||
      tensor.sizes() != at::IntArrayRef(slot.entry.shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "got dtype ", c10::toString(tensor.scalar_type()), " shape ",
                     ShapeString(tensor.sizes().vec()), ", but the entry declared dtype ",
                     c10::toString(slot.entry.dtype), " shape ", ShapeString(slot.entry.shape)));
  }
  CT_ASSIGN_OR_RETURN(at::Tensor bytes,
                      CatchTorch([&] { return tensor.to(at::kCPU).contiguous(); }));
  const char* data = static_cast<const char*>(bytes.data_ptr());
  if (checksums_) slot.crc32c = Crc32c(data, static_cast<size_t>(slot.bytes));
  CT_RETURN_IF_ERROR(WriteAt(fd_, data, slot.bytes, data_start_ + slot.data_offset, path_));
  slot.written = true;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  const std::string where = absl::StrCat("safetensors writer for '", path_, "': ");
  if (fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat(where, "Finish was already called"));
  for (const auto& [name, slot] : slots_) {
    if (!slot.written) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, "tensor '", name, "' was declared but never appended; Append it before Finish"));
    }
  }
  if (checksums_) {
    const std::string header = Header(/*final=*/true);
    if (static_cast<int64_t>(header.size()) != data_start_ - 8) {
      return absl::InternalError(absl::StrCat(where, "the header with checksums is ", header.size(),
                                              " bytes, but ", data_start_ - 8,
                                              " were reserved for it"));
    }
    CT_RETURN_IF_ERROR(WriteAt(fd_, header.data(), static_cast<int64_t>(header.size()), 8, path_));
  }
  const int fd = fd_;
  fd_ = -1;  // CommitTemp closes it, and removes the temporary file if it fails
  return CommitTemp(fd, temp_path_, path_);
}

absl::StatusOr<uint32_t> SafetensorsWriter::Crc32cOf(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end() || !it->second.written || !checksums_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "safetensors writer for '", path_, "': no checksum of tensor '", name, "' ",
        !checksums_ ? "(written without checksums)" : "(not declared, or not appended yet)"));
  }
  return it->second.crc32c;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const SafetensorsWriteOptions& options) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer for '", path, "': tensor '", name, "' is undefined"));
    }
    entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  CT_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(path, entries, metadata, options));
  for (const auto& [name, tensor] : tensors) CT_RETURN_IF_ERROR(writer->Append(name, tensor));
  return writer->Finish();
}

// ---------------------------------------------------------------------------------------------
// Reading

struct SafetensorsFile::Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address != nullptr) ::munmap(address, size);
  }
};

namespace {

// Checks one tensor entry of a header; `where` names the file and the tensor.
absl::StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& where, const JsonValue& entry,
                                                 int64_t data_size) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "the entry is ", Render(entry),
                     ", expected an object with \"dtype\", \"shape\" and \"data_offsets\""));
  }
  auto field = [&](const char* name, JsonValue::Kind kind,
                   absl::string_view expected) -> absl::StatusOr<const JsonValue*> {
    const JsonValue* value = entry.Find(name);
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "missing field \"", name, "\", expected ", expected));
    }
    if (value->kind != kind) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "field \"", name, "\" is ", Render(*value), ", expected ", expected));
    }
    return value;
  };
  SafetensorsTensorInfo info;
  CT_ASSIGN_OR_RETURN(const JsonValue* dtype,
                      field("dtype", JsonValue::Kind::kString, "a dtype string such as \"F32\""));
  const DtypeSpec* spec = FindDtype(dtype->string);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, "field \"dtype\" is ", Render(*dtype),
                                                   ", which is not supported; expected one of ",
                                                   kSupportedDtypes));
  }
  info.dtype = spec->type;

  constexpr char kShapeExpected[] = "an array of non-negative integers";
  CT_ASSIGN_OR_RETURN(const JsonValue* shape,
                      field("shape", JsonValue::Kind::kArray, kShapeExpected));
  for (const JsonValue& dim : shape->values) {
    if (!dim.is_integer() || dim.integer < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, "field \"shape\" is ", Render(*shape),
                                                     ", expected ", kShapeExpected));
    }
    info.shape.push_back(dim.integer);
  }

  constexpr char kOffsetsExpected[] = "[begin, end] with 0 <= begin <= end";
  CT_ASSIGN_OR_RETURN(const JsonValue* offsets,
                      field("data_offsets", JsonValue::Kind::kArray, kOffsetsExpected));
  const std::vector<JsonValue>& pair = offsets->values;
  if (pair.size() != 2 || !pair[0].is_integer() || !pair[1].is_integer() || pair[0].integer < 0 ||
      pair[0].integer > pair[1].integer) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "field \"data_offsets\" is ", Render(*offsets), ", expected ", kOffsetsExpected));
  }
  info.begin = pair[0].integer;
  info.end = pair[1].integer;
  if (info.end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "field \"data_offsets\" is ", Render(*offsets),
                     ", but the data after the header is ", data_size,
                     " bytes: expected end <= ", data_size, " (is the file truncated?)"));
  }
  int64_t bytes = 0;
  if (!ByteSize(info.shape, spec->size, &bytes) || bytes != info.end - info.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "field \"data_offsets\" is ", Render(*offsets), " (", info.end - info.begin,
        " bytes), but shape ", ShapeString(info.shape), " of ", spec->name, " (", spec->size,
        " bytes each) needs ", bytes, " bytes; expected end - begin to match the shape"));
  }
  return info;
}

absl::Status ParseMetadata(const std::string& where, const JsonValue& value,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "\"__metadata__\" is ", Render(value),
                                                   ", expected an object of strings"));
  }
  for (size_t i = 0; i < value.keys.size(); ++i) {
    if (!value.values[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "\"__metadata__\" key ", JsonQuote(value.keys[i]), " is ", Render(value.values[i]),
          ", expected a string (metadata maps strings to strings)"));
    }
    (*metadata)[value.keys[i]] = value.values[i].string;
  }
  return absl::OkStatus();
}

// Moves the checksum entries of `metadata` ("crc32c.<tensor>": 8 hex digits) into `crc32c`,
// checking that each names a tensor of the file and holds a checksum.
absl::Status TakeChecksums(const std::string& where,
                           const std::map<std::string, SafetensorsTensorInfo>& infos,
                           std::map<std::string, std::string>& metadata,
                           std::map<std::string, uint32_t>& crc32c) {
  for (auto it = metadata.begin(); it != metadata.end();) {
    if (!absl::StartsWith(it->first, kChecksumMetadataPrefix)) {
      ++it;
      continue;
    }
    const std::string tensor = it->first.substr(sizeof(kChecksumMetadataPrefix) - 1);
    if (infos.count(tensor) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "\"__metadata__\" key ", JsonQuote(it->first), " is the checksum of tensor '",
          tensor, "', which the file does not hold: the header is damaged"));
    }
    const std::optional<uint32_t> value = ParseCrc32cHex(it->second);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "\"__metadata__\" key ", JsonQuote(it->first), " is ",
                       JsonQuote(it->second), ", expected 8 hex digits: the header is damaged"));
    }
    crc32c[tensor] = *value;
    it = metadata.erase(it);
  }
  return absl::OkStatus();
}

// Checks that the tensors' byte ranges, sorted, tile the data exactly; returns the names in
// that order.
absl::StatusOr<std::vector<std::string>> NamesByOffset(
    const std::string& where, const std::map<std::string, SafetensorsTensorInfo>& infos,
    int64_t data_size) {
  std::vector<std::pair<const std::string*, const SafetensorsTensorInfo*>> sorted;
  for (const auto& [name, info] : infos) sorted.emplace_back(&name, &info);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end, *a.first) <
           std::tie(b.second->begin, b.second->end, *b.first);
  });
  std::vector<std::string> names;
  int64_t covered = 0;
  for (const auto& [name, info] : sorted) {
    const std::string range = absl::StrCat("data_offsets [", info->begin, ", ", info->end, "]");
    const std::string before =
        names.empty() ? "the data starts at 0"
                      : absl::StrCat("the previous tensor '", names.back(), "' ends at ", covered);
    if (info->begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "tensor '", *name, "' has ", range, ", but ", before, ": bytes [", covered, ", ",
          info->begin, ") belong to no tensor; expected contiguous tensors without gaps"));
    }
    if (info->begin < covered) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "tensor '", *name, "' has ", range, ", but ", before,
                       ": the ranges overlap; expected each byte in one tensor"));
    }
    covered = info->end;
    names.push_back(*name);
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "the tensors end at data offset ", covered, ", but the data after the header is ",
        data_size, " bytes: expected the tensors to cover it exactly"));
  }
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const std::string where = absl::StrCat("safetensors file '", path, "': ");
  // O_NONBLOCK: a FIFO in the file's place is refused below instead of blocking this open.
  ScopedFd fd{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  struct stat st;
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open safetensors file '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "not a regular file (", S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket",
        "); expected the safetensors file itself"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "the file is ", file_size,
        " bytes, shorter than the 8-byte header length that starts a safetensors file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = std::make_shared<Mapping>();
  void* address = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (address == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot map safetensors file '", path, "'"));
  }
  file->mapping_->address = address;
  file->mapping_->size = file_size;
  const char* base = static_cast<const char*>(address);

  uint64_t header_size = 0;
  std::memcpy(&header_size, base, 8);
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "the header length is ", header_size, " bytes, over the limit of ",
                     kMaxHeaderBytes, ": expected a smaller header (is this a safetensors file?)"));
  }
  if (header_size > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "the header length is ", header_size, " bytes, but only ", file_size - 8,
        " bytes follow it: expected the header inside the file (is the file truncated?)"));
  }
  const absl::string_view header(base + 8, header_size);
  if (header.empty() || header[0] != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "the header does not start with '{', expected a JSON object"));
  }
  absl::StatusOr<JsonValue> root = checkpoint_internal::ParseJson(header);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "header: ", root.status().message()));
  }
  const int64_t data_size = static_cast<int64_t>(file_size - 8 - header_size);
  file->data_ = base + 8 + header_size;

  for (size_t i = 0; i < root->keys.size(); ++i) {
    const std::string& key = root->keys[i];
    const JsonValue& value = root->values[i];
    if (key == kMetadataKey) {
      CT_RETURN_IF_ERROR(ParseMetadata(where, value, &file->metadata_));
      continue;
    }
    CT_ASSIGN_OR_RETURN(file->infos_[key],
                        ParseEntry(absl::StrCat(where, "tensor '", key, "': "), value, data_size));
  }

  CT_ASSIGN_OR_RETURN(file->names_, NamesByOffset(where, file->infos_, data_size));
  CT_RETURN_IF_ERROR(TakeChecksums(where, file->infos_, file->metadata_, file->stored_crc32c_));
  return file;
}

absl::StatusOr<std::optional<uint32_t>> SafetensorsFile::StoredCrc32c(
    const std::string& name) const {
  CT_RETURN_IF_ERROR(Find(name).status());
  auto it = stored_crc32c_.find(name);
  if (it == stored_crc32c_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<uint32_t> SafetensorsFile::ComputeCrc32c(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  constexpr int64_t kPieceBytes = int64_t{8} << 20;
  uint32_t crc = 0;
  for (int64_t at = info->begin; at < info->end; at += kPieceBytes) {
    const int64_t n = std::min(kPieceBytes, info->end - at);
    crc = Crc32cExtend(crc, data_ + at, static_cast<size_t>(n));
    ReleaseRange(at, at + n);
  }
  return crc;
}

absl::Status SafetensorsFile::VerifyCrc32c(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(std::optional<uint32_t> stored, StoredCrc32c(name));
  if (!stored.has_value()) return absl::OkStatus();
  CT_ASSIGN_OR_RETURN(uint32_t computed, ComputeCrc32c(name));
  if (computed == *stored) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("safetensors file '", path_, "': tensor '", name,
                                          "': checksum mismatch: expected crc32c ",
                                          Crc32cHex(*stored), ", computed ", Crc32cHex(computed),
                                          ": the file was damaged after it was written"));
}

absl::StatusOr<const SafetensorsTensorInfo*> SafetensorsFile::Find(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors file '", path_, "' has no tensor '", name,
                                            "' (it holds ", infos_.size(), " tensors)"));
  }
  return &it->second;
}

absl::StatusOr<SafetensorsTensorInfo> SafetensorsFile::Info(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  return *info;
}

at::Tensor SafetensorsFile::View(at::ScalarType dtype, const std::vector<int64_t>& shape,
                                 int64_t begin, bool copy) const {
  const char* bytes = data_ + begin;
  const at::TensorOptions options = at::TensorOptions().dtype(dtype);
  const size_t element_size = c10::elementSize(dtype);
  if (copy || reinterpret_cast<uintptr_t>(bytes) % element_size != 0) {
    at::Tensor owned = at::empty(shape, options);
    // An empty tensor's data_ptr() is null, which memcpy must not get even for 0 bytes.
    if (owned.numel() > 0) std::memcpy(owned.data_ptr(), bytes, owned.numel() * element_size);
    return owned;
  }
  std::shared_ptr<Mapping> keep_alive = mapping_;
  return at::from_blob(
      const_cast<char*>(bytes), shape, [keep_alive](void*) {}, options);
}

absl::StatusOr<at::Tensor> SafetensorsFile::Get(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  return CatchTorch([&] { return View(info->dtype, info->shape, info->begin, /*copy=*/false); });
}

absl::StatusOr<at::Tensor> SafetensorsFile::GetCopy(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  return CatchTorch([&] { return View(info->dtype, info->shape, info->begin, /*copy=*/true); });
}

absl::StatusOr<at::Tensor> SafetensorsFile::GetSlice(const std::string& name, int64_t dim0_begin,
                                                     int64_t dim0_end) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  const std::string where = absl::StrCat("safetensors file '", path_, "': tensor '", name, "': ");
  if (info->shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "GetSlice needs at least one dimension, but the tensor is 0-d; use Get"));
  }
  if (dim0_begin < 0 || dim0_begin > dim0_end || dim0_end > info->shape[0]) {
    return absl::OutOfRangeError(absl::StrCat(where, "rows [", dim0_begin, ", ", dim0_end,
                                              ") of shape ", ShapeString(info->shape),
                                              ": expected 0 <= begin <= end <= ", info->shape[0]));
  }
  std::vector<int64_t> shape = info->shape;
  shape[0] = 1;
  int64_t row_bytes = 0;
  ByteSize(shape, c10::elementSize(info->dtype), &row_bytes);  // fits: the whole tensor did
  shape[0] = dim0_end - dim0_begin;
  return CatchTorch([&] {
    return View(info->dtype, shape, info->begin + dim0_begin * row_bytes, /*copy=*/false);
  });
}

void SafetensorsFile::ReleasePages(const std::string& name) const {
  auto it = infos_.find(name);
  if (it != infos_.end()) ReleaseRange(it->second.begin, it->second.end);
}

void SafetensorsFile::ReleaseRange(int64_t begin, int64_t end) const {
  if (end <= begin) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data_ + begin) & ~(page - 1);
  const uintptr_t last = reinterpret_cast<uintptr_t>(data_ + end);
  // Read-only private file pages: dropping them loses nothing (best effort, errors ignored).
  (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// ---------------------------------------------------------------------------------------------
// Model directories

absl::Status WriteSafetensorsIndex(const std::string& dir,
                                   const std::map<std::string, std::string>& weight_map,
                                   int64_t total_size) {
  if (total_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors index in '", dir, "': total_size is ", total_size,
                     ", expected the tensors' total byte count (>= 0)"));
  }
  std::string json = absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", total_size,
                                  "\n  },\n  \"weight_map\": {");
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    absl::StrAppend(&json, it == weight_map.begin() ? "\n" : ",\n", "    ", JsonQuote(it->first),
                    ": ", JsonQuote(it->second));
  }
  json += weight_map.empty() ? "}\n}\n" : "\n  }\n}\n";
  return WriteFileAtomically(absl::StrCat(dir, "/", kSafetensorsIndexFileName), json);
}

absl::StatusOr<std::unique_ptr<SafetensorsModelDir>> SafetensorsModelDir::Open(
    const std::string& dir) {
  std::unique_ptr<SafetensorsModelDir> model(new SafetensorsModelDir());
  model->dir_ = dir;
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexFileName);
  const std::string single_path = absl::StrCat(dir, "/", kSafetensorsFileName);
  if (::access(index_path.c_str(), F_OK) != 0) {
    if (::access(single_path.c_str(), F_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("model directory '", dir, "' holds neither ",
                                              kSafetensorsIndexFileName, " nor ",
                                              kSafetensorsFileName));
    }
    CT_ASSIGN_OR_RETURN(const std::string checked,
                        CheckpointFilePath(dir, kSafetensorsFileName, FileLinks::kFollow));
    CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(checked));
    for (const std::string& name : file->names()) model->file_of_[name] = file.get();
    model->files_.push_back(std::move(file));
    return model;
  }

  const std::string where = absl::StrCat("safetensors index '", index_path, "': ");
  CT_ASSIGN_OR_RETURN(std::string text,
                      ReadCheckpointFile(dir, kSafetensorsIndexFileName, FileLinks::kFollow));
  absl::StatusOr<JsonValue> root = checkpoint_internal::ParseJson(text);
  if (!root.ok()) return absl::InvalidArgumentError(absl::StrCat(where, root.status().message()));
  const JsonValue* weight_map = root->is_object() ? root->Find("weight_map") : nullptr;
  if (weight_map == nullptr || !weight_map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "expected an object with a \"weight_map\" object of tensor name to shard file"));
  }
  std::map<std::string, const SafetensorsFile*> shards;
  for (size_t i = 0; i < weight_map->keys.size(); ++i) {
    const std::string& name = weight_map->keys[i];
    const JsonValue& shard = weight_map->values[i];
    if (!shard.is_string() || shard.string.empty() || shard.string.find('/') != std::string::npos ||
        shard.string == "." || shard.string == "..") {
      return absl::InvalidArgumentError(absl::StrCat(where, "weight_map[\"", name, "\"] is ",
                                                     Render(shard), ", expected a file name in '",
                                                     dir, "' (no '/')"));
    }
    const SafetensorsFile*& file = shards[shard.string];
    if (file == nullptr) {
      // Links are followed: the Hub's cache links each file to ../../blobs/<hash>.
      absl::StatusOr<std::string> checked =
          CheckpointFilePath(dir, shard.string, FileLinks::kFollow);
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
          checked.ok() ? SafetensorsFile::Open(*checked)
                       : absl::StatusOr<std::unique_ptr<SafetensorsFile>>(checked.status());
      if (!opened.ok()) {
        return absl::Status(opened.status().code(), absl::StrCat(where, "shard for tensor '", name,
                                                                 "': ", opened.status().message()));
      }
      file = opened->get();
      model->files_.push_back(std::move(opened).value());
    }
    if (!file->Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "maps tensor '", name, "' to '",
                                                     shard.string, "', which does not hold it"));
    }
    model->file_of_[name] = file;
  }
  for (const auto& [shard_name, file] : shards) {
    for (const std::string& name : file->names()) {
      auto it = model->file_of_.find(name);
      if (it == model->file_of_.end() || it->second != file) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "shard '", shard_name, "' holds tensor '", name,
            "', which the weight_map does not map to it; expected every shard tensor listed once"));
      }
    }
  }
  return model;
}

std::vector<std::string> SafetensorsModelDir::names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  return names;
}

absl::StatusOr<const SafetensorsFile*> SafetensorsModelDir::FileOf(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    return absl::NotFoundError(absl::StrCat("model directory '", dir_, "' has no tensor '", name,
                                            "' (it holds ", file_of_.size(), " tensors)"));
  }
  return it->second;
}

absl::StatusOr<SafetensorsTensorInfo> SafetensorsModelDir::Info(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Info(name);
}

absl::StatusOr<at::Tensor> SafetensorsModelDir::Get(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Get(name);
}

absl::StatusOr<at::Tensor> SafetensorsModelDir::GetCopy(const std::string& name) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->GetCopy(name);
}

absl::StatusOr<at::Tensor> SafetensorsModelDir::GetSlice(const std::string& name,
                                                         int64_t dim0_begin,
                                                         int64_t dim0_end) const {
  CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->GetSlice(name, dim0_begin, dim0_end);
}

}  // namespace cpptrain
