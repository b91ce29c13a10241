#include "trainer/data/token_file_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cpptrain {
namespace {

absl::Status FileError(int error_number, const std::string& path, absl::string_view action) {
  if (error_number == ENOENT && action == "create") {
    return absl::NotFoundError(absl::StrCat("cannot create token file ", path,
                                            ": its directory does not exist: create it first"));
  }
  if (error_number == ENOENT) {
    return absl::NotFoundError(absl::StrCat(
        "token file ", path, " does not exist: check the path (DataSpec.train_file / eval_file)"));
  }
  return absl::UnavailableError(absl::StrCat("cannot ", action, " token file ", path, ": ",
                                             std::strerror(error_number),
                                             ": check the path and its permissions"));
}

// Closes the descriptor on every return path.
struct ScopedFd {
  int fd;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t MaxToken(TokenWidth width) {
  return width == TokenWidth::kUint16 ? 0xFFFFull : 0xFFFFFFFFull;
}

}  // namespace

int64_t TokenWidthBytes(TokenWidth width) { return width == TokenWidth::kUint16 ? 2 : 4; }

absl::string_view TokenWidthName(TokenWidth width) {
  return width == TokenWidth::kUint16 ? "UINT16" : "UINT32";
}

absl::StatusOr<std::shared_ptr<TokenFileDataset>> TokenFileDataset::Open(const std::string& path,
                                                                         TokenWidth width,
                                                                         int64_t seq_len) {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len is ", seq_len, " for token file ", path,
                                                   ": it must be a positive token count"));
  }
  CT_ASSIGN_OR_RETURN(std::optional<TokenFileMetadata> meta,
                      ReadTokenFileMetadata(TokenFileMetadataPath(path)));
  const std::string dtype = absl::AsciiStrToLower(TokenWidthName(width));
  if (meta.has_value() && meta->dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": its metadata ", meta->path, " has dtype \"",
                     meta->dtype, "\" but the data is read as token_dtype ", TokenWidthName(width),
                     ": set data.token_dtype: ", absl::AsciiStrToUpper(meta->dtype)));
  }
  const ScopedFd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return FileError(errno, path, "open");
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) return FileError(errno, path, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " is not a regular file: point the path at a .bin token file"));
  }
  const int64_t bytes = static_cast<int64_t>(st.st_size);
  const int64_t token_bytes = TokenWidthBytes(width);
  if (bytes % token_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " has ", bytes, " bytes, not a multiple of ", token_bytes,
        " (token_dtype ", TokenWidthName(width), "): the file is truncated or the dtype is wrong"));
  }
  const int64_t num_tokens = bytes / token_bytes;
  if (meta.has_value() && meta->num_tokens != num_tokens) {
    return absl::DataLossError(
        absl::StrCat("token file ", path, " holds ", num_tokens, " tokens but its metadata ",
                     meta->path, " has num_tokens ", meta->num_tokens,
                     ": the file was truncated or rewritten after tokenizing; tokenize it again"));
  }
  if (num_tokens < seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " holds ", num_tokens,
                                                   " tokens, so the dataset is ",
                                                   "shorter than one sample of seq_len ", seq_len,
                                                   ": use a larger file or a smaller seq_len"));
  }
  // The mapping stays valid after the descriptor is closed.
  void* mapping = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd.fd, 0);
  if (mapping == MAP_FAILED) return FileError(errno, path, "memory-map");
  auto dataset = std::shared_ptr<TokenFileDataset>(
      new TokenFileDataset(path, width, seq_len, mapping, static_cast<size_t>(bytes), num_tokens));
  dataset->metadata_ = std::move(meta);
  return dataset;
}

TokenFileDataset::TokenFileDataset(std::string path, TokenWidth width, int64_t seq_len,
                                   const void* data, size_t mapped_bytes, int64_t num_tokens)
    : path_(std::move(path)),
      width_(width),
      seq_len_(seq_len),
      data_(static_cast<const unsigned char*>(data)),
      mapped_bytes_(mapped_bytes),
      num_tokens_(num_tokens) {}

TokenFileDataset::~TokenFileDataset() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
}

int64_t TokenFileDataset::size() const { return num_tokens_ / seq_len_; }

