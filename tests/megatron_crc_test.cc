// The zip CRC-32s of a Megatron rank file (view/megatron_file.h) composed
// from the block CRC-32s its pieces recorded when written, not read: after an
// import every storage is a whole piece (no tensor byte read); after a
// tensor-parallel change (a covering over the same pieces) a row slice reads
// only the bytes of the blocks it covers in part, a column slice (a strided
// run) all of its bytes; a manifest without block CRCs reads every byte, as
// before. Each time the CRCs equal those of the bytes (read the old way) and
// the file served from them equals the one WriteMegatronFile writes (which
// computes its CRCs from the bytes it writes).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ptc/base/crc32.h"
#include "ptc/store/store.h"
#include "ptc/store/store_reader.h"
#include "synth_store.h"
#include "test_util.h"
#include "view/megatron_file.h"

namespace ptcfs {
namespace {

using ptc::testing::TempDir;

// 12 MiB of f32 word embeddings (3 checksum blocks): a tensor-parallel split
// in two cuts its middle block; the MLP's second weight is split on dim 1.
const std::string kDims = "layers=1,hidden=768,heads=8,vocab=4096,seq=16";
constexpr uint64_t kBlock = ptc::kChecksumBlockBytes;
const std::string kEmbedding = "language_model.embedding.word_embeddings.weight";
const std::string kFc2 = "language_model.encoder.layers.0.mlp.dense_4h_to_h.weight";

struct Opened {
  std::vector<std::vector<uint32_t>> crcs;  // per rank file of the tree
  std::map<std::string, uint64_t> read;     // tensor bytes read, by stored tensor
  uint64_t storage_bytes = 0;               // of every storage of every file
};

class MegatronCrcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = ptc::testing::Spec("megatron-gpt", kDims);
    ptc::testing::MakeStore(tmp_, spec_, *ptc::ParseConfig("tp=1,pp=1"), 7);
  }

  // The CRCs of every rank file of the tree in `config` over the store's
  // current generation (with `strip`: its block CRCs removed, as an older
  // manifest), counting the tensor bytes read; and the file served from them
  // equal to the one WriteMegatronFile writes.
  Opened Open(const std::string& config, bool strip) {
    auto store = ptc::Store::Open(ptc::Env::Default(), tmp_ / "store");
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    auto manifest = std::make_shared<ptc::GenerationManifest>((*store)->current());
    if (strip) {
      for (ptc::ShardRecord& s : manifest->shards) s.block_crc32s.clear();
    } else {
      for (const ptc::ShardRecord& s : manifest->shards) EXPECT_FALSE(s.block_crc32s.empty()) << s.tensor;
    }
    // As the mount reads: no shard verified whole on open, each range read checked (and counted) by `check`.
    const ptc::GenerationReader reader(**store, manifest, /*verify=*/false);
    const ptc::ModelLayout layout = ptc::testing::FitLayout(spec_, *ptc::ParseConfig(config));
    auto views = MegatronTreeViews(layout);
    EXPECT_TRUE(views.ok()) << views.status().ToString();
    Opened out;
    const ShardCheck count = [&](const ptc::ShardRecord& s, uint64_t, uint64_t n) {
      out.read[s.tensor] += n;
      return ptc::Status::OK();
    };
    for (const ptc::RankView& view : *views) {
      auto plan = PlanMegatronFile(spec_, layout.config(), view, {}, ptc::megatron::NameSet::kTe);
      EXPECT_TRUE(plan.ok()) << plan.status().ToString();
      for (const auto& s : plan->state.storages) {
        if (s.tensor != nullptr)
          out.storage_bytes += ptc::NumElements(s.tensor->shape) * ptc::DTypeSize(s.tensor->dtype);
      }
      auto crcs = StorageCrcs(reader, *plan, -1, count);
      EXPECT_TRUE(crcs.ok()) << crcs.status().ToString();
      out.crcs.push_back(*crcs);
      ExpectFileAsWritten(reader, *plan, *crcs, MegatronRankDir(view, layout.config()));
    }
    return out;
  }

