#include "ptc/checksum.h"

#include <xxhash.h>

#include <cstdio>

namespace ptc {

uint64_t Xxh64(const void* data, size_t n) { return XXH64(data, n, 0); }

struct Xxh64Stream::State {
  XXH64_state_t* s = XXH64_createState();
  State() { XXH64_reset(s, 0); }
  ~State() { XXH64_freeState(s); }
};

Xxh64Stream::Xxh64Stream() : state_(std::make_unique<State>()) {}
Xxh64Stream::~Xxh64Stream() = default;

void Xxh64Stream::Update(const void* data, size_t n) { XXH64_update(state_->s, data, n); }
uint64_t Xxh64Stream::Digest() const { return XXH64_digest(state_->s); }
void Xxh64Stream::Reset() { XXH64_reset(state_->s, 0); }

std::string ChecksumToString(uint64_t checksum) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh64:%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

Result<uint64_t> ParseChecksum(std::string_view text) {
  constexpr std::string_view kPrefix = "xxh64:";
  auto bad = [&] {
    return InvalidArgumentError("bad checksum '" + std::string(text) + "' (expected \"xxh64:\" and 16 hex digits)");
  };
  if (text.size() != kPrefix.size() + 16 || text.substr(0, kPrefix.size()) != kPrefix) return bad();
  uint64_t value = 0;
  for (char c : text.substr(kPrefix.size())) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return bad();
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace ptc
