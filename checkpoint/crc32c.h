// CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78, initial value and final
// XOR 0xFFFFFFFF), the checksum of iSCSI, ext4 and SSE4.2's crc32 instruction. Checkpoints
// store one per tensor (checkpoint/checkpoint.h) and verify it on load.
//
//   uint32_t crc = Crc32c(data, size);                          // crc32c("123456789") = e3069283
//   uint32_t both = Crc32cExtend(Crc32c(a, n), b, m);           // == Crc32c of a then b
//   std::string text = Crc32cHex(crc);                          // "e3069283"
//
// On x86-64 processors with SSE4.2 it uses the crc32 instruction; elsewhere a slicing-by-8
// table (8 bytes per step). Both give the same values (crc32c_test checks one against the
// other).
#ifndef CPPTRAIN_CHECKPOINT_CRC32C_H_
#define CPPTRAIN_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace cpptrain {

// The CRC-32C of the bytes whose CRC-32C is `crc`, followed by `data[0, size)`. Extending 0
// starts a new checksum.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }
inline uint32_t Crc32c(absl::string_view bytes) { return Crc32c(bytes.data(), bytes.size()); }

// Eight lowercase hex digits, most significant first: how checksums are written in
// safetensors metadata and shown by tools/ckpt.
std::string Crc32cHex(uint32_t crc);

// The value of exactly eight hex digits (either case); nullopt for anything else.
std::optional<uint32_t> ParseCrc32cHex(absl::string_view text);

namespace crc32c_internal {

// The two implementations, for tests and measurements; Crc32cExtend picks one.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size);
// Only where HardwareAvailable().
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size);
bool HardwareAvailable();

}  // namespace crc32c_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_CRC32C_H_
