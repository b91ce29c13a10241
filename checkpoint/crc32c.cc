#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#include "absl/strings/str_format.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CPPTRAIN_CRC32C_X86 1
#endif

namespace cpptrain {
namespace crc32c_internal {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78;

// kTables[0][b]: the CRC register after shifting in byte b alone (LSB first). kTables[k][b]:
// the same byte followed by k zero bytes, so eight table lookups advance the register by
// eight bytes at once (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kReflectedPolynomial : 0);
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint32_t Load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian hosts only (the checkpoint code asserts it)
}

}  // namespace

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t r = ~crc;
  for (; size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --size, ++p) {
    r = (r >> 8) ^ kTables[0][(r ^ *p) & 0xFF];
  }
  for (; size >= 8; size -= 8, p += 8) {
    const uint32_t lo = Load32(p) ^ r;
    const uint32_t hi = Load32(p + 4);
    r = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
        kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
  }
  for (; size > 0; --size, ++p) r = (r >> 8) ^ kTables[0][(r ^ *p) & 0xFF];
  return ~r;
}

#ifdef CPPTRAIN_CRC32C_X86

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const void* data,
                                                          size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t r = ~crc;
  for (; size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --size, ++p) {
    r = _mm_crc32_u8(static_cast<uint32_t>(r), *p);
  }
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    r = _mm_crc32_u64(r, v);
  }
  for (; size > 0; --size, ++p) r = _mm_crc32_u8(static_cast<uint32_t>(r), *p);
  return ~static_cast<uint32_t>(r);
}

bool HardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

#else

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size) {
  return ExtendPortable(crc, data, size);
}

bool HardwareAvailable() { return false; }

#endif

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  return crc32c_internal::HardwareAvailable() ? crc32c_internal::ExtendHardware(crc, data, size)
                                              : crc32c_internal::ExtendPortable(crc, data, size);
}

std::string Crc32cHex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

std::optional<uint32_t> ParseCrc32cHex(absl::string_view text) {
  if (text.size() != 8) return std::nullopt;
  uint32_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = (value << 4) | static_cast<uint32_t>(digit);
  }
  return value;
}

}  // namespace cpptrain
