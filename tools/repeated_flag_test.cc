#include "tools/repeated_flag.h"

#include <gtest/gtest.h>

namespace cpptrain {
namespace {

TEST(RepeatedFlagTest, TakesEveryOccurrenceInOrderAndLeavesTheRest) {
  std::vector<std::string> storage = {"train", "--set=a=1", "--config=x", "--set", "b=2",
                                      "--set=c.d=\"e f\"", "--other"};
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(storage.size());
  std::vector<std::string> sets = TakeRepeatedFlag("set", argc, argv.data());
  EXPECT_EQ(sets, (std::vector<std::string>{"a=1", "b=2", "c.d=\"e f\""}));
  ASSERT_EQ(argc, 3);
  EXPECT_STREQ(argv[0], "train");
  EXPECT_STREQ(argv[1], "--config=x");
  EXPECT_STREQ(argv[2], "--other");
  EXPECT_EQ(argv[3], nullptr);
}

TEST(RepeatedFlagTest, StopsAtDoubleDash) {
  std::vector<std::string> storage = {"t", "--set=a=1", "--", "--set=b=2"};
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  int argc = 4;
  EXPECT_EQ(TakeRepeatedFlag("set", argc, argv.data()), (std::vector<std::string>{"a=1"}));
  ASSERT_EQ(argc, 3);
  EXPECT_STREQ(argv[2], "--set=b=2");
}

}  // namespace
}  // namespace cpptrain
