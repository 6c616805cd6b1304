// Reading shard bytes and checking their block checksums.
#include "ptc/store/shard_verify.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "ptc/store/h5shard.h"
#include "ptc/store/rank_files.h"

namespace ptc {
namespace {

// Verification reads with pread in chunks that stay in the CPU cache between
// the copy and the hash: cheaper than mapping a few MiB per checked block.
constexpr size_t kVerifyChunk = 256 << 10;

std::string ShardLabel(const ShardRecord& s) {
  std::string boxes;
  for (const Box& b : s.boxes) boxes += (boxes.empty() ? "" : " ") + b.ToString();
  return "tensor '" + s.tensor + "' boxes " + boxes + " in " + s.file;
}

// The one check that [offset, offset + n) lies within the shard; `what` names the access.
Status CheckShardRange(const ShardRecord& s, std::string_view what, uint64_t offset, uint64_t n) {
  if (offset > s.nbytes || n > s.nbytes - offset) {
    return InvalidArgumentError(ShardLabel(s) + ": " + std::string(what) + " of " + std::to_string(n) + " bytes at " +
                                std::to_string(offset) + " leaves the shard of " + std::to_string(s.nbytes) + " bytes");
  }
  return Status::OK();
}

// Compares block `block` of the shard with its checksum in the manifest.
Status CheckBlock(const ShardRecord& s, size_t block, uint64_t got) {
  const uint64_t want = BlockChecksum(s, block);
  if (got == want) return Status::OK();
  std::string where = ShardLabel(s) + ": checksum ";
  if (BlockCount(s) > 1) {
    where += "of block " + std::to_string(block) + " (bytes " + std::to_string(BlockBegin(s, block)) + "-" +
             std::to_string(BlockEnd(s, block)) + ") ";
  }
  return CorruptionError(where + ChecksumToString(got) + " != " + ChecksumToString(want) + " in the manifest");
}

}  // namespace

Status ReadShardBytes(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset_in_shard, size_t n,
                      void* dst) {
  PTC_RETURN_IF_ERROR(CheckShardRange(shard, "read", offset_in_shard, n));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(store.AbsPath(shard.file)));
  return file->Read(shard.offset + offset_in_shard, n, dst);
}

namespace {
// Shards smaller than this are read with pread: a mapping costs more.
constexpr uint64_t kMapMin = 256 << 10;
constexpr size_t kMapWindow = 8 << 20;
}  // namespace

VerifyingShardReader::VerifyingShardReader(const ShardRecord& shard, std::unique_ptr<RandomAccessFile> file,
                                           size_t block)
    : shard_(shard),
      file_(std::move(file)),
      hasher_(BlockBegin(shard, block), shard.nbytes),
      pos_(BlockBegin(shard, block)),
      hashed_(!file_->VerifiesBlocks()),
      mappable_(file_->fd() >= 0 && shard.nbytes >= kMapMin && file_->Size() >= shard.offset + shard.nbytes) {}

VerifyingShardReader::~VerifyingShardReader() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

Result<std::unique_ptr<VerifyingShardReader>> VerifyingShardReader::Open(Env* env, const Store& store,
                                                                         const ShardRecord& shard, size_t block) {
  if (block >= BlockCount(shard)) {
    return InvalidArgumentError(ShardLabel(shard) + ": no checksum block " + std::to_string(block));
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(store.AbsPath(shard.file)));
  return std::unique_ptr<VerifyingShardReader>(new VerifyingShardReader(shard, std::move(file), block));
}

Status VerifyingShardReader::Consume(const char* p, size_t n) {
  pos_ += n;
  if (!hashed_) return Status::OK();  // checked as the file read it
  return hasher_.Update(p, n, [this](size_t block, uint64_t digest) { return CheckBlock(shard_, block, digest); });
}

