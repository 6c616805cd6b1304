#include "ptc/format/zip.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

namespace ptc {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr size_t kLocalSize = 30;
constexpr size_t kCentralSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kEnd64Size = 56;
constexpr size_t kLocator64Size = 20;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kPadExtraId = 0x4246;  // "FB", torch's padding field
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01
constexpr uint16_t kFlagUtf8 = 1 << 11;
constexpr size_t kChunk = 1 << 20;

void Put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Put64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t Get16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t Get32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return u[0] | (u[1] << 8) | (u[2] << 16) | (static_cast<uint32_t>(u[3]) << 24);
}
uint64_t Get64(const char* p) { return Get32(p) | (static_cast<uint64_t>(Get32(p + 4)) << 32); }

uint32_t Clamp32(uint64_t v, uint64_t limit) { return v >= limit ? 0xFFFFFFFFu : static_cast<uint32_t>(v); }

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

Status Bad(const std::string& what, const std::string& message) {
  return InvalidArgumentError(what + ": " + message);
}

std::string Quote(std::string_view name) { return "'" + std::string(name) + "'"; }

std::string LocalHeader(const ZipMember& m, uint64_t header_offset, const ZipLimits& limits) {
  const bool big = m.size >= limits.size_limit;
  std::string h;
  Put32(h, kLocalSig);
  Put16(h, big ? 45 : 20);
  Put16(h, IsAscii(m.name) ? 0 : kFlagUtf8);
  Put16(h, 0);  // stored
  Put16(h, kDosTime);
  Put16(h, kDosDate);
  Put32(h, m.crc32);
  Put32(h, Clamp32(m.size, limits.size_limit));  // compressed size
  Put32(h, Clamp32(m.size, limits.size_limit));
  Put16(h, static_cast<uint16_t>(m.name.size()));
  const uint64_t base = header_offset + kLocalSize + m.name.size() + (big ? 20 : 0);
  const uint64_t pad = base % kZipAlignment == 0 ? 0 : 4 + (kZipAlignment - (base + 4) % kZipAlignment) % kZipAlignment;
  Put16(h, static_cast<uint16_t>((big ? 20 : 0) + pad));
  h += m.name;
  if (big) {
    Put16(h, kZip64ExtraId);
    Put16(h, 16);
    Put64(h, m.size);
    Put64(h, m.size);
  }
  if (pad > 0) {
    Put16(h, kPadExtraId);
    Put16(h, static_cast<uint16_t>(pad - 4));
    h.append(pad - 4, 'Z');
  }
  return h;
}

std::string CentralHeader(const ZipMember& m, uint64_t header_offset, const ZipLimits& limits) {
  std::string extra;
  if (m.size >= limits.size_limit) {
    Put64(extra, m.size);
    Put64(extra, m.size);
  }
  if (header_offset >= limits.size_limit) Put64(extra, header_offset);
  std::string h;
  Put32(h, kCentralSig);
  Put16(h, 45);  // made by: spec 4.5, MS-DOS attributes
  Put16(h, extra.empty() ? 20 : 45);
  Put16(h, IsAscii(m.name) ? 0 : kFlagUtf8);
  Put16(h, 0);
  Put16(h, kDosTime);
  Put16(h, kDosDate);
  Put32(h, m.crc32);
  Put32(h, Clamp32(m.size, limits.size_limit));
  Put32(h, Clamp32(m.size, limits.size_limit));
  Put16(h, static_cast<uint16_t>(m.name.size()));
  Put16(h, static_cast<uint16_t>(extra.empty() ? 0 : extra.size() + 4));
  Put16(h, 0);  // comment
  Put16(h, 0);  // disk
  Put16(h, 0);  // internal attributes
  Put32(h, 0);  // external attributes
  Put32(h, Clamp32(header_offset, limits.size_limit));
  h += m.name;
  if (!extra.empty()) {
    Put16(h, kZip64ExtraId);
    Put16(h, static_cast<uint16_t>(extra.size()));
    h += extra;
  }
  return h;
}

