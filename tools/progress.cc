#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ptcfs {
namespace {

bool ProgressEnabled() {
  if (const char* env = std::getenv("PTCFS_PROGRESS")) return std::strcmp(env, "0") != 0;
  return isatty(STDERR_FILENO) == 1;
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

Progress::Progress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      enabled_(ProgressEnabled()),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (!enabled_) return;
  Draw(true);
  std::fputc('\n', stderr);
}

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (!mu_.TryLock()) return;  // another thread is deciding: this update shows in its line
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(200)) {
    mu_.Unlock();
    return;
  }
  last_draw_ = now;
  drawn_ = true;
  mu_.Unlock();
  Draw(false);
}

void Progress::Draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const uint64_t done = done_.load();
  const double rate = secs > 0 ? done / secs : 0;
  const double pct = total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0;
  char eta[32] = "";
  if (!final && rate > 0 && total_ > done) std::snprintf(eta, sizeof(eta), "  ETA %.0fs", (total_ - done) / rate);
  std::fprintf(stderr, "\r%s  %s / %s  %5.1f%%  %s/s%s\033[K", label_.c_str(), HumanBytes(done).c_str(),
               HumanBytes(total_).c_str(), pct, HumanBytes(static_cast<uint64_t>(rate)).c_str(), eta);
  std::fflush(stderr);
}

}  // namespace ptcfs