Status VerifyingShardReader::Read(size_t n, void* dst) {
  PTC_RETURN_IF_ERROR(CheckShardRange(shard_, "read", position(), n));
  Status s = file_->Read(shard_.offset + position(), n, dst);
  if (s.code() == Code::kCorruption) return CorruptionError(ShardLabel(shard_) + ": " + s.message());
  PTC_RETURN_IF_ERROR(s);
  return Consume(static_cast<const char*>(dst), n);
}

// Maps the window of the file that holds the next n bytes of the shard.
bool VerifyingShardReader::MapWindow(size_t n) {
  const uint64_t at = shard_.offset + position();
  if (map_ != nullptr && at >= map_begin_ && at + n <= map_begin_ + map_len_) return true;
  if (map_ != nullptr) ::munmap(map_, map_len_);
  map_ = nullptr;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = at / page * page;
  const uint64_t end =
      std::min<uint64_t>(shard_.offset + shard_.nbytes, std::max<uint64_t>(begin + kMapWindow, at + n));
  void* p = ::mmap(nullptr, end - begin, PROT_READ, MAP_SHARED | MAP_POPULATE, file_->fd(), static_cast<off_t>(begin));
  if (p == MAP_FAILED) {
    mappable_ = false;
    return false;
  }
  map_ = static_cast<char*>(p);
  map_begin_ = begin;
  map_len_ = end - begin;
  return true;
}

Result<const char*> VerifyingShardReader::Next(size_t n, char* scratch) {
  PTC_RETURN_IF_ERROR(CheckShardRange(shard_, "read", position(), n));
  if (!mappable_ || !MapWindow(n)) {
    PTC_RETURN_IF_ERROR(Read(n, scratch));
    return scratch;
  }
  const char* p = map_ + (shard_.offset + position() - map_begin_);
  PTC_RETURN_IF_ERROR(Consume(p, n));
  return p;
}

Status VerifyingShardReader::Finish() {
  if (position() != shard_.nbytes) {
    return CorruptionError(ShardLabel(shard_) + ": checksum not verified, " + std::to_string(position()) + " of " +
                           std::to_string(shard_.nbytes) + " bytes read");
  }
  if (shard_.nbytes == 0 && hashed_) return CheckBlock(shard_, 0, hasher_.PartialDigest());  // the one empty block
  return Status::OK();
}

Status VerifyShardRange(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset, uint64_t n) {
  PTC_RETURN_IF_ERROR(CheckShardRange(shard, "range", offset, n));
  if (n == 0 && shard.nbytes > 0) return Status::OK();
  const size_t first = BlockOf(shard, offset);
  const uint64_t end = n == 0 ? 0 : BlockEnd(shard, BlockOf(shard, offset + n - 1));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<VerifyingShardReader> reader,
                       VerifyingShardReader::Open(env, store, shard, first));
  const size_t chunk = std::min<uint64_t>(kVerifyChunk, std::max<uint64_t>(end - reader->position(), 1));
  auto buf = std::make_unique_for_overwrite<char[]>(chunk);
  while (reader->position() < end) {
    PTC_RETURN_IF_ERROR(reader->Read(std::min<uint64_t>(chunk, end - reader->position()), buf.get()));
  }
  return end == shard.nbytes ? reader->Finish() : Status::OK();
}

namespace {

// Hashes bytes [begin, end) of the shard in `file` (begin: a block's first
// byte; end: a block's end) with `hasher`, from a read-only mapping. False when
// the file cannot be mapped (no descriptor, shorter than the range, mmap
// fails): the caller reads the bytes instead.
bool HashMapped(const RandomAccessFile& file, const ShardRecord& shard, uint64_t begin, uint64_t end,
                BlockHasher* hasher, const BlockHasher::BlockDone& done, Status* result) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (file.fd() < 0 || end == begin || file.Size() < shard.offset + end) return false;
  const uint64_t map_begin = (shard.offset + begin) / page * page, map_len = shard.offset + end - map_begin;
  void* p = ::mmap(nullptr, map_len, PROT_READ, MAP_SHARED, file.fd(), static_cast<off_t>(map_begin));
  if (p == MAP_FAILED) return false;
  *result = hasher->Update(static_cast<const char*>(p) + (shard.offset + begin - map_begin), end - begin, done);
  ::munmap(p, map_len);
  return true;
}