  // The file served from `crcs` has the bytes of the one WriteMegatronFile writes.
  void ExpectFileAsWritten(const ptc::GenerationReader& reader, const MegatronFilePlan& plan,
                           const std::vector<uint32_t>& crcs, const std::string& name) {
    const std::string dir = tmp_ / ("written/" + name);
    std::filesystem::create_directories(dir);
    auto out = ptc::Env::Default()->OpenOutputDir(dir);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_TRUE(WriteMegatronFile(reader, plan, **out).ok()) << name;
    const std::string written = ptc::testing::Slurp(dir + "/" + std::string(ptc::megatron::kRankFile));
    auto file = MakeMegatronFile(reader, plan, crcs, -1);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    std::string served((*file)->size(), '\0');
    auto n = (*file)->Read(0, served.size(), served.data(),
                           [](const ptc::ShardRecord&, uint64_t, uint64_t) { return ptc::Status::OK(); });
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_TRUE(served == written) << name << ": the served file differs from the written one";
    std::filesystem::remove_all(dir);
  }

  TempDir tmp_;
  ptc::ModelSpec spec_;
};

uint64_t Sum(const std::map<std::string, uint64_t>& read) {
  uint64_t n = 0;
  for (const auto& [tensor, bytes] : read) n += bytes;
  return n;
}

// The bytes of [begin, end) of a stored piece that lie in blocks the range covers in part.
uint64_t EdgeBytes(uint64_t begin, uint64_t end, uint64_t piece) {
  uint64_t edge = 0;
  for (uint64_t b = begin / kBlock * kBlock; b < end; b += kBlock) {
    const uint64_t lo = std::max(b, begin), hi = std::min({b + kBlock, end, piece});
    if (lo != b || hi != std::min(b + kBlock, piece)) edge += hi - lo;
  }
  return edge;
}

TEST_F(MegatronCrcTest, AfterAnImportNoTensorByteIsRead) {
  const Opened composed = Open("tp=1,pp=1", /*strip=*/false);
  EXPECT_EQ(Sum(composed.read), 0u);
  const Opened read = Open("tp=1,pp=1", /*strip=*/true);
  EXPECT_EQ(Sum(read.read), read.storage_bytes);  // an older manifest: every byte, as before
  EXPECT_EQ(composed.crcs, read.crcs);
}

TEST_F(MegatronCrcTest, AfterATensorParallelChangeOnlyEdgesAndColumnSlicesAreRead) {
  auto [code, text] = ptc::testing::Ptcfs("transform " + tmp_ / "store --to tp=2,pp=1");
  ASSERT_EQ(code, 0) << text;
  Opened composed = Open("tp=2,pp=1", /*strip=*/false);
  const Opened read = Open("tp=2,pp=1", /*strip=*/true);
  EXPECT_EQ(composed.crcs, read.crcs);
  EXPECT_GE(Sum(read.read), read.storage_bytes);
  EXPECT_LT(Sum(composed.read), Sum(read.read));
  // Row slices (split on dim 0 in two) read the bytes of the blocks they cover in part only.
  for (const auto& [tensor, bytes] : std::vector<std::pair<std::string, uint64_t>>{
           {kEmbedding, 4096ull * 768 * 4},
           {"language_model.encoder.layers.0.self_attention.query_key_value.weight", 3ull * 768 * 768 * 4},
           {"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight", 3072ull * 768 * 4},
           {"language_model.encoder.layers.0.mlp.dense_h_to_4h.bias", 3072ull * 4}}) {
    EXPECT_EQ(composed.read[tensor], EdgeBytes(0, bytes / 2, bytes) + EdgeBytes(bytes / 2, bytes, bytes)) << tensor;
  }
  // The word embeddings (12 MiB) cut at 6 MiB: each half reads the 2 MiB of the middle block it holds.
  EXPECT_EQ(composed.read[kEmbedding], 4u << 20);
  // Column slices (strided runs) are read; replicated pieces (whole) not at all.
  EXPECT_GE(composed.read[kFc2], 768ull * 3072 * 4);
  EXPECT_EQ(composed.read.count("language_model.embedding.position_embeddings.weight"), 0u);
  EXPECT_EQ(composed.read.count("language_model.encoder.layers.0.input_layernorm.weight"), 0u);
}

}  // namespace
}  // namespace ptcfs