int64_t TokenFileDataset::TokenAt(int64_t position) const {
  const unsigned char* p = data_ + position * TokenWidthBytes(width_);
  if (width_ == TokenWidth::kUint16) {
    return static_cast<int64_t>(p[0]) | static_cast<int64_t>(p[1]) << 8;
  }
  return static_cast<int64_t>(p[0]) | static_cast<int64_t>(p[1]) << 8 |
         static_cast<int64_t>(p[2]) << 16 | static_cast<int64_t>(p[3]) << 24;
}

namespace {

// The largest of `n` little-endian tokens of type T at `data` (memcpy per element: the
// mapping need not be aligned; compilers vectorize the loop on little-endian hosts).
template <typename T>
uint64_t MaxOf(const unsigned char* data, int64_t n) {
  T max = 0;
  for (int64_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, data + i * sizeof(T), sizeof(T));
    max = value > max ? value : max;
  }
  return max;
}

}  // namespace

absl::Status TokenFileDataset::CheckTokensBelow(int64_t vocab_size) const {
  if (metadata_.has_value() && metadata_->vocab_size > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path_, ": its metadata ", metadata_->path, " has vocab_size ",
        metadata_->vocab_size, " but the model's vocab_size is ", vocab_size,
        ": the file was tokenized for a larger vocabulary; use a model with vocab_size >= ",
        metadata_->vocab_size, " or tokenize with the model's tokenizer"));
  }
  const int64_t n = size() * seq_len_;
  const uint64_t max = width_ == TokenWidth::kUint16 ? MaxOf<uint16_t>(data_, n)
                                                     : MaxOf<uint32_t>(data_, n);
  if (max < static_cast<uint64_t>(vocab_size)) return absl::OkStatus();
  int64_t first = 0;
  while (first < n && TokenAt(first) < vocab_size) ++first;
  return absl::InvalidArgumentError(absl::StrCat(
      "token file ", path_, ": token ", TokenAt(first), " at byte offset ",
      first * TokenWidthBytes(width_), " (token ", first, ") is not below the model's vocab_size ",
      vocab_size, " (largest token in the file: ", max,
      "): the file was tokenized for another vocabulary, or data.token_dtype (",
      TokenWidthName(width_), ") is not the file's"));
}

Example TokenFileDataset::Get(int64_t index) const {
  Example example;
  if (index < 0 || index >= size()) return example;
  example.inputs = at::empty({seq_len_}, at::kLong);
  int64_t* out = example.inputs.data_ptr<int64_t>();
  const int64_t begin = index * seq_len_;
  for (int64_t i = 0; i < seq_len_; ++i) out[i] = TokenAt(begin + i);
  return example;
}

absl::Status WriteTokenFile(const std::string& path, const std::vector<int64_t>& tokens,
                            TokenWidth width) {
  const uint64_t max_token = MaxToken(width);
  std::vector<unsigned char> bytes;
  const int64_t token_bytes = TokenWidthBytes(width);
  bytes.reserve(tokens.size() * token_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t token = tokens[i];
    if (token < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", token, " at position ", i, " for token file ", path,
          " is negative: token ids are vocabulary indices; check the tokenizer output"));
    }
    if (static_cast<uint64_t>(token) > max_token) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", token, " at position ", i, " for token file ", path,
          " does not fit token_dtype ", TokenWidthName(width), " (0..", max_token, "): ",
          width == TokenWidth::kUint16 ? "use token_dtype UINT32 for vocabularies above 65536"
                                       : "check the tokenizer output"));
    }
    for (int64_t b = 0; b < token_bytes; ++b) {
      bytes.push_back(static_cast<unsigned char>((static_cast<uint64_t>(token) >> (8 * b)) & 0xFF));
    }
  }
  // Written beside the target and renamed over it, so a dataset mapping the old file keeps
  // reading the old contents instead of faulting on a truncated mapping.
  const std::string temp_path = absl::StrCat(path, ".tmp");
  std::FILE* file = std::fopen(temp_path.c_str(), "wb");
  if (file == nullptr) return FileError(errno, path, "create");
  const size_t written = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), file);
  const bool close_failed = std::fclose(file) != 0;
  if (written != bytes.size() || close_failed) {
    std::remove(temp_path.c_str());
    return absl::DataLossError(absl::StrCat("wrote ", written, " of ", bytes.size(),
                                            " bytes to token file ", temp_path,
                                            ": check free disk space and permissions"));
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    std::remove(temp_path.c_str());
    return FileError(error_number, path, "replace");
  }
  return absl::OkStatus();
}

}  // namespace cpptrain
