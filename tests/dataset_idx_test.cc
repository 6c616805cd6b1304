// Megatron .idx/.bin and JSONL sources: write, read back, reject every kind
// of damage with a message naming the field, and survive random mutation.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ptc/dataset/idx.h"
#include "ptc/dataset/jsonl.h"
#include "ptc/dataset/synth.h"
#include "test_util.h"

namespace ptc {
namespace {

std::string Idx(Env* env, const std::string& prefix) { return *ReadFileToString(env, prefix + ".idx"); }

Result<IdxView> Parse(const std::string& idx, uint64_t bin_size) {
  return ParseIdx("d.idx", {reinterpret_cast<const uint8_t*>(idx.data()), idx.size()}, bin_size);
}

std::string ErrorOf(const std::string& idx, uint64_t bin_size) {
  Result<IdxView> r = Parse(idx, bin_size);
  EXPECT_FALSE(r.ok());
  return r.status().message();
}

template <typename T>
void Poke(std::string& s, size_t at, T v) {
  std::memcpy(&s[at], &v, sizeof v);
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = {.samples = 50, .min_len = 0, .max_len = 20, .vocab = 1000, .seed = 3};
    ASSERT_TRUE(WriteSynthDataset(env_.get(), spec_, "/d").ok());
    idx_ = Idx(env_.get(), "/d");
    bin_size_ = *env_->FileSize("/d.bin");
  }
  std::unique_ptr<Env> env_ = NewMemEnv();
  SynthDatasetSpec spec_;
  std::string idx_;
  uint64_t bin_size_ = 0;
};

TEST_F(IdxTest, WriterRoundTrip) {
  auto f = IdxFile::Open(env_.get(), "/d.idx", bin_size_);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const IdxView& v = (*f)->view();
  EXPECT_EQ(v.dtype_code(), 8);
  EXPECT_EQ(v.num_sequences(), 50u);
  EXPECT_EQ(v.num_documents(), 51u);
  std::string bin = *ReadFileToString(env_.get(), "/d.bin");
  for (uint64_t i = 0; i < 50; ++i) {
    std::vector<int64_t> tokens = SynthTokens(spec_, i);
    ASSERT_EQ(static_cast<uint64_t>(v.length(i)), tokens.size());
    for (size_t t = 0; t < tokens.size(); ++t) {
      uint16_t x;
      std::memcpy(&x, bin.data() + v.offset(i) + 2 * t, 2);
      ASSERT_EQ(x, tokens[t]);
    }
    EXPECT_EQ(v.document(i), static_cast<int64_t>(i));
  }
}

TEST_F(IdxTest, RejectsDamageNamingTheField) {
  EXPECT_NE(ErrorOf(idx_.substr(0, 20), bin_size_).find("d.idx: truncated"), std::string::npos);
  EXPECT_NE(ErrorOf(idx_.substr(0, idx_.size() - 3), bin_size_).find("truncated or count mismatch"), std::string::npos);
  std::string bad = idx_;
  bad[0] = 'X';
  EXPECT_NE(ErrorOf(bad, bin_size_).find("wrong magic"), std::string::npos);
  bad = idx_;
  Poke<uint64_t>(bad, 9, 2);
  EXPECT_NE(ErrorOf(bad, bin_size_).find("version is 2"), std::string::npos);
  bad = idx_;
  bad[17] = 9;
  EXPECT_NE(ErrorOf(bad, bin_size_).find("unknown dtype code 9"), std::string::npos);
  bad = idx_;
  Poke<uint64_t>(bad, 18, 49);
  EXPECT_NE(ErrorOf(bad, bin_size_).find("count mismatch: sequence count 49"), std::string::npos);
  bad = idx_;
  Poke<uint64_t>(bad, 18, uint64_t{1} << 62);
  EXPECT_NE(ErrorOf(bad, bin_size_).find("count mismatch"), std::string::npos);
  bad = idx_;
  Poke<int64_t>(bad, 34 + 4 * 50 + 8 * 7, static_cast<int64_t>(bin_size_));
  EXPECT_NE(ErrorOf(bad, bin_size_).find("sequence 7: offset"), std::string::npos);
  EXPECT_NE(ErrorOf(idx_, bin_size_ - 1).find("past the end of the .bin"), std::string::npos);
  bad = idx_;
  Poke<int32_t>(bad, 34 + 4 * 3, -1);
  EXPECT_NE(ErrorOf(bad, bin_size_).find("sequence 3: length -1 is negative"), std::string::npos);
  bad = idx_;
  Poke<int64_t>(bad, 34 + 12 * 50 + 8 * 5, 2);
  EXPECT_NE(ErrorOf(bad, bin_size_).find("document index entry 5"), std::string::npos);
}

TEST_F(IdxTest, RealFileIsMapped) {
  testing::TempDir tmp;
  Env* env = Env::Default();
  ASSERT_TRUE(WriteSynthDataset(env, spec_, tmp / "d").ok());
  EXPECT_EQ(Idx(env, tmp / "d"), idx_);
  auto f = IdxFile::Open(env, tmp / "d.idx", bin_size_);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->view().num_sequences(), 50u);
  EXPECT_EQ(IdxFile::Open(env, tmp / "missing.idx", 0).status().code(), Code::kNotFound);
}