// As HashMapped, with RandomAccessFile::Read in chunks.
Status HashRead(const RandomAccessFile& file, const ShardRecord& shard, uint64_t begin, uint64_t end,
                BlockHasher* hasher, const BlockHasher::BlockDone& done) {
  const size_t chunk = std::min<uint64_t>(kVerifyChunk, std::max<uint64_t>(end - begin, 1));
  auto buf = std::make_unique_for_overwrite<char[]>(chunk);
  for (uint64_t pos = begin; pos < end; pos += chunk) {
    const size_t take = std::min<uint64_t>(chunk, end - pos);
    Status s = file.Read(shard.offset + pos, take, buf.get());
    if (s.code() == Code::kCorruption) return CorruptionError(ShardLabel(shard) + ": " + s.message());
    PTC_RETURN_IF_ERROR(s);
    PTC_RETURN_IF_ERROR(hasher->Update(buf.get(), take, done));
  }
  return Status::OK();
}

}  // namespace

Status VerifyShardRangeInFile(const RandomAccessFile& file, const ShardRecord& shard, uint64_t offset, uint64_t n) {
  PTC_RETURN_IF_ERROR(CheckShardRange(shard, "range", offset, n));
  if (file.VerifiesBlocks()) return Status::OK();  // its reads are checked
  if (n == 0 && shard.nbytes > 0) return Status::OK();
  const uint64_t begin = n == 0 ? 0 : BlockBegin(shard, BlockOf(shard, offset));
  const uint64_t end = n == 0 ? 0 : BlockEnd(shard, BlockOf(shard, offset + n - 1));
  BlockHasher hasher(begin, shard.nbytes);
  auto done = [&](size_t block, uint64_t digest) { return CheckBlock(shard, block, digest); };
  Status s;
  if (!HashMapped(file, shard, begin, end, &hasher, done, &s)) s = HashRead(file, shard, begin, end, &hasher, done);
  PTC_RETURN_IF_ERROR(s);
  if (shard.nbytes == 0) return CheckBlock(shard, 0, hasher.PartialDigest());  // the one empty block
  return Status::OK();
}

Status VerifyShard(Env* env, const Store& store, const ShardRecord& shard) {
  return VerifyShardRange(env, store, shard, 0, shard.nbytes);
}

std::vector<const ShardRecord*> DistinctPieces(const GenerationManifest& m) {
  std::set<std::tuple<std::string_view, uint64_t, uint64_t>> seen;
  std::vector<const ShardRecord*> out;
  for (const ShardRecord& s : m.shards) {
    if (seen.emplace(s.file, s.offset, s.nbytes).second) out.push_back(&s);
  }
  return out;
}

Status VerifyGeneration(const Store& store, const GenerationManifest& m, bool check_hdf5) {
  const auto by_name = TensorsByName(m);
  for (const ShardRecord* s : DistinctPieces(m)) {
    PTC_RETURN_IF_ERROR(VerifyShard(store.env(), store, *s));
    const auto found = by_name.find(s->tensor);
    const TensorRecord* t = found == by_name.end() ? nullptr : found->second;
    if (check_hdf5 && t != nullptr)
      PTC_RETURN_IF_ERROR(CheckH5Shard(store.AbsPath(s->h5.empty() ? s->file : s->h5), *s, t->dtype));
  }
  for (const ShardRecord& copy : CopyRecords(m)) {
    PTC_RETURN_IF_ERROR(VerifyShard(store.env(), store, copy), "a copy in a rank file");
  }
  return Status::OK();
}

}  // namespace ptc
