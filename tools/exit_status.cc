// What every command does at its edges: the standard descriptors, usage
// errors on one line, and a standard output that could not be written.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tools/commands.h"

namespace ptcfs {

void KeepStandardDescriptorsOpen() {
  // A descriptor 0-2 closed by the caller would be the next file ptcfs opens
  // (a shard, the lock), and printf would write into it. /dev/null read-only
  // in its place: reads see nothing, writes fail (EBADF) and are reported.
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0 && null_fd != fd) {
      dup2(null_fd, fd);
      close(null_fd);
    }
  }
}

std::string CommandName(const CLI::App& app, int argc, char** argv) {
  std::string name = "ptcfs";
  const CLI::App* at = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::string word = argv[i];
    const auto subs = at->get_subcommands([&](const CLI::App* s) { return s->check_name(word); });
    if (subs.empty()) break;
    name += " " + subs.front()->get_name();
    at = subs.front();
  }
  return name;
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return ptc::Printable(text);  // an argument's other control bytes escaped
}

int FinishStandardOutput(const std::string& command, int exit_code) {
  // An output larger than stdio's buffer may have failed on an earlier flush, whose
  // errno is gone (and what fflush then says varies): a write of nothing still says
  // EBADF for the read-only /dev/null in place of a closed stdout
  // (KeepStandardDescriptorsOpen); else the final flush's errno, else EIO.
  const bool failed_before = std::ferror(stdout);
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return exit_code;
  int err = failed_before ? 0 : errno;
  if (err == 0 && ::write(STDOUT_FILENO, "", 0) < 0) err = errno;
  if (err == 0) err = EIO;
  std::fprintf(stderr, "%s: writing standard output: %s\n", command.c_str(), std::strerror(err));
  return exit_code == 0 ? 1 : exit_code;
}

}  // namespace ptcfs