// The ZIP64 end record and locator (when needed) and the end record.
std::string EndRecords(uint64_t count, uint64_t cd_offset, uint64_t cd_size, const ZipLimits& limits, bool* zip64) {
  *zip64 = count >= limits.count_limit || cd_offset >= limits.size_limit || cd_size >= limits.size_limit;
  std::string e;
  if (*zip64) {
    const uint64_t record_offset = cd_offset + cd_size;
    Put32(e, kEnd64Sig);
    Put64(e, kEnd64Size - 12);
    Put16(e, 45);
    Put16(e, 45);
    Put32(e, 0);
    Put32(e, 0);
    Put64(e, count);
    Put64(e, count);
    Put64(e, cd_size);
    Put64(e, cd_offset);
    Put32(e, kLocator64Sig);
    Put32(e, 0);
    Put64(e, record_offset);
    Put32(e, 1);
  }
  const uint16_t count16 = count >= limits.count_limit ? 0xFFFF : static_cast<uint16_t>(count);
  Put32(e, kEndSig);
  Put16(e, 0);
  Put16(e, 0);
  Put16(e, count16);
  Put16(e, count16);
  Put32(e, Clamp32(cd_size, limits.size_limit));
  Put32(e, Clamp32(cd_offset, limits.size_limit));
  Put16(e, 0);
  return e;
}

void AddLiteral(ZipLayout& layout, std::string bytes) {
  ZipPiece p;
  p.offset = layout.size;
  p.size = bytes.size();
  p.literal = std::move(bytes);
  layout.size += p.size;
  layout.pieces.push_back(std::move(p));
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, step));
    p += step;
    n -= step;
  }
  return crc;
}

uint32_t Crc32Combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
  return static_cast<uint32_t>(crc32_combine64(crc1, crc2, static_cast<z_off64_t>(len2)));
}

uint32_t Crc32Zeros(uint64_t n) {
  static const std::string kZeros(4096, '\0');
  uint32_t crc = 0;
  uint64_t have = 0;  // crc covers `have` zeros
  uint32_t block = Crc32(0, kZeros.data(), kZeros.size());
  uint64_t block_len = kZeros.size();
  // Binary decomposition of n / 4096 with doubling blocks, then the remainder.
  uint64_t blocks = n / block_len;
  while (blocks > 0) {
    if (blocks & 1) {
      crc = Crc32Combine(crc, block, block_len);
      have += block_len;
    }
    blocks >>= 1;
    if (blocks > 0) {
      block = Crc32Combine(block, block, block_len);
      block_len *= 2;
    }
  }
  return Crc32(crc, kZeros.data(), n - have);
}

size_t ZipLayout::FindPiece(uint64_t offset) const {
  auto it = std::upper_bound(pieces.begin(), pieces.end(), offset,
                             [](uint64_t off, const ZipPiece& p) { return off < p.offset; });
  return static_cast<size_t>(it - pieces.begin()) - 1;
}

Result<ZipLayout> PlanZip(const std::vector<ZipMember>& members, const ZipLimits& limits) {
  std::set<std::string_view> names;
  for (const ZipMember& m : members) {
    if (m.name.empty()) return InvalidArgumentError("zip member with an empty name");
    if (m.name.size() > 0xFFFF)
      return InvalidArgumentError("zip member name " + Quote(m.name.substr(0, 60)) + "... is longer than 65535 bytes");
    if (m.name.find('\0') != std::string::npos)
      return InvalidArgumentError("zip member name " + Quote(m.name) + " contains a NUL byte");
    if (!names.insert(m.name).second) return InvalidArgumentError("zip member " + Quote(m.name) + " appears twice");
  }
  ZipLayout layout;
  std::vector<uint64_t> header_offsets;
  for (size_t i = 0; i < members.size(); ++i) {
    const ZipMember& m = members[i];
    header_offsets.push_back(layout.size);
    AddLiteral(layout, LocalHeader(m, layout.size, limits));
    layout.data_offsets.push_back(layout.size);
    if (m.size > 0) {
      ZipPiece p;
      p.offset = layout.size;
      p.size = m.size;
      p.member = static_cast<int64_t>(i);
      layout.size += m.size;
      layout.pieces.push_back(std::move(p));
    }
  }
  const uint64_t cd_offset = layout.size;
  std::string tail;
  for (size_t i = 0; i < members.size(); ++i) tail += CentralHeader(members[i], header_offsets[i], limits);
  const uint64_t cd_size = tail.size();
  tail += EndRecords(members.size(), cd_offset, cd_size, limits, &layout.zip64);
  AddLiteral(layout, std::move(tail));
  return layout;
}

