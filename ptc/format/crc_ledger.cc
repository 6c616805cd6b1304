#include "ptc/format/crc_ledger.h"

#include <algorithm>
#include <memory>

#include "ptc/base/crc32.h"

namespace ptc {

void CrcLedger::Expect(const std::string& path, const std::vector<ZipEntry>& members) {
  MutexLock lock(&mu_);
  auto [it, first] = archives_.try_emplace(path);
  if (!first) return;
  it->second.members = members;
  std::sort(it->second.members.begin(), it->second.members.end(),
            [](const ZipEntry& a, const ZipEntry& b) { return a.data_offset < b.data_offset; });
}

void CrcLedger::Add(const std::string& path, uint64_t offset, const void* data, size_t n) {
  if (n == 0) return;
  {
    MutexLock lock(&mu_);
    auto a = archives_.find(path);
    if (a == archives_.end() || a->second.verified) return;
    const std::vector<ZipEntry>& members = a->second.members;
    // The last member starting at or before `offset` must hold the whole range.
    auto m = std::upper_bound(members.begin(), members.end(), offset,
                              [](uint64_t at, const ZipEntry& e) { return at < e.data_offset; });
    if (m == members.begin()) return;
    --m;
    if (offset + n > m->data_offset + m->size) return;
    const std::map<uint64_t, Range>& ranges = a->second.ranges;
    auto next = ranges.lower_bound(offset);
    if (next != ranges.end() && next->first < offset + n) return;
    if (next != ranges.begin() && std::prev(next)->first + std::prev(next)->second.size > offset) return;
  }
  const uint32_t crc = Crc32(0, data, n);  // outside the lock: other readers add meanwhile
  MutexLock lock(&mu_);
  std::map<uint64_t, Range>& ranges = archives_.at(path).ranges;
  auto next = ranges.lower_bound(offset);  // checked again: another range may have come
  if (next != ranges.end() && next->first < offset + n) return;
  if (next != ranges.begin() && std::prev(next)->first + std::prev(next)->second.size > offset) return;
  ranges.emplace(offset, Range{n, crc});
}

Result<uint32_t> CrcLedger::MemberCrc(const Archive& archive, const ZipEntry& member, const RandomAccessFile& file,
                                      char* buf) {
  uint32_t crc = 0;
  const uint64_t end = member.data_offset + member.size;
  auto range = archive.ranges.lower_bound(member.data_offset);
  for (uint64_t at = member.data_offset; at < end;) {
    if (range != archive.ranges.end() && range->first == at) {
      crc = Crc32Combine(crc, range->second.crc, range->second.size);
      at += range->second.size;
      ++range;
      continue;
    }
    const uint64_t gap_end = range != archive.ranges.end() && range->first < end ? range->first : end;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(kCrcChunk, gap_end - at));
    PTC_RETURN_IF_ERROR(file.Read(at, take, buf), file.path());
    crc = Crc32(crc, buf, take);
    at += take;
  }
  return crc;
}

Status CrcLedger::Verify(Env* env) {
  std::unique_ptr<char[]> buf;  // not zeroed: every byte used is read first
  MutexLock lock(&mu_);
  for (auto& [path, archive] : archives_) {
    if (archive.verified) continue;
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(path));
    if (!buf) buf.reset(new char[kCrcChunk]);
    for (const ZipEntry& member : archive.members) {
      PTC_ASSIGN_OR_RETURN(const uint32_t crc, MemberCrc(archive, member, *file, buf.get()));
      PTC_RETURN_IF_ERROR(CheckMemberCrc(member, crc, path));
    }
    archive.verified = true;
    archive.ranges.clear();
  }
  return Status::OK();
}

}  // namespace ptc
