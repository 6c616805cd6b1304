// Bytes as hex text (ptc/base/hex.h), as manifests and a cluster's parts
// carry small binary values: every byte round-trips; only lower-case digit
// pairs are read back, anything else refused naming the field and position.
#include "ptc/base/hex.h"

#include <gtest/gtest.h>

#include <string>

namespace ptc {
namespace {

TEST(Hex, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string text = Hex(all);
  EXPECT_EQ(text.substr(0, 8), "00010203");
  EXPECT_EQ(text.substr(text.size() - 4), "feff");
  auto back = Unhex(text, "field");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, all);
  EXPECT_EQ(Hex(""), "");
  EXPECT_EQ(*Unhex("", "field"), "");
}

TEST(Hex, RefusesWhatIsNotLowerCaseDigitPairs) {
  EXPECT_EQ(Unhex("abc", "extra.value").status().message(), "extra.value: odd hex length");
  for (const char* bad : {"0g", "AB", "-f", " 1", "+1", "0x"}) {
    auto r = Unhex(std::string("00") + bad, "extra.value");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(), "extra.value: not hex at 2") << bad;
  }
}

}  // namespace
}  // namespace ptc
