// The manifest fuzzers' shared trick (fuzz/manifest_fuzzer.cc, fuzz/manifest_parse_fuzzer.cc):
// nearly every mutation of manifest.pb breaks its trailing CRC-32C, so each input is also tried
// with that checksum rewritten to match the rest of the bytes, which takes it past the check to
// the parser and to what trusts the parsed message.
//
//   const std::string bytes = cpptrain::fuzz::WithFixedChecksum(data, size);
#ifndef CPPTRAIN_FUZZ_MANIFEST_BYTES_H_
#define CPPTRAIN_FUZZ_MANIFEST_BYTES_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "checkpoint/crc32c.h"

namespace cpptrain {
namespace fuzz {

// Field 15 (manifest_crc32c), fixed32: the tag ManifestBytes appends before the checksum.
inline constexpr unsigned char kChecksumTag = 0x7d;

// The bytes with their trailing manifest checksum (if any) replaced by one that matches.
inline std::string WithFixedChecksum(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= 5 && static_cast<unsigned char>(bytes[bytes.size() - 5]) == kChecksumTag) {
    bytes.resize(bytes.size() - 5);
  }
  const uint32_t crc = Crc32c(bytes);
  bytes.push_back(static_cast<char>(kChecksumTag));
  char value[4];
  std::memcpy(value, &crc, 4);
  bytes.append(value, 4);
  return bytes;
}

}  // namespace fuzz
}  // namespace cpptrain

#endif  // CPPTRAIN_FUZZ_MANIFEST_BYTES_H_