// RenderIdx of the same content equals the written file, for any byte range.
class VectorIdx : public IdxSource {
 public:
  explicit VectorIdx(const IdxView& v) : v_(v) {}
  IdxLayout layout() const override { return {v_.num_sequences(), v_.num_documents()}; }
  uint8_t dtype_code() const override { return v_.dtype_code(); }
  Status Lengths(uint64_t f, uint64_t c, int32_t* out) const override {
    for (uint64_t t = 0; t < c; ++t) out[t] = v_.length(f + t);
    return Status::OK();
  }
  Status Offsets(uint64_t f, uint64_t c, int64_t* out) const override {
    for (uint64_t t = 0; t < c; ++t) out[t] = v_.offset(f + t);
    return Status::OK();
  }
  Status Documents(uint64_t f, uint64_t c, int64_t* out) const override {
    for (uint64_t t = 0; t < c; ++t) out[t] = v_.document(f + t);
    return Status::OK();
  }

 private:
  const IdxView& v_;
};

TEST_F(IdxTest, RenderAnyRange) {
  IdxView v = *Parse(idx_, bin_size_);
  VectorIdx src(v);
  std::mt19937_64 rng(testing::TestSeed());
  for (int t = 0; t < 500; ++t) {
    const uint64_t a = rng() % (idx_.size() + 1);
    const uint64_t n = rng() % (idx_.size() - a + 1);
    std::string out(n, '\0');
    ASSERT_TRUE(RenderIdx(src, a, n, out.data()).ok());
    ASSERT_EQ(out, idx_.substr(a, n)) << "range " << a << "+" << n;
  }
}

TEST_F(IdxTest, WriterCountsSequences) {
  auto w = std::move(MegatronWriter::Create(env_.get(), "/w", 4, 2)).value();
  EXPECT_TRUE(w->Add(std::string(8, 'a')).ok());
  EXPECT_NE(w->Add(std::string(3, 'a')).message().find("whole number"), std::string::npos);
  EXPECT_NE(w->Finish().message().find("1 of the declared 2"), std::string::npos);
}

