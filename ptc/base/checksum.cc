#include "ptc/base/checksum.h"

#include "ptc/base/crc32.h"

#include <xxhash.h>

#include <algorithm>
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

uint64_t CombineBlockChecksums(const std::vector<uint64_t>& blocks) {
  std::string words(8 * blocks.size(), '\0');
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int b = 0; b < 8; ++b) words[8 * i + b] = static_cast<char>(blocks[i] >> (8 * b));
  }
  return Xxh64(words.data(), words.size());
}

BlockHasher::BlockHasher(uint64_t pos, uint64_t size) : pos_(pos), size_(size) {}

Status BlockHasher::Update(const void* data, size_t n, const BlockDone& done) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const uint64_t block_end = std::min(size_, (pos_ / kChecksumBlockBytes + 1) * kChecksumBlockBytes);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, block_end - pos_));
    block_.Update(p, take);
    pos_ += take;
    p += take;
    n -= take;
    if (pos_ == block_end) {
      const uint64_t digest = block_.Digest();
      block_.Reset();
      PTC_RETURN_IF_ERROR(done(static_cast<size_t>((pos_ - 1) / kChecksumBlockBytes), digest));
    }
  }
  return Status::OK();
}

void BlockCrcs::Update(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, kChecksumBlockBytes - pos_ % kChecksumBlockBytes));
    crc_ = Crc32(crc_, p, take);
    pos_ += take;
    p += take;
    n -= take;
    if (pos_ % kChecksumBlockBytes == 0) {
      done_.push_back(crc_);
      crc_ = 0;
    }
  }
}

std::vector<uint32_t> BlockCrcs::Finish() {
  if (pos_ % kChecksumBlockBytes != 0 || done_.empty()) done_.push_back(crc_);
  return std::move(done_);
}

void ShardHasher::Update(const void* data, size_t n) {
  crcs_.Update(data, n);
  (void)hasher_.Update(data, n, [this](size_t, uint64_t digest) {
    blocks_.push_back(digest);
    return Status::OK();
  });
}

ShardDigest ShardHasher::Finish() {
  if (hasher_.InBlock() || blocks_.empty()) blocks_.push_back(hasher_.PartialDigest());
  ShardDigest d;
  d.crc32s = crcs_.Finish();
  if (blocks_.size() == 1) {
    d.checksum = blocks_[0];  // one block: the checksum of the bytes, no block list
    return d;
  }
  d.checksum = CombineBlockChecksums(blocks_);
  d.blocks = std::move(blocks_);
  return d;
}

std::string ChecksumToString(uint64_t checksum) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh64:%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

namespace {

// 16 hex digits; false when one is not hex.
bool ParseHex16(std::string_view digits, uint64_t* value) {
  *value = 0;
  for (char c : digits) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
    if (digit < 0) return false;
    *value = *value << 4 | static_cast<uint64_t>(digit);
  }
  return true;
}

}  // namespace

Result<uint64_t> ParseChecksum(std::string_view text) {
  constexpr std::string_view kPrefix = "xxh64:";
  uint64_t value = 0;
  if (text.size() != kPrefix.size() + 16 || text.substr(0, kPrefix.size()) != kPrefix ||
      !ParseHex16(text.substr(kPrefix.size()), &value)) {
    return InvalidArgumentError("bad checksum '" + std::string(text) + "' (expected \"xxh64:\" and 16 hex digits)");
  }
  return value;
}

std::string BlockChecksumsToString(const std::vector<uint64_t>& blocks) {
  std::string out;
  out.reserve(16 * blocks.size());
  char buf[20];
  for (uint64_t b : blocks) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(b));
    out += buf;
  }
  return out;
}

Result<std::vector<uint64_t>> ParseBlockChecksums(std::string_view text) {
  if (text.size() % 16 != 0) {
    return InvalidArgumentError("block checksums of " + std::to_string(text.size()) +
                                " characters (expected 16 hex digits per block)");
  }
  std::vector<uint64_t> blocks(text.size() / 16);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!ParseHex16(text.substr(16 * i, 16), &blocks[i])) {
      return InvalidArgumentError("block checksum " + std::to_string(i) + " '" + std::string(text.substr(16 * i, 16)) +
                                  "' is not 16 hex digits");
    }
  }
  return blocks;
}

std::string BlockCrc32sToString(const std::vector<uint32_t>& crcs) {
  std::string out;
  out.reserve(8 * crcs.size());
  char buf[12];
  for (uint32_t c : crcs) {
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(c));
    out += buf;
  }
  return out;
}

Result<std::vector<uint32_t>> ParseBlockCrc32s(std::string_view text) {
  if (text.size() % 8 != 0) {
    return InvalidArgumentError("block CRC-32s of " + std::to_string(text.size()) +
                                " characters (expected 8 hex digits per block)");
  }
  std::vector<uint32_t> crcs(text.size() / 8);
  for (size_t i = 0; i < crcs.size(); ++i) {
    uint64_t value = 0;
    if (!ParseHex16(text.substr(8 * i, 8), &value)) {
      return InvalidArgumentError("block CRC-32 " + std::to_string(i) + " '" + std::string(text.substr(8 * i, 8)) +
                                  "' is not 8 hex digits");
    }
    crcs[i] = static_cast<uint32_t>(value);
  }
  return crcs;
}

}  // namespace ptc
