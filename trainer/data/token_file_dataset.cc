#include "trainer/data/token_file_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
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
  ScopedFd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
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
  // The descriptor stays open for the dataset's reads (pread: no shared offset between the
  // loader's threads, and a file cut short is a short read, not a SIGBUS as with a mapping).
  auto dataset = std::shared_ptr<TokenFileDataset>(
      new TokenFileDataset(path, width, seq_len, fd.fd, bytes, num_tokens));
  fd.fd = -1;
  dataset->metadata_ = std::move(meta);
  return dataset;
}

TokenFileDataset::TokenFileDataset(std::string path, TokenWidth width, int64_t seq_len, int fd,
                                   int64_t opened_bytes, int64_t num_tokens)
    : path_(std::move(path)),
      width_(width),
      seq_len_(seq_len),
      fd_(fd),
      opened_bytes_(opened_bytes),
      num_tokens_(num_tokens) {}

TokenFileDataset::~TokenFileDataset() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t TokenFileDataset::size() const { return num_tokens_ / seq_len_; }

absl::Status TokenFileDataset::Read(int64_t offset, int64_t count, const std::string& what,
                                    unsigned char* out) const {
  int64_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(count - done), offset + done);
    if (n > 0) {
      done += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(errno, path_, "read");
    struct stat st;
    const std::string now = ::fstat(fd_, &st) == 0 ? absl::StrCat(st.st_size) : "fewer";
    return absl::DataLossError(absl::StrCat(
        "token file ", path_, " was truncated while in use: ", what, " needs bytes [", offset,
        ", ", offset + count, "), but the file now holds ", now, " bytes (", opened_bytes_,
        " bytes when it was opened). Something rewrote it in place; restore it, or write a new "
        "file beside it and rename it over the old one (WriteTokenFile does), which a running "
        "job keeps reading as it was"));
  }
  return absl::OkStatus();
}

namespace {

// Token i of `data`, little-endian.
int64_t Decode(const unsigned char* data, int64_t i, int64_t width) {
  const unsigned char* p = data + i * width;
  int64_t token = 0;
  for (int64_t b = 0; b < width; ++b) token |= static_cast<int64_t>(p[b]) << (8 * b);
  return token;
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
  // One pass over the samples' tokens, in chunks: the largest token, the first at or above
  // vocab_size, and whether every odd 16-bit word is 0.
  const int64_t width = TokenWidthBytes(width_);
  const int64_t n = size() * seq_len_;
  constexpr int64_t kChunkTokens = 1 << 18;
  std::vector<unsigned char> buffer(static_cast<size_t>(std::min(n, kChunkTokens) * width));
  int64_t max = 0;
  int64_t first = -1;
  bool odd_words_zero = true;
  for (int64_t begin = 0; begin < n; begin += kChunkTokens) {
    const int64_t count = std::min(kChunkTokens, n - begin);
    CT_RETURN_IF_ERROR(Read(begin * width, count * width,
                            absl::StrCat("checking tokens ", begin, " to ", begin + count),
                            buffer.data()));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t token = Decode(buffer.data(), i, width);
      if (token >= vocab_size && first < 0) first = begin + i;
      max = std::max(max, token);
      // begin is even, so begin + i is odd exactly when i is.
      if (i % 2 == 1 && token != 0) odd_words_zero = false;
    }
  }
  if (first >= 0) {
    std::vector<unsigned char> bytes(static_cast<size_t>(width));
    CT_RETURN_IF_ERROR(Read(first * width, width, "the first offending token", bytes.data()));
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path_, ": token ", Decode(bytes.data(), 0, width), " at byte offset ",
        first * width, " (token ", first, ") is not below the model's vocab_size ", vocab_size,
        " (largest token in the file: ", max,
        "): the file was tokenized for another vocabulary, or data.token_dtype (",
        TokenWidthName(width_), ") is not the file's"));
  }
  // uint32 ids read as uint16: the high halves are the odd words, all zero when every id is
  // below 65536. A real uint16 corpus has no such pattern, so with enough words (and no
  // metadata, which would have named the dtype) this is the wrong width, not the data.
  constexpr int64_t kMinWordsForWidthGuess = 64;
  if (width_ == TokenWidth::kUint16 && !metadata_.has_value() && n >= kMinWordsForWidthGuess &&
      odd_words_zero && max > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path_, " is read as token_dtype UINT16, but every second one of the ", n,
        " 16-bit words in its samples is 0: it looks like uint32 token ids (each one's high half 0). If it is, "
        "set data.token_dtype: UINT32; write a ", TokenFileMetadataPath(path_),
        " with its dtype to make the file's width explicit"));
  }
  return absl::OkStatus();
}

Example TokenFileDataset::Get(int64_t index) const {
  Example example;
  if (index < 0 || index >= size()) return example;
  const int64_t width = TokenWidthBytes(width_);
  std::vector<unsigned char> bytes(static_cast<size_t>(seq_len_ * width));
  const absl::Status read =
      Read(index * seq_len_ * width, seq_len_ * width, absl::StrCat("sample ", index), bytes.data());
  // Dataset::Get has no status: the loader turns this c10::Error into its status (CatchTorch).
  TORCH_CHECK(read.ok(), std::string(read.message()));
  example.inputs = at::empty({seq_len_}, at::kLong);
  int64_t* out = example.inputs.data_ptr<int64_t>();
  for (int64_t i = 0; i < seq_len_; ++i) out[i] = Decode(bytes.data(), i, width);
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
