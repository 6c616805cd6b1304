#include "ptc/base/checksum.h"

#include "ptc/base/crc32.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <utility>

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

namespace {

// The one walk over a stream's blocks: cuts the next n bytes, at stream
// offset *pos of a stream of `size` bytes, at block boundaries; calls
// piece(p, len) for each part within a block and then, when that part ends
// its block, end(block index). Stops at the first error `end` returns.
template <typename Piece, typename End>
Status WalkBlocks(uint64_t* pos, uint64_t size, const char* p, size_t n, Piece&& piece, End&& end) {
  while (n > 0) {
    const uint64_t block_end = std::min(size, (*pos / kChecksumBlockBytes + 1) * kChecksumBlockBytes);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, block_end - *pos));
    piece(p, take);
    *pos += take;
    p += take;
    n -= take;
    if (*pos == block_end) PTC_RETURN_IF_ERROR(end(static_cast<size_t>((*pos - 1) / kChecksumBlockBytes)));
  }
  return Status::OK();
}

// Bytes hashed by one function and then the other: small enough that the
// second reads them from the cache the first brought them into.
constexpr size_t kSliceBytes = 256 << 10;

}  // namespace

BlockHasher::BlockHasher(uint64_t pos, uint64_t size) : pos_(pos), size_(size) {}

Status BlockHasher::Update(const void* data, size_t n, const BlockDone& done) {
  return WalkBlocks(
      &pos_, size_, static_cast<const char*>(data), n, [this](const char* p, size_t len) { block_.Update(p, len); },
      [&](size_t block) {
        const uint64_t digest = block_.Digest();
        block_.Reset();
        return done(block, digest);
      });
}

void BlockCrcs::Update(const void* data, size_t n) {
  (void)WalkBlocks(
      &pos_, BlockHasher::kUnknownSize, static_cast<const char*>(data), n,
      [this](const char* p, size_t len) { crc_ = Crc32(crc_, p, len); },
      [this](size_t) {
        done_.push_back(std::exchange(crc_, 0));
        return Status::OK();
      });
}

std::vector<uint32_t> BlockCrcs::Finish() {
  if (pos_ % kChecksumBlockBytes != 0 || done_.empty()) done_.push_back(crc_);
  return std::move(done_);
}

// One walk, each block's bytes fed to CRC-32 and xxh64 a slice at a time.
void ShardHasher::Update(const void* data, size_t n) {
  auto piece = [this](const char* p, size_t len) {
    for (size_t at = 0; at < len; at += kSliceBytes) {
      const size_t slice = std::min(kSliceBytes, len - at);
      crc_ = Crc32(crc_, p + at, slice);
      block_.Update(p + at, slice);
    }
  };
  (void)WalkBlocks(&pos_, BlockHasher::kUnknownSize, static_cast<const char*>(data), n, piece, [this](size_t) {
    blocks_.push_back(block_.Digest());
    block_.Reset();
    crcs_.push_back(std::exchange(crc_, 0));
    return Status::OK();
  });
}

ShardDigest ShardHasher::Finish() {
  if (pos_ % kChecksumBlockBytes != 0 || blocks_.empty()) {  // the last block, short (or of nothing)
    blocks_.push_back(block_.Digest());
    crcs_.push_back(crc_);
  }
  ShardDigest d;
  d.crc32s = std::move(crcs_);
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

// Up to 16 hex digits; false when one is not hex.
bool ParseHex(std::string_view digits, uint64_t* value) {
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

// A list of block values (xxh64s, CRC-32s) as one string of lower-case hex,
// 2 * sizeof(T) digits each, and back; `what` names one value in errors.
template <typename T>
std::string HexListToString(const std::vector<T>& values) {
  constexpr int kDigits = 2 * sizeof(T);
  std::string out;
  out.reserve(kDigits * values.size());
  char buf[20];
  for (T v : values) {
    std::snprintf(buf, sizeof buf, "%0*llx", kDigits, static_cast<unsigned long long>(v));
    out += buf;
  }
  return out;
}

template <typename T>
Result<std::vector<T>> ParseHexList(std::string_view text, std::string_view what) {
  constexpr size_t kDigits = 2 * sizeof(T);
  const std::string digits = std::to_string(kDigits);
  if (text.size() % kDigits != 0) {
    return InvalidArgumentError(std::string(what) + "s of " + std::to_string(text.size()) + " characters (expected " +
                                digits + " hex digits per block)");
  }
  std::vector<T> values(text.size() / kDigits);
  for (size_t i = 0; i < values.size(); ++i) {
    uint64_t value = 0;
    if (!ParseHex(text.substr(kDigits * i, kDigits), &value)) {
      return InvalidArgumentError(std::string(what) + " " + std::to_string(i) + " '" +
                                  std::string(text.substr(kDigits * i, kDigits)) + "' is not " + digits +
                                  " hex digits");
    }
    values[i] = static_cast<T>(value);
  }
  return values;
}

}  // namespace

Result<uint64_t> ParseChecksum(std::string_view text) {
  constexpr std::string_view kPrefix = "xxh64:";
  uint64_t value = 0;
  if (text.size() != kPrefix.size() + 16 || text.substr(0, kPrefix.size()) != kPrefix ||
      !ParseHex(text.substr(kPrefix.size()), &value)) {
    return InvalidArgumentError("bad checksum '" + std::string(text) + "' (expected \"xxh64:\" and 16 hex digits)");
  }
  return value;
}

std::string BlockChecksumsToString(const std::vector<uint64_t>& blocks) { return HexListToString(blocks); }

Result<std::vector<uint64_t>> ParseBlockChecksums(std::string_view text) {
  return ParseHexList<uint64_t>(text, "block checksum");
}

std::string BlockCrc32sToString(const std::vector<uint32_t>& crcs) { return HexListToString(crcs); }

Result<std::vector<uint32_t>> ParseBlockCrc32s(std::string_view text) {
  return ParseHexList<uint32_t>(text, "block CRC-32");
}

}  // namespace ptc