// Mini-fuzz: random mutations of a valid .idx never crash the parser or read
// outside the image (run under ASan with PTCFS_SANITIZE=ON); what it accepts is
// in bounds.
TEST_F(IdxTest, MutationFuzz) {
  std::mt19937_64 rng(testing::TestSeed());
  int accepted = 0;
  for (int t = 0; t < 20000; ++t) {
    std::string m = idx_;
    switch (rng() % 4) {
      case 0:
        m.resize(rng() % (m.size() + 1));
        break;
      case 1:
        for (int k = 1 + rng() % 4; k > 0; --k) m[rng() % m.size()] = static_cast<char>(rng());
        break;
      case 2:
        Poke<uint64_t>(m, 18 + 8 * (rng() % 2), rng() % 2 ? rng() : rng() % 200);
        break;
      case 3:
        m.insert(rng() % m.size(), std::string(1 + rng() % 16, static_cast<char>(rng())));
        break;
    }
    std::vector<uint8_t> exact(m.begin(), m.end());  // exactly sized, so ASan sees overreads
    Result<IdxView> r = ParseIdx("m.idx", exact, bin_size_);
    if (!r.ok()) continue;
    ++accepted;
    for (uint64_t i = 0; i < r->num_sequences(); ++i) {
      ASSERT_LE(static_cast<uint64_t>(r->offset(i)) + r->nbytes(i), bin_size_);
    }
  }
  EXPECT_GT(accepted, 0);
}

// ---------------------------------------------------------------- JSONL

TEST(JsonlTest, LinesBlankLinesAndCrlf) {
  auto env = NewMemEnv();
  const std::string text = "{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}";
  ASSERT_TRUE(WriteFileAtomic(env.get(), "/x.jsonl", text).ok());
  auto scan = ScanJsonl(env.get(), "/x.jsonl", "/x.index");
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->num_samples, 3u);
  auto index = JsonlIndex::Open(env.get(), "/x.index", text.size());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  const JsonlIndexView& v = (*index)->view();
  EXPECT_EQ(v.checksum(), scan->checksum);
  std::vector<std::string> lines;
  for (uint64_t i = 0; i < v.num_samples(); ++i) lines.push_back(text.substr(v.start(i), v.end(i) - v.start(i)));
  EXPECT_EQ(lines, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"}));
  // Hash only: the same checksum, no file.
  auto hash_only = ScanJsonl(env.get(), "/x.jsonl", "");
  EXPECT_EQ(hash_only->checksum, scan->checksum);
  EXPECT_NE(JsonlIndex::Open(env.get(), "/x.index", text.size() + 1).status().message().find("source of"),
            std::string::npos);
}

TEST(JsonlTest, LongLinesAcrossChunksAndFuzz) {
  auto env = NewMemEnv();
  std::mt19937_64 rng(testing::TestSeed());
  std::string text;
  std::vector<std::string> want;
  for (int i = 0; i < 40; ++i) {
    std::string line = "{\"x\":\"" + std::string(rng() % 2 ? 10 : 600000, 'a' + i % 26) + "\"}";
    want.push_back(line);
    text += line + "\n";
  }
  ASSERT_TRUE(WriteFileAtomic(env.get(), "/y.jsonl", text).ok());
  ASSERT_TRUE(ScanJsonl(env.get(), "/y.jsonl", "/y.index").ok());
  auto index = std::move(JsonlIndex::Open(env.get(), "/y.index", text.size())).value();
  ASSERT_EQ(index->view().num_samples(), want.size());
  for (uint64_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(text.substr(index->view().start(i), index->view().end(i) - index->view().start(i)), want[i]);
  }
  const std::string image = *ReadFileToString(env.get(), "/y.index");
  for (int t = 0; t < 5000; ++t) {
    std::string m = image;
    if (rng() % 2) {
      m.resize(rng() % (m.size() + 1));
    } else {
      for (int k = 1 + rng() % 3; k > 0; --k) m[rng() % m.size()] = static_cast<char>(rng());
    }
    std::vector<uint8_t> exact(m.begin(), m.end());
    Result<JsonlIndexView> r = ParseJsonlIndex("m.index", exact, text.size());
    if (r.ok()) {
      for (uint64_t i = 0; i < r->num_samples(); ++i) ASSERT_LE(r->end(i), text.size());
    }
  }
}

}  // namespace
}  // namespace ptc
