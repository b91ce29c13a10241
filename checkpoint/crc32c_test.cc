#include "checkpoint/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cpptrain {
namespace {

using crc32c_internal::ExtendHardware;
using crc32c_internal::ExtendPortable;
using crc32c_internal::HardwareAvailable;

// Published check values: the CRC catalogue's "check" (the CRC of "123456789") and the
// examples of RFC 3720 (iSCSI), appendix B.4.
struct Published {
  std::string name;
  std::string bytes;
  uint32_t crc;
};

std::vector<Published> PublishedValues() {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  return {
      {"empty", "", 0x00000000},
      {"check 123456789", "123456789", 0xE3069283},
      {"32 zero bytes", std::string(32, '\0'), 0x8A9136AA},
      {"32 bytes of 0xff", std::string(32, '\xff'), 0x62A8AB43},
      {"32 ascending bytes", ascending, 0x46DD794E},
      {"32 descending bytes", descending, 0x113FDB5C},
  };
}

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  for (const Published& p : PublishedValues()) {
    EXPECT_EQ(Crc32c(p.bytes), p.crc) << p.name;
    EXPECT_EQ(ExtendPortable(0, p.bytes.data(), p.bytes.size()), p.crc) << p.name;
    if (HardwareAvailable()) {
      EXPECT_EQ(ExtendHardware(0, p.bytes.data(), p.bytes.size()), p.crc) << p.name;
    }
  }
}

// Random lengths and starting offsets (every alignment), both implementations, and a split
// at every point of a short buffer: Extend of the second part continues the first.
TEST(Crc32cTest, ImplementationsAgreeAndExtendContinues) {
  std::mt19937 rng(7);
  std::string buffer(4096 + 64, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  for (int trial = 0; trial < 500; ++trial) {
    const size_t offset = rng() % 16;
    const size_t size = rng() % 4096;
    const char* data = buffer.data() + offset;
    const uint32_t portable = ExtendPortable(0, data, size);
    if (HardwareAvailable()) EXPECT_EQ(ExtendHardware(0, data, size), portable) << size;
    EXPECT_EQ(Crc32c(data, size), portable);
  }
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = Crc32c(text);
  for (size_t split = 0; split <= text.size(); ++split) {
    EXPECT_EQ(Crc32cExtend(Crc32c(text.data(), split), text.data() + split, text.size() - split),
              whole)
        << split;
  }
}

TEST(Crc32cTest, DetectsEveryFlippedBitOfABuffer) {
  std::string bytes(64, 'x');
  const uint32_t clean = Crc32c(bytes);
  for (size_t i = 0; i < bytes.size() * 8; ++i) {
    std::string flipped = bytes;
    flipped[i / 8] = static_cast<char>(flipped[i / 8] ^ (1 << (i % 8)));
    EXPECT_NE(Crc32c(flipped), clean) << "bit " << i;
  }
}

TEST(Crc32cTest, HexRoundTrips) {
  EXPECT_EQ(Crc32cHex(0xE3069283), "e3069283");
  EXPECT_EQ(Crc32cHex(0x0000000a), "0000000a");
  EXPECT_EQ(ParseCrc32cHex("e3069283"), 0xE3069283u);
  EXPECT_EQ(ParseCrc32cHex("E3069283"), 0xE3069283u);
  EXPECT_EQ(ParseCrc32cHex("0000000a"), 0x0000000Au);
  EXPECT_FALSE(ParseCrc32cHex("e306928").has_value());
  EXPECT_FALSE(ParseCrc32cHex("e30692830").has_value());
  EXPECT_FALSE(ParseCrc32cHex("e306928g").has_value());
  EXPECT_FALSE(ParseCrc32cHex("").has_value());
}

}  // namespace
}  // namespace cpptrain
