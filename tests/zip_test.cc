#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "ptc/base/crc32.h"
#include "ptc/format/crc_ledger.h"
#include "ptc/format/zip_reader.h"
#include "ptc/format/zip_writer.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

const std::string kPython = "/usr/bin/python3";

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

uint32_t Crc(const std::string& s) { return Crc32(0, s.data(), s.size()); }

// Members named "m<i>" (and a non-ASCII one) with the given contents.
std::vector<ZipMember> Members(const std::vector<std::string>& names, const std::vector<std::string>& data) {
  std::vector<ZipMember> out;
  for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], data[i].size(), Crc(data[i])});
  return out;
}

// The archive bytes of `layout` with member data `data`.
std::string Render(const ZipLayout& layout, const std::vector<std::string>& data) {
  std::string out(layout.size, '\0');
  Status s = ReadZipRange(layout, 0, out.size(), out.data(), [&](size_t m, uint64_t off, size_t n, void* dst) {
    std::memcpy(dst, data[m].data() + off, n);
    return Status::OK();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::string CheckLayout(const ZipLayout& layout, const std::vector<ZipMember>& members) {
  uint64_t at = 0;
  for (const ZipPiece& p : layout.pieces) {
    if (p.offset != at) return "gap or overlap at " + std::to_string(at);
    if (p.is_literal() && p.literal.size() != p.size) return "literal size";
    if (!p.is_literal() && (p.member_offset != 0 || p.size != members[p.member].size)) return "data piece";
    if (p.size == 0) return "empty piece";
    at += p.size;
  }
  if (at != layout.size) return "pieces do not end at size";
  for (size_t i = 0; i < members.size(); ++i) {
    if (layout.data_offsets[i] % kZipAlignment != 0) return "unaligned data of member " + std::to_string(i);
  }
  return "";
}

void ExpectError(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok()) << "accepted, expected an error mentioning " << *parts.begin();
  for (const std::string& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << s.ToString();
}

TEST(Crc32, KnownValuesAndCombine) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  const std::string a = "hello, ", b = "world";
  EXPECT_EQ(Crc32Combine(Crc(a), Crc(b), b.size()), Crc(a + b));
  EXPECT_EQ(Crc32(Crc(a), b.data(), b.size()), Crc(a + b));
  for (uint64_t n : {0ull, 1ull, 63ull, 4095ull, 4096ull, 4097ull, 100000ull, (1ull << 20) + 3}) {
    EXPECT_EQ(Crc32Zeros(n), Crc(std::string(n, '\0'))) << n;
  }
}

// The vectorised CRC (libdeflate) on large, unaligned buffers, split anywhere:
// the values Python's zlib.crc32 gives for the same bytes.
TEST(Crc32, LargeUnalignedBuffersEqualZlibs) {
  const size_t n = (3u << 20) + 17;
  std::string bytes(n + 3, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(((i * 2654435761ull) >> 24) & 0xff);
  const char* p = bytes.data() + 3;  // off any alignment
  EXPECT_EQ(Crc32(0, p, n), 0xa4bacc7fu);
  EXPECT_EQ(Crc32(0, p, 1000000), 0xd3decfd5u);
  for (size_t cut : {size_t{1}, size_t{15}, size_t{4096}, size_t{1} << 20, n - 1}) {
    EXPECT_EQ(Crc32(Crc32(0, p, cut), p + cut, n - cut), 0xa4bacc7fu) << cut;
  }
}

TEST(PlanZip, LayoutInvariants) {
  std::mt19937_64 rng(TestSeed());
  for (int round = 0; round < 50; ++round) {
    std::vector<ZipMember> members;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i)
      members.push_back({"dir/m" + std::to_string(i) + std::string(rng() % 70, 'x'), rng() % 300, 0});
    auto layout = PlanZip(members);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    EXPECT_EQ(CheckLayout(*layout, members), "");
    EXPECT_FALSE(layout->zip64);
    for (int k = 0; k < 20 && layout->size > 0; ++k) {
      const uint64_t off = rng() % layout->size;
      const ZipPiece& p = layout->pieces[layout->FindPiece(off)];
      EXPECT_TRUE(p.offset <= off && off < p.offset + p.size);
    }
  }
}

TEST(PlanZip, RejectsBadNames) {
  ExpectError(PlanZip({{"", 1, 0}}).status(), {"empty name"});
  ExpectError(PlanZip({{"a", 1, 0}, {"a", 2, 0}}).status(), {"'a'", "twice"});
  ExpectError(PlanZip({{std::string("a\0b", 3), 1, 0}}).status(), {"NUL"});
  ExpectError(PlanZip({{std::string(70000, 'n'), 1, 0}}).status(), {"65535"});
}

TEST(ReadZipRange, EveryRangeMatchesTheWholeArchive) {
  std::mt19937_64 rng(TestSeed());
  std::vector<std::string> names = {"a", "b/c", "empty", "d"},
                           data = {RandomBytes(rng, 100), RandomBytes(rng, 3000), "", RandomBytes(rng, 1)};
  auto layout = PlanZip(Members(names, data));
  ASSERT_TRUE(layout.ok());
  const std::string whole = Render(*layout, data);
  for (int k = 0; k < 500; ++k) {
    const uint64_t off = rng() % (whole.size() + 1);
    const size_t n = rng() % (whole.size() - off + 1);
    std::string part(n, '\0');
    ASSERT_TRUE(ReadZipRange(*layout, off, n, part.data(), [&](size_t m, uint64_t o, size_t len, void* dst) {
                  std::memcpy(dst, data[m].data() + o, len);
                  return Status::OK();
                }).ok());
    ASSERT_EQ(part, whole.substr(off, n)) << off << "+" << n;
  }
  std::string buf(2, '\0');
  ExpectError(ReadZipRange(*layout, whole.size() - 1, 2, buf.data(), nullptr), {"passes the end"});
}

// Writes with WriteZip (CRCs computed while streaming), reads back with our
// reader and with Python's zipfile.
TEST(WriteZip, ReadBackByUsAndByPython) {
  std::mt19937_64 rng(TestSeed());
  TempDir dir;
  const std::string path = dir / "out.zip";
  std::vector<std::string> names = {"archive/data.pkl", "archive/data/0", "archive/empty", "archive/\xc3\xa9t\xc3\xa9",
                                    "archive/version"};
  std::vector<std::string> data = {RandomBytes(rng, 777), RandomBytes(rng, (3 << 20) + 5), "", RandomBytes(rng, 64),
                                   "3\n"};
  std::vector<ZipMember> members;
  for (size_t i = 0; i < names.size(); ++i) members.push_back({names[i], data[i].size(), 0});  // CRCs unknown
  {
    auto out = Env::Default()->OpenWrite(path);
    ASSERT_TRUE(out.ok());
    auto layout = WriteZip(
        **out, members,
        [&](size_t m, uint64_t off, size_t n, void* dst) {
          std::memcpy(dst, data[m].data() + off, n);
          return Status::OK();
        },
        path);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    ASSERT_TRUE((*out)->Close().ok());
    // The file equals the layout rendered with the true CRCs.
    EXPECT_EQ(Slurp(path), Render(*PlanZip(Members(names, data)), data));
  }
  auto file = Env::Default()->OpenRead(path);
  ASSERT_TRUE(file.ok());
  auto archive = ReadZipDirectory(**file, path);
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  ASSERT_EQ(archive->members.size(), names.size());
  const std::string bytes = Slurp(path);
  for (size_t i = 0; i < names.size(); ++i) {
    const ZipEntry& e = archive->members[i];
    EXPECT_EQ(e.name, names[i]);
    EXPECT_EQ(e.size, data[i].size());
    EXPECT_EQ(e.crc32, Crc(data[i]));
    EXPECT_EQ(e.data_offset % 64, 0u);
    EXPECT_EQ(bytes.substr(e.data_offset, e.size), data[i]);
    EXPECT_TRUE(VerifyMemberCrc(**file, e, path).ok());
    EXPECT_EQ(archive->Find(names[i]), &e);
  }
  EXPECT_EQ(archive->Find("nope"), nullptr);

  auto [rc, out] = Sh(kPython + " -m zipfile -t " + path);
  EXPECT_EQ(rc, 0) << out;
  auto [rc2, out2] = Sh(kPython + " -m zipfile -e " + path + " " + dir.path() + "/x");
  ASSERT_EQ(rc2, 0) << out2;
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(Slurp(dir.path() + "/x/" + names[i]), data[i]) << names[i];
}

// ZIP64 extra fields and end records, forced by lowering the thresholds, so
// every member and the archive take the ZIP64 path; Python must accept them.
TEST(PlanZip, ForcedZip64IsValid) {
  std::mt19937_64 rng(TestSeed());
  TempDir dir;
  std::vector<std::string> names = {"a", "b", "c"}, data = {RandomBytes(rng, 10), "", RandomBytes(rng, 5000)};
  for (ZipLimits limits : {ZipLimits{0, 0}, ZipLimits{100, 1}, ZipLimits{0xFFFFFFFF, 2}}) {
    auto layout = PlanZip(Members(names, data), limits);
    ASSERT_TRUE(layout.ok());
    EXPECT_TRUE(layout->zip64);
    EXPECT_EQ(CheckLayout(*layout, Members(names, data)), "");
    const std::string path = dir / ("z64-" + std::to_string(limits.size_limit) + ".zip");
    Spit(path, Render(*layout, data));
    auto [rc, out] =
        Sh(kPython + " -m zipfile -t " + path + " && " + kPython + " -m zipfile -e " + path + " " + path + ".d");
    ASSERT_EQ(rc, 0) << out;
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(Slurp(path + ".d/" + names[i]), data[i]);
    StringFile f(Slurp(path), path);
    auto archive = ReadZipDirectory(f, path);
    ASSERT_TRUE(archive.ok()) << archive.status().ToString();
    EXPECT_TRUE(archive->zip64);
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(archive->members[i].size, data[i].size());
      EXPECT_EQ(archive->members[i].data_offset, layout->data_offsets[i]);
      EXPECT_TRUE(VerifyMemberCrc(f, archive->members[i], path).ok());
    }
  }
}

// More than 0xFFFF entries: the entry count needs the ZIP64 end record.
TEST(PlanZip, ManyEntriesUseZip64EndRecord) {
  TempDir dir;
  const size_t n = 70000;
  std::vector<std::string> names, data;
  for (size_t i = 0; i < n; ++i) {
    names.push_back("m" + std::to_string(i));
    data.push_back(std::string(1, static_cast<char>(i)));
  }
  auto layout = PlanZip(Members(names, data));
  ASSERT_TRUE(layout.ok());
  EXPECT_TRUE(layout->zip64);
  const std::string path = dir / "many.zip";
  Spit(path, Render(*layout, data));
  auto [rc, out] = Sh(kPython +
                      " -c 'import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); n=z.infolist(); "
                      "assert len(n)==70000, len(n); assert z.testzip() is None; "
                      "assert z.read(\"m69999\")==bytes([69999 % 256]); print(\"ok\")' " +
                      path);
  EXPECT_EQ(rc, 0) << out;
  StringFile f(Slurp(path), path);
  auto archive = ReadZipDirectory(f, path);
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  ASSERT_EQ(archive->members.size(), n);
  EXPECT_EQ(archive->members[69999].name, "m69999");
  EXPECT_EQ(archive->members[69999].data_offset, layout->data_offsets[69999]);
}

// A sparse archive with a member over 4 GiB (zeros, CRC by Crc32Zeros), so
// sizes and offsets need ZIP64 for real; only the headers are written.
TEST(PlanZip, MemberOver4GiB) {
  TempDir dir;
  const std::string path = dir / "big.zip";
  const uint64_t big = (1ull << 32) + 1000;
  const std::string before = "before", after = "after the big one";
  std::vector<ZipMember> members = {
      {"before", before.size(), Crc(before)}, {"big", big, Crc32Zeros(big)}, {"after", after.size(), Crc(after)}};
  auto layout = PlanZip(members);
  ASSERT_TRUE(layout.ok());
  EXPECT_TRUE(layout->zip64);
  EXPECT_GT(layout->data_offsets[2], 1ull << 32);
  {
    const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    for (const ZipPiece& p : layout->pieces) {
      const std::string* bytes = p.is_literal()  ? &p.literal
                                 : p.member == 0 ? &before
                                 : p.member == 2 ? &after
                                                 : nullptr;
      if (bytes == nullptr) continue;
      ASSERT_EQ(::pwrite(fd, bytes->data(), bytes->size(), p.offset), static_cast<ssize_t>(bytes->size()));
    }
    ASSERT_EQ(::ftruncate(fd, layout->size), 0);
    ::close(fd);
  }
  auto [rc, out] = Sh(kPython +
                      " -c 'import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); i=z.getinfo(\"big\"); "
                      "assert i.file_size==" +
                      std::to_string(big) +
                      ", i.file_size; "
                      "assert z.getinfo(\"after\").header_offset > 2**32; "
                      "assert z.read(\"after\")==b\"" +
                      after + "\"; assert z.read(\"before\")==b\"" + before +
                      "\"; "
                      "print(\"ok\")' " +
                      path);
  EXPECT_EQ(rc, 0) << out;
  auto file = Env::Default()->OpenRead(path);
  ASSERT_TRUE(file.ok());
  auto archive = ReadZipDirectory(**file, path);
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  EXPECT_TRUE(archive->zip64);
  EXPECT_EQ(archive->members[1].size, big);
  EXPECT_EQ(archive->members[1].crc32, Crc32Zeros(big));
  EXPECT_EQ(archive->members[2].data_offset, layout->data_offsets[2]);
  EXPECT_TRUE(VerifyMemberCrc(**file, archive->members[2], path).ok());
}

TEST(ReadZipDirectory, ArchivesWrittenByPython) {
  TempDir dir;
  auto [rc, out] =
      Sh(kPython + " " + PTCFS_SOURCE_DIR + "/tests/clients/torch_roundtrip.py zip-write-python " + dir.path());
  ASSERT_EQ(rc, 0) << out;
  for (const char* name : {"plain.zip", "stream.zip", "zip64.zip"}) {
    SCOPED_TRACE(name);
    const std::string path = dir / name;
    StringFile f(Slurp(path), path);
    auto archive = ReadZipDirectory(f, path);
    ASSERT_TRUE(archive.ok()) << archive.status().ToString();
    ASSERT_EQ(archive->members.size(), 3u);
    for (const ZipEntry& e : archive->members) {
      const std::string expect = Slurp(dir.path() + "/expect/" + e.name);
      std::string got(e.size, '\0');
      ASSERT_TRUE(f.Read(e.data_offset, e.size, got.data()).ok());
      EXPECT_EQ(got, expect) << e.name;
      EXPECT_TRUE(VerifyMemberCrc(f, e, path).ok());
    }
  }
  const std::string deflated = dir / "deflated.zip";
  StringFile f(Slurp(deflated), deflated);
  ExpectError(ReadZipDirectory(f, deflated).status(),
              {deflated, "'a.txt'", "compressed (method 8, deflate)", "stored (uncompressed) zip members only"});
}

// ---------------------------------------------------------------- bad archives

struct Fixture {
  std::vector<std::string> names = {"first", "second"};
  std::vector<std::string> data = {std::string(100, 'a'), std::string(50, 'b')};
  ZipLayout layout = *PlanZip(Members(names, data));
  std::string bytes = Render(layout, data);
  // Offsets of the end record and of central entry i.
  size_t eocd() const { return bytes.size() - 22; }
  size_t central(int i) const {
    size_t at = bytes.find("PK\x01\x02");
    for (int k = 0; k < i; ++k) at = bytes.find("PK\x01\x02", at + 1);
    return at;
  }
};

void Put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Status ReadBytes(const std::string& bytes) {
  StringFile f(bytes, "bad.zip");
  return ReadZipDirectory(f, "bad.zip").status();
}

TEST(ReadZipDirectory, Errors) {
  Fixture fx;
  ASSERT_TRUE(ReadBytes(fx.bytes).ok());
  ExpectError(ReadBytes(""), {"bad.zip", "too short"});
  ExpectError(ReadBytes(fx.bytes.substr(0, fx.bytes.size() - 5)), {"bad.zip", "no end of central directory record"});
  ExpectError(ReadBytes(std::string(1000, 'x')), {"bad.zip", "no end of central directory record"});
  {
    std::string b = fx.bytes;
    Put32(b, fx.eocd() + 16, static_cast<uint32_t>(b.size()));  // directory offset past its end
    ExpectError(ReadBytes(b), {"bad.zip", "central directory", "runs past"});
  }
  {
    std::string b = fx.bytes;
    b[fx.eocd() + 10] = 9;  // entries
    b[fx.eocd() + 8] = 9;
    ExpectError(ReadBytes(b), {"bad.zip", "claims 9 entries"});
  }
  {
    std::string b = fx.bytes;
    b[fx.central(1)] = 'X';
    ExpectError(ReadBytes(b), {"bad.zip", "central directory entry 1", "bad signature"});
  }
  {
    std::string b = fx.bytes;
    b[fx.central(1) + 10] = 8;  // method: deflate
    ExpectError(ReadBytes(b), {"bad.zip", "'second'", "compressed", "stored (uncompressed) zip members only"});
  }
  {
    std::string b = fx.bytes;
    b[fx.central(0) + 8] = 1;  // encrypted
    ExpectError(ReadBytes(b), {"bad.zip", "'first'", "encrypted"});
  }
  {
    std::string b = fx.bytes;
    const size_t local1 = fx.layout.data_offsets[0] + fx.data[0].size();
    ASSERT_EQ(b.substr(local1 + 30, 6), "second");
    b[local1 + 35] = 'X';  // the local header names "seconX"
    ExpectError(ReadBytes(b), {"bad.zip", "'second'", "names another member"});
  }
  {
    std::string b = fx.bytes;
    Put32(b, fx.central(0) + 20, 200);  // first member's sizes run into the second
    Put32(b, fx.central(0) + 24, 200);
    ExpectError(ReadBytes(b), {"bad.zip", "'second'", "overlaps the data of member 'first'"});
  }
  {
    std::string b = fx.bytes;
    Put32(b, fx.central(1) + 20, 1 << 30);
    Put32(b, fx.central(1) + 24, 1 << 30);
    ExpectError(ReadBytes(b), {"bad.zip", "'second'", "runs past the central directory"});
  }
  {
    std::string b = fx.bytes;
    Put32(b, fx.central(1) + 20, 7);
    ExpectError(ReadBytes(b), {"bad.zip", "'second'", "compressed size 7 differs"});
  }
  {
    std::string b = fx.bytes;
    Put32(b, fx.central(1) + 42, static_cast<uint32_t>(fx.layout.data_offsets[1]));  // points at data
    ExpectError(ReadBytes(b),
                {"bad.zip", "'second'", "no local header at byte " + std::to_string(fx.layout.data_offsets[1])});
  }
  {
    std::string b = fx.bytes;
    b[fx.central(1) + 28] = 60;  // name length past the directory
    ExpectError(ReadBytes(b), {"bad.zip", "entry 1", "truncated"});
  }
}

TEST(ReadZipDirectory, DuplicateNames) {
  std::vector<std::string> names = {"aa", "ab"}, data = {"x", "y"};
  std::string b = Render(*PlanZip(Members(names, data)), data);
  size_t at = 0;
  while ((at = b.find("ab", at)) != std::string::npos) b[at + 1] = 'a';
  ExpectError(ReadBytes(b), {"bad.zip", "'aa' appears twice"});
}

TEST(VerifyMemberCrc, DetectsAFlippedByte) {
  Fixture fx;
  std::string b = fx.bytes;
  b[fx.layout.data_offsets[1] + 7] ^= 1;
  StringFile f(b, "crc.zip");
  auto archive = ReadZipDirectory(f, "crc.zip");
  ASSERT_TRUE(archive.ok());
  EXPECT_TRUE(VerifyMemberCrc(f, archive->members[0], "crc.zip").ok());
  Status s = VerifyMemberCrc(f, archive->members[1], "crc.zip");
  EXPECT_EQ(s.code(), Code::kCorruption);
  ExpectError(s, {"bad CRC-32 in member 'second' of crc.zip"});
}

// The ledger's CRCs (a save's commit): ranges handed over while another pass
// reads them are combined, the rest read from the file; ranges that cross a
// member or overlap one kept are passed over; a range handed over with other
// bytes than the file's (what the reader saw) fails the check, naming the member.
TEST(CrcLedger, CombinesRangesReadElsewhereAndReadsTheRest) {
  std::mt19937_64 rng(TestSeed());
  Fixture fx;
  fx.data = {RandomBytes(rng, 3 << 20), RandomBytes(rng, 5000)};
  fx.layout = *PlanZip(Members(fx.names, fx.data));
  fx.bytes = Render(fx.layout, fx.data);
  TempDir dir;
  const std::string path = dir / "a.zip";
  Spit(path, fx.bytes);
  StringFile f(fx.bytes, path);
  auto archive = ReadZipDirectory(f, path);
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  const uint64_t first = fx.layout.data_offsets[0], second = fx.layout.data_offsets[1];
  auto add = [&](CrcLedger& ledger, uint64_t at, size_t n) { ledger.Add(path, at, fx.bytes.data() + at, n); };
  {
    CrcLedger ledger;
    add(ledger, first, 1000);  // before Expect: not kept
    ledger.Expect(path, archive->members);
    add(ledger, first + 1000, 1 << 20);
    add(ledger, first + 1500, 10);                   // overlaps the range kept
    add(ledger, first + (2 << 20), 1 << 20);         // ends where the member ends
    add(ledger, second - 10, 20);                    // crosses into the second member
    add(ledger, second + 4000, 1000);
    EXPECT_TRUE(ledger.Verify(Env::Default()).ok());
  }
  {
    CrcLedger ledger;
    ledger.Expect(path, archive->members);
    std::string seen = fx.bytes.substr(second + 100, 200);
    seen[7] ^= 1;  // the reader's bytes differ from what the CRC was recorded for
    ledger.Add(path, second + 100, seen.data(), seen.size());
    const Status s = ledger.Verify(Env::Default());
    EXPECT_EQ(s.code(), Code::kCorruption);
    ExpectError(s, {"bad CRC-32 in member 'second' of " + path});
  }
  {
    CrcLedger ledger;  // a flipped byte in the file where no range covers it
    ledger.Expect(path, archive->members);
    add(ledger, first, 1 << 20);
    std::string bad = fx.bytes;
    bad[first + (1 << 20) + 5] ^= 1;
    Spit(path, bad);
    const Status s = ledger.Verify(Env::Default());
    ExpectError(s, {"bad CRC-32 in member 'first' of " + path});
  }
}

}  // namespace
}  // namespace ptc
