// examples/hotspa_switch.py: a small Llama trained on 4 gloo processes with
// each length group in its own layout (parameters and accumulated gradients
// switched through the CPU executor) gives the same losses as the same loop
// in one layout. Needs /usr/bin/python3 with torch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;

TEST(SwitchExample, SameLossesWithAndWithoutSwitching) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    if (InCi()) FAIL() << "/usr/bin/python3 has no torch (Debian python3-torch)";
    GTEST_SKIP() << "/usr/bin/python3 has no torch";
  }
  auto [rc, out] = Sh(std::string(PTCFS_SWITCH_PRELOAD) + "/usr/bin/python3 " + PTCFS_SOURCE_DIR +
                      "/examples/hotspa_switch.py --lib " + PTCFS_SWITCH_LIB + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\nsame losses\n"), std::string::npos) << out;  // and the loss went down
  EXPECT_NE(out.find("tp=2,dp=2"), std::string::npos) << out;
}

}  // namespace
}  // namespace ptc
