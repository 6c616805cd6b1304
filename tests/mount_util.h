// Helpers of the tests that mount for real: a mount that is always unmounted
// (also when the test fails), the status document, config writes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptc::testing {

// The command prefix that runs what follows as nobody (uid and gid 65534). The
// checkout may sit under a directory only root may enter (a clone in /root,
// bench/newcomer.sh's mktemp -d), where the ptcfs of a build with shared layers
// (the sanitizer builds) cannot open its libraries as nobody: they are copied
// into DIR/nobody-lib, found first through LD_LIBRARY_PATH. DIR must be one
// nobody may enter. A static build has none to copy.
inline std::string AsNobody(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path lib = dir / "nobody-lib";
  fs::create_directories(lib);
  fs::permissions(lib, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  const std::string build = fs::path(PTCFS_BINARY).parent_path().parent_path().string() + "/";
  std::istringstream lines(Sh("ldd " + std::string(PTCFS_BINARY)).second);
  for (std::string line; std::getline(lines, line);) {
    const size_t arrow = line.find("=> ");
    if (arrow == std::string::npos) continue;
    const std::string path = line.substr(arrow + 3, line.find(' ', arrow + 3) - arrow - 3);
    if (path.rfind(build, 0) != 0) continue;  // the system's libraries nobody can read
    const fs::path copy = lib / fs::path(path).filename();
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    fs::permissions(copy, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  }
  return "env LD_LIBRARY_PATH=" + lib.string() + " setpriv --reuid=65534 --regid=65534 --clear-groups ";
}

// Exits the test binary with 77 (ctest: skipped) when FUSE cannot be used;
// under CI (CI=true) it fails instead: a green run that mounted nothing
// proves nothing (InCi, test_util.h).
inline void RequireFuse() {
  if (access("/dev/fuse", R_OK | W_OK) != 0) {
    std::printf("%s: /dev/fuse is not usable here (FUSE mount tests need it, and root)\n", InCi() ? "FAIL" : "SKIP");
    std::exit(InCi() ? 1 : 77);
  }
}

// A mounted store; unmounted by the destructor whatever happened.
class Mount {
 public:
  Mount(const std::string& store, const std::string& dir, const std::string& extra = "") : dir_(dir) {
    std::filesystem::create_directories(dir);
    auto [code, out] = Ptcfs("mount " + extra + " " + store + " " + dir);
    mounted_ = code == 0;
    EXPECT_EQ(code, 0) << out;
  }
  // `ptcfs umount` returns once the daemon has exited (its store free again).
  ~Mount() {
    if (mounted_) Ptcfs("umount " + dir_);
  }
  Mount(const Mount&) = delete;
  Mount& operator=(const Mount&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

inline nlohmann::json MountStatus(const std::string& mnt) {
  return nlohmann::json::parse(Slurp(mnt + "/.ptcfs/status"));
}

// Writes `text` into .ptcfs/config; returns the errno of the write (0: accepted).
inline int WriteConfig(const std::string& mnt, const std::string& text) {
  int fd = open((mnt + "/.ptcfs/config").c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) return errno;
  ssize_t n = write(fd, text.data(), text.size());
  int err = n < 0 ? errno : 0;
  close(fd);
  return err;
}

// Waits until the mount serves (a rewrite committed); fails the test when it failed.
inline void WaitServing(const std::string& mnt) {
  for (int i = 0; i < 600; ++i) {
    auto s = MountStatus(mnt);
    if (s["state"] == "serving") return;
    ASSERT_NE(s["state"], "failed") << s.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL() << "reconfiguration did not finish";
}

}  // namespace ptc::testing
