// The zip writer: the layout of a stored archive (PlanZip), its lazy
// rendering (ReadZipRange) and streaming it into a file (WriteZip).
#include "ptc/format/zip_writer.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include "ptc/format/little_endian.h"
#include "ptc/format/zip_records.h"

namespace ptc {
namespace {

using internal::kCentralSig, internal::kEnd64Sig, internal::kEndSig, internal::kLocalSig, internal::kLocator64Sig;
using internal::kChunk, internal::kEnd64Size, internal::kLocalSize, internal::kPadExtraId, internal::kZip64ExtraId;
using internal::Put16, internal::Put32, internal::Put64, internal::Quote;

constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01
constexpr uint16_t kFlagUtf8 = 1 << 11;

// A 32-bit size or offset field: the value, or the ZIP64 sentinel at `limit`.
uint32_t Clamp32(uint64_t v, uint64_t limit) { return v >= limit ? 0xFFFFFFFFu : static_cast<uint32_t>(v); }

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

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
  // The CRCs change only header bytes, never sizes: rewrite the headers in place.
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

}  // namespace ptc