Status ReadZipRange(const ZipLayout& layout, uint64_t offset, size_t n, void* dst, const ZipDataReader& read) {
  if (offset > layout.size || n > layout.size - offset)
    return InvalidArgumentError("zip range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                ") passes the end of the " + std::to_string(layout.size) + "-byte archive");
  char* out = static_cast<char*>(dst);
  size_t i = n > 0 ? layout.FindPiece(offset) : 0;
  while (n > 0) {
    const ZipPiece& p = layout.pieces[i++];
    const uint64_t within = offset - p.offset;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, p.size - within));
    if (p.is_literal()) {
      std::memcpy(out, p.literal.data() + within, take);
    } else {
      PTC_RETURN_IF_ERROR(read(static_cast<size_t>(p.member), p.member_offset + within, take, out));
    }
    out += take;
    offset += take;
    n -= take;
  }
  return Status::OK();
}

Result<ZipLayout> WriteZip(WritableFile& out, std::vector<ZipMember> members, const ZipDataReader& read,
                           const std::string& what) {
  for (ZipMember& m : members) m.crc32 = 0;
  PTC_ASSIGN_OR_RETURN(ZipLayout draft, PlanZip(members), what);
  std::string buf;
  for (const ZipPiece& p : draft.pieces) {
    if (p.is_literal()) {
      PTC_RETURN_IF_ERROR(out.Append(p.literal.data(), p.literal.size()), what);
      continue;
    }
    ZipMember& m = members[static_cast<size_t>(p.member)];
    for (uint64_t at = 0; at < p.size;) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(kChunk, p.size - at));
      buf.resize(take);
      PTC_RETURN_IF_ERROR(read(static_cast<size_t>(p.member), at, take, buf.data()),
                          what + ": member " + Quote(m.name));
      m.crc32 = Crc32(m.crc32, buf.data(), take);
      PTC_RETURN_IF_ERROR(out.Append(buf.data(), take), what);
      at += take;
    }
  }
  PTC_ASSIGN_OR_RETURN(ZipLayout final_layout, PlanZip(members), what);
  if (final_layout.size != draft.size || final_layout.pieces.size() != draft.pieces.size())
    return InternalError(what + ": zip layout changed with the CRCs");
  for (size_t i = 0; i < final_layout.pieces.size(); ++i) {
    const ZipPiece& p = final_layout.pieces[i];
    if (p.is_literal() && p.literal != draft.pieces[i].literal)
      PTC_RETURN_IF_ERROR(out.PWrite(p.offset, p.literal.data(), p.literal.size()), what);
  }
  return final_layout;
}

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  for (const ZipEntry& e : members) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

namespace {

struct EndInfo {
  uint64_t count = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t dir_end = 0;  // where the directory must end: the first end record
  bool zip64 = false;
};

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
  if (!at) return Bad(what, "not a zip archive: no end of central directory record in the last " +
                                std::to_string(tail_len) + " bytes");
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
    const std::string where = what + ": central directory entry " + std::to_string(k) + " at byte " +
                              std::to_string(end.cd_offset + at);
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
    PTC_RETURN_IF_ERROR(ApplyZip64Extra(std::string_view(h + kCentralSize + nlen, elen), &usize, &csize, &offset,
                                        member));
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

Status VerifyMemberCrc(const RandomAccessFile& file, const ZipEntry& member, const std::string& what) {
  std::string buf;
  uint32_t crc = 0;
  for (uint64_t at = 0; at < member.size;) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(kChunk, member.size - at));
    buf.resize(take);
    PTC_RETURN_IF_ERROR(file.Read(member.data_offset + at, take, buf.data()), what);
    crc = Crc32(crc, buf.data(), take);
    at += take;
  }
  if (crc != member.crc32) {
    char msg[64];
    std::snprintf(msg, sizeof(msg), " (computed %08x, recorded %08x)", crc, member.crc32);
    return CorruptionError("bad CRC-32 in member " + Quote(member.name) + " of " + what + msg);
  }
  return Status::OK();
}

}  // namespace ptc
