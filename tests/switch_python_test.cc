// The C API and the Python module (python/ptcfs_switch.py over
// libptcfs_switch.so) under /usr/bin/python3 with torch: switches bit-exact
// against the synthetic reference with ranks as library threads, as Python
// threads through the exchange callback, and as gloo processes; errors named.
// The checks themselves are python/test_ptcfs_switch.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;

bool HaveTorch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

TEST(SwitchPython, ModuleSwitchesBitExact) {
  if (!HaveTorch()) {
    if (InCi()) FAIL() << "/usr/bin/python3 has no torch (Debian python3-torch)";
    GTEST_SKIP() << "/usr/bin/python3 has no torch";
  }
  auto [rc, out] = Sh(std::string(PTCFS_SWITCH_PRELOAD) + "/usr/bin/python3 " + PTCFS_SOURCE_DIR +
                      "/python/test_ptcfs_switch.py " + PTCFS_SWITCH_LIB + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("all passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace ptc
