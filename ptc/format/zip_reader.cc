// The zip reader: the end records, the central directory and the local
// headers of a stored archive (ReadZipDirectory), and a member's CRC check.
#include "ptc/format/zip_reader.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string_view>

#include "ptc/base/crc32.h"
#include "ptc/format/little_endian.h"
#include "ptc/format/zip_records.h"

namespace ptc {

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  for (const ZipEntry& e : members) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

namespace {

using internal::Get16, internal::Get32, internal::Get64, internal::Quote;
using internal::kCentralSig, internal::kEnd64Sig, internal::kEndSig, internal::kLocalSig, internal::kLocator64Sig;
using internal::kCentralSize, internal::kEnd64Size, internal::kEndSize, internal::kLocalSize;
using internal::kLocator64Size, internal::kZip64ExtraId;

Status Bad(const std::string& what, const std::string& message) { return InvalidArgumentError(what + ": " + message); }

struct EndInfo {
  uint64_t count = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t dir_end = 0;  // where the directory must end: the first end record
  bool zip64 = false;
};

// The end of central directory record (the last one in the final 64 KiB + 22
// bytes whose comment fits), superseded by the ZIP64 end record when a ZIP64
// locator sits right before it.
Result<EndInfo> ReadEnd(const RandomAccessFile& file, const std::string& what) {
  const uint64_t size = file.Size();
  if (size < kEndSize)
    return Bad(what, "not a zip archive: " + std::to_string(size) + " bytes is too short for an end record");
  const uint64_t tail_len = std::min<uint64_t>(size, kEndSize + 0xFFFF);
  std::string tail(tail_len, '\0');
  PTC_RETURN_IF_ERROR(file.Read(size - tail_len, tail_len, tail.data()), what);
  std::optional<uint64_t> at;  // within tail
  for (uint64_t i = tail_len - kEndSize + 1; i-- > 0;) {
    if (Get32(tail.data() + i) == kEndSig && i + kEndSize + Get16(tail.data() + i + 20) <= tail_len) {
      at = i;
      break;
    }
  }
  if (!at)
    return Bad(what, "not a zip archive: no end of central directory record in the last " + std::to_string(tail_len) +
                         " bytes");
  const char* e = tail.data() + *at;
  EndInfo info;
  info.dir_end = size - tail_len + *at;
  const uint16_t disk = Get16(e + 4), cd_disk = Get16(e + 6);
  const uint16_t disk_count = Get16(e + 8);
  info.count = Get16(e + 10);
  info.cd_size = Get32(e + 12);
  info.cd_offset = Get32(e + 16);
  // ZIP64 locator right before the end record?
  if (info.dir_end >= kLocator64Size) {
    char loc[kLocator64Size];
    PTC_RETURN_IF_ERROR(file.Read(info.dir_end - kLocator64Size, kLocator64Size, loc), what);
    if (Get32(loc) == kLocator64Sig) {
      const uint64_t rec_off = Get64(loc + 8);
      if (Get32(loc + 4) != 0 || Get32(loc + 16) > 1)
        return Bad(what, "zip archive spans several disks (ZIP64 locator); not supported");
      const uint64_t loc_off = info.dir_end - kLocator64Size;
      if (rec_off > loc_off || loc_off - rec_off < kEnd64Size)
        return Bad(what, "ZIP64 end record offset " + std::to_string(rec_off) + " in the ZIP64 locator at byte " +
                             std::to_string(loc_off) + " is not before the locator");
      char rec[kEnd64Size];
      PTC_RETURN_IF_ERROR(file.Read(rec_off, kEnd64Size, rec), what);
      if (Get32(rec) != kEnd64Sig)
        return Bad(what, "no ZIP64 end of central directory record at byte " + std::to_string(rec_off) +
                             " (where the ZIP64 locator points)");
      if (Get32(rec + 16) != 0 || Get32(rec + 20) != 0 || Get64(rec + 24) != Get64(rec + 32))
        return Bad(what, "zip archive spans several disks (ZIP64 end record); not supported");
      info.count = Get64(rec + 32);
      info.cd_size = Get64(rec + 40);
      info.cd_offset = Get64(rec + 48);
      info.dir_end = rec_off;
      info.zip64 = true;
      return info;
    }
  }
  if (disk != 0 || cd_disk != 0 || disk_count != info.count)
    return Bad(what, "zip archive spans several disks; not supported");
  return info;
}

// The ZIP64 extra field of a central entry replaces the fields that hold the
// 0xFFFFFFFF sentinel, in the order usize, csize, offset.
Status ApplyZip64Extra(std::string_view extra, uint64_t* usize, uint64_t* csize, uint64_t* offset,
                       const std::string& where) {
  size_t i = 0;
  while (i + 4 <= extra.size()) {
    const uint16_t id = Get16(extra.data() + i), len = Get16(extra.data() + i + 2);
    if (i + 4 + len > extra.size())
      return InvalidArgumentError(where + ": extra field " + std::to_string(id) + " runs past the extra data");
    if (id == kZip64ExtraId) {
      std::string_view d = extra.substr(i + 4, len);
      for (uint64_t* field : {usize, csize, offset}) {
        if (*field != 0xFFFFFFFFu) continue;
        if (d.size() < 8) return InvalidArgumentError(where + ": ZIP64 extra field is too short");
        *field = Get64(d.data());
        d.remove_prefix(8);
      }
    }
    i += 4 + len;
  }
  return Status::OK();
}

}  // namespace

Result<ZipArchive> ReadZipDirectory(const RandomAccessFile& file, const std::string& what) {
  PTC_ASSIGN_OR_RETURN(EndInfo end, ReadEnd(file, what));
  if (end.cd_offset > end.dir_end || end.cd_size > end.dir_end - end.cd_offset)
    return Bad(what, "central directory [" + std::to_string(end.cd_offset) + ", +" + std::to_string(end.cd_size) +
                         ") runs past its end record at byte " + std::to_string(end.dir_end));
  if (end.cd_size > kMaxZipDirectorySize)
    return Bad(what, "central directory of " + std::to_string(end.cd_size) + " bytes exceeds the limit of " +
                         std::to_string(kMaxZipDirectorySize));
  if (end.count > end.cd_size / kCentralSize)
    return Bad(what, "end record claims " + std::to_string(end.count) + " entries, more than a " +
                         std::to_string(end.cd_size) + "-byte central directory holds");
  std::string cd(end.cd_size, '\0');
  PTC_RETURN_IF_ERROR(file.Read(end.cd_offset, cd.size(), cd.data()), what);

  ZipArchive archive;
  archive.zip64 = end.zip64;
  std::set<std::string_view> names;
  size_t at = 0;
  for (uint64_t k = 0; k < end.count; ++k) {
    const std::string where =
        what + ": central directory entry " + std::to_string(k) + " at byte " + std::to_string(end.cd_offset + at);
    if (cd.size() - at < kCentralSize) return InvalidArgumentError(where + " is truncated");
    const char* h = cd.data() + at;
    if (Get32(h) != kCentralSig) return InvalidArgumentError(where + " has a bad signature");
    const uint16_t flags = Get16(h + 8), method = Get16(h + 10);
    uint64_t csize = Get32(h + 20), usize = Get32(h + 24);
    const uint16_t nlen = Get16(h + 28), elen = Get16(h + 30), clen = Get16(h + 32);
    uint64_t offset = Get32(h + 42);
    if (cd.size() - at - kCentralSize < static_cast<size_t>(nlen) + elen + clen)
      return InvalidArgumentError(where + " is truncated (name, extra field or comment)");
    ZipEntry e;
    e.name.assign(h + kCentralSize, nlen);
    e.crc32 = Get32(h + 16);
    e.method = method;
    const std::string member = what + ": member " + Quote(e.name);
    PTC_RETURN_IF_ERROR(
        ApplyZip64Extra(std::string_view(h + kCentralSize + nlen, elen), &usize, &csize, &offset, member));
    at += kCentralSize + nlen + elen + clen;
    if (e.name.empty()) return InvalidArgumentError(where + " has an empty name");
    if (flags & 0x41) return InvalidArgumentError(member + " is encrypted; not supported");
    if (method != 0)
      return InvalidArgumentError(member + " is compressed (method " + std::to_string(method) +
                                  (method == 8 ? ", deflate" : "") +
                                  "); ptcfs reads stored (uncompressed) zip members only");
    if (csize != usize)
      return InvalidArgumentError(member + " is stored but its compressed size " + std::to_string(csize) +
                                  " differs from its size " + std::to_string(usize));
    e.size = usize;
    e.header_offset = offset;
    archive.members.push_back(std::move(e));
  }
  for (const ZipEntry& e : archive.members) {
    if (!names.insert(e.name).second) return Bad(what, "member " + Quote(e.name) + " appears twice");
  }

  // Local headers, in file order, must not overlap each other's data.
  std::vector<ZipEntry*> order;
  for (ZipEntry& e : archive.members) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const ZipEntry* a, const ZipEntry* b) { return a->header_offset < b->header_offset; });
  uint64_t prev_end = 0;
  const ZipEntry* prev = nullptr;
  for (ZipEntry* e : order) {
    const std::string member = what + ": member " + Quote(e->name);
    if (e->header_offset > end.cd_offset || end.cd_offset - e->header_offset < kLocalSize + e->name.size())
      return InvalidArgumentError(member + ": local header at byte " + std::to_string(e->header_offset) +
                                  " runs past the central directory at byte " + std::to_string(end.cd_offset));
    if (prev && e->header_offset < prev_end)
      return InvalidArgumentError(member + ": local header at byte " + std::to_string(e->header_offset) +
                                  " overlaps the data of member " + Quote(prev->name));
    std::string h(kLocalSize + e->name.size(), '\0');
    PTC_RETURN_IF_ERROR(file.Read(e->header_offset, h.size(), h.data()), what);
    if (Get32(h.data()) != kLocalSig)
      return InvalidArgumentError(member + ": no local header at byte " + std::to_string(e->header_offset));
    const uint16_t nlen = Get16(h.data() + 26), elen = Get16(h.data() + 28);
    if (nlen != e->name.size() || h.compare(kLocalSize, nlen, e->name) != 0)
      return InvalidArgumentError(member + ": local header at byte " + std::to_string(e->header_offset) +
                                  " names another member");
    e->data_offset = e->header_offset + kLocalSize + nlen + elen;
    if (e->data_offset > end.cd_offset || e->size > end.cd_offset - e->data_offset)
      return InvalidArgumentError(member + ": data [" + std::to_string(e->data_offset) + ", +" +
                                  std::to_string(e->size) + ") runs past the central directory at byte " +
                                  std::to_string(end.cd_offset));
    prev_end = e->data_offset + e->size;
    prev = e;
  }
  return archive;
}

Status VerifyMemberCrc(const RandomAccessFile& file, const ZipEntry& member, const std::string& what, char* buf) {
  std::unique_ptr<char[]> own;
  if (buf == nullptr) {
    own.reset(new char[kCrcChunk]);  // not zeroed: every byte used is read first
    buf = own.get();
  }
  uint32_t crc = 0;
  for (uint64_t at = 0; at < member.size;) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(kCrcChunk, member.size - at));
    PTC_RETURN_IF_ERROR(file.Read(member.data_offset + at, take, buf), what);
    crc = Crc32(crc, buf, take);
    at += take;
  }
  return CheckMemberCrc(member, crc, what);
}

Status CheckMemberCrc(const ZipEntry& member, uint32_t computed, const std::string& what) {
  if (computed == member.crc32) return Status::OK();
  char msg[64];
  std::snprintf(msg, sizeof(msg), " (computed %08x, recorded %08x)", computed, member.crc32);
  return CorruptionError("bad CRC-32 in member " + Quote(member.name) + " of " + what + msg);
}

}  // namespace ptc
