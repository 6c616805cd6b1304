// Which rank files a compaction writes and which copies they hold
// (view/rank_files.h), without a store: the pure planner, its copy budget, the
// option's text, and the check that a generation holds a plan's files.
#include "view/rank_files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/store/model_spec.h"
#include "test_util.h"
#include "transform/plan.h"
#include "view/megatron_file.h"

namespace ptcfs {
namespace {

using namespace ::ptc::testing;
using Key = std::tuple<int, std::string, std::vector<ptc::Box>>;

constexpr const char* kDims = "layers=4,hidden=32,heads=4,vocab=128,seq=16";

std::vector<ptc::RankFileSpec> Plan(const std::string& config, uint64_t budget = RankFileOptions::kWorkerStored) {
  const ptc::ModelSpec spec = Spec("megatron-gpt", kDims, ptc::DType::kBF16, /*optimizer=*/true);
  auto planned = PlanRankFiles(FitLayout(spec, *ptc::ParseConfig(config)), RankFileOptions{budget});
  EXPECT_TRUE(planned.ok()) << planned.status().ToString();
  return planned.ok() ? *planned : std::vector<ptc::RankFileSpec>{};
}

// Placements are each stored piece once per worker; copies name a piece placed
// on the same worker; placements and copies of one file never overlap.
void ExpectConsistent(const std::vector<ptc::RankFileSpec>& files) {
  std::set<Key> placed;
  for (const auto& f : files) {
    for (const auto& p : f.placements) {
      EXPECT_TRUE(placed.insert({f.worker, p.tensor, p.boxes}).second) << f.name << " " << p.tensor;
      EXPECT_GE(p.offset, f.literals.at(0).bytes.size());
      EXPECT_LT(p.offset, f.size);
    }
  }
  for (const auto& f : files) {
    std::set<uint64_t> offsets;
    for (const auto& p : f.placements) offsets.insert(p.offset);
    for (const auto& c : f.copies) {
      EXPECT_TRUE(placed.count({f.worker, c.tensor, c.boxes})) << f.name << ": copy of unplaced " << c.tensor;
      EXPECT_TRUE(offsets.insert(c.offset).second) << f.name << ": two things at " << c.offset;
      EXPECT_GE(c.offset, f.literals.at(0).bytes.size());
      EXPECT_LT(c.offset, f.size);
    }
  }
}

TEST(RankFiles, TensorParallelReplicasGetCopiesOfTheFirstRanksPieces) {
  const auto files = Plan("tp=2,pp=1,dp=1,per_worker=2");
  ASSERT_EQ(files.size(), 4u);  // every file of both ranks
  ExpectConsistent(files);
  EXPECT_EQ(files[0].name, "rank-00000.model.safetensors");
  EXPECT_TRUE(files[0].copies.empty());  // the first file stores all it holds
  EXPECT_EQ(files[2].name, "rank-00001.model.safetensors");
  EXPECT_FALSE(files[2].copies.empty());      // rank 1's replicated norms and biases
  EXPECT_FALSE(files[2].placements.empty());  // and its own half of the split weights
  bool norm = false;
  for (const auto& c : files[2].copies) norm |= c.tensor.find("layernorm") != std::string::npos;
  EXPECT_TRUE(norm);
  // With one rank per worker nothing is shared: no copies.
  for (const auto& f : Plan("tp=2,pp=1,dp=1,per_worker=1")) EXPECT_TRUE(f.copies.empty()) << f.name;
}

TEST(RankFiles, DataParallelReplicasWithinTheBudget) {
  const std::string config = "tp=2,pp=1,dp=2,per_worker=4";
  const auto all = Plan(config, RankFileOptions::kAll);
  ASSERT_EQ(all.size(), 8u);
  ExpectConsistent(all);
  for (size_t i = 4; i < 8; ++i) {  // ranks 2 and 3 (dp 1) hold only copies
    EXPECT_TRUE(all[i].placements.empty()) << all[i].name;
    EXPECT_FALSE(all[i].copies.empty()) << all[i].name;
  }
  // No copies: the first version's layout, replicas' files not written, rank 1's without copies.
  const auto none = Plan(config, 0);
  ASSERT_EQ(none.size(), 4u);
  for (const auto& f : none) EXPECT_TRUE(f.copies.empty()) << f.name;
  // A budget admits the files with the fewest copy bytes first: rank 1's (norms and biases) before replicas.
  const auto small = Plan(config, 4096);
  ASSERT_EQ(small.size(), 4u);
  EXPECT_FALSE(small[2].copies.empty());
  EXPECT_EQ(small[2].name, "rank-00001.model.safetensors");
  // The default: as many copy bytes as the worker stores; with Adam state the model
  // replicas fit, the optimizer replicas (as large as what is stored) not both.
  const auto stored = Plan(config);
  ExpectConsistent(stored);
  std::set<std::string> names;
  for (const auto& f : stored) names.insert(f.name);
  EXPECT_TRUE(names.count("rank-00002.model.safetensors"));
  EXPECT_TRUE(names.count("rank-00003.model.safetensors"));
  EXPECT_LT(stored.size(), 8u);
}

TEST(RankFiles, CopyBudgetText) {
  EXPECT_EQ(*ParseCopyBudget("all"), RankFileOptions::kAll);
  EXPECT_EQ(*ParseCopyBudget("none"), 0u);
  EXPECT_EQ(*ParseCopyBudget("stored"), RankFileOptions::kWorkerStored);
  EXPECT_EQ(*ParseCopyBudget("0"), 0u);
  EXPECT_EQ(*ParseCopyBudget("4096"), 4096u);
  EXPECT_EQ(*ParseCopyBudget("64M"), 64u << 20);
  EXPECT_EQ(*ParseCopyBudget("2T"), 2ull << 40);
  for (const char* bad : {"", "-1", "1.5G", "12X", "G", "all ", "99999999999999999999", "16777216T"}) {
    auto r = ParseCopyBudget(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(),
              "'" + std::string(bad) + "': expected all, none, stored or a byte count (K, M, G, T suffixes)");
  }
}

TEST(RankFiles, WrittenOnlyWithEveryPlacementAndCopy) {
  const auto files = Plan("tp=2,pp=1,dp=1,per_worker=2");
  ptc::GenerationManifest m;
  for (const auto& f : files) {
    const std::string path = "gen-000002/worker-00/" + f.name;
    for (const auto& p : f.placements) {
      ptc::ShardRecord r;
      r.tensor = p.tensor;
      r.boxes = p.boxes;
      r.worker = f.worker;
      r.file = path;
      r.h5 = "gen-000002/worker-00/x.h5";
      r.offset = p.offset;
      m.shards.push_back(r);
    }
    ptc::RankFileCopies c{path, f.worker, {}};
    for (const auto& p : f.copies) c.copies.push_back({p.tensor, p.boxes, p.offset});
    if (!c.copies.empty()) m.rank_file_copies.push_back(c);
  }
  EXPECT_TRUE(RankFilesWritten(files, m));
  ptc::GenerationManifest lacking = m;
  lacking.rank_file_copies.back().copies.pop_back();
  EXPECT_FALSE(RankFilesWritten(files, lacking));
  lacking.rank_file_copies.clear();  // a covering over the same pieces lists no copies
  EXPECT_FALSE(RankFilesWritten(files, lacking));
}

// Megatron rank files: one model_optim_rng.pt per rank the tree shows (data
// parallel rank 0's), its literal ranges (zip records, pickle) ordered and
// apart from every placed byte, each storage's CRC in its zip headers; copies
// of the pieces a worker's earlier file stores. No Megatron inputs: refused.
TEST(RankFiles, MegatronTreeFiles) {
  const ptc::ModelSpec spec = Spec("megatron-gpt", kDims, ptc::DType::kBF16, /*optimizer=*/true);
  const ptc::ModelLayout layout = FitLayout(spec, *ptc::ParseConfig("tp=2,pp=2,dp=2,per_worker=4"));
  RankFileOptions options;
  options.format = RankFileFormat::kMegatron;
  EXPECT_EQ(PlanRankFiles(layout, options).status().code(), ptc::Code::kInvalidArgument);
  MegatronInputs none;  // no rank's CRCs (each another worker's): no files
  EXPECT_TRUE(PlanRankFiles(layout, options, &none)->empty());
  MegatronInputs in;
  std::vector<ptc::RankView> views;
  for (int rank = 0; rank < layout.config().world_size(); ++rank) views.push_back(*layout.View(rank));
  const std::vector<size_t> tree = MegatronRanks(views);
  ASSERT_EQ(tree.size(), 4u);
  for (size_t v : tree) {
    auto plan = PlanMegatronFile(spec, layout.config(), views[v], in.state, options.names);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::vector<uint32_t> crcs;
    for (size_t i = 0; i < plan->torch.storage_members.size(); ++i) crcs.push_back(0xC0DE0000u + i);
    in.crcs[views[v].rank] = crcs;
  }
  auto files = PlanRankFiles(layout, options, &in);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 4u);
  ExpectConsistent(*files);
  for (size_t i = 0; i < tree.size(); ++i) {
    const ptc::RankFileSpec& f = (*files)[i];
    EXPECT_EQ(f.name, ptc::RankDirName(views[tree[i]].rank) + ".model_optim_rng.pt");
    EXPECT_EQ(f.worker, layout.config().WorkerOf(views[tree[i]].rank));
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // literals, placements and copies
    std::string literal;
    for (const auto& l : f.literals) {
      ranges.push_back({l.offset, l.offset + l.bytes.size()});
      literal += l.bytes;
    }
    for (const auto* list : {&f.placements, &f.copies}) {
      for (const auto& p : *list) ranges.push_back({p.offset, p.offset + 1});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t r = 1; r < ranges.size(); ++r) EXPECT_LE(ranges[r - 1].second, ranges[r].first) << f.name;
    EXPECT_EQ(ranges.back().second, f.size) << f.name;  // the zip's end record last
    EXPECT_EQ(literal.substr(0, 4), std::string("PK\x03\x04", 4)) << f.name;
    const uint32_t crc = 0xC0DE0000u;  // the first storage's, little-endian in its local header
    EXPECT_NE(literal.find(std::string(reinterpret_cast<const char*>(&crc), 4)), std::string::npos) << f.name;
  }
  // Both tensor-parallel ranks of a stage are on one worker: the second's file copies the replicated norms.
  EXPECT_TRUE((*files)[0].copies.empty());
  EXPECT_FALSE((*files)[1].copies.empty());
}

// The generation of `layout` that a compaction with box_targets writes: one
// piece per box of every target shard (per worker), as records only.
ptc::GenerationManifest BoxPieces(const ptc::ModelLayout& layout, bool box_targets = true) {
  ptc::GenerationManifest m;
  EXPECT_TRUE(ptc::DescribeModel(layout.spec(), layout.config(), &m).ok());
  auto keys = ptc::transform::TargetShardKeys(layout);
  EXPECT_TRUE(keys.ok());
  for (const auto& [key, worker] : *keys) {
    if (!box_targets) {
      m.shards.push_back(ptc::ShardRecord{key.tensor, key.boxes, worker});
      continue;
    }
    for (const ptc::Box& box : key.boxes) m.shards.push_back(ptc::ShardRecord{key.tensor, {box}, worker});
  }
  return m;
}

// DCP rank files: one dcp.__W_0.distcp per worker, the DCP plan's file byte
// for byte: its zip records and objects literal, every chunk's storage a
// stored piece of that worker placed at the storage's offset, the two tiling
// the file. A piece of several boxes (a fused fc1 not stored per box) or
// torchtitan's woven heads leave the file to the daemon.
TEST(RankFiles, DcpChunkFiles) {
  const ptc::ModelSpec spec =
      Spec("llama", "layers=2,hidden=64,heads=4,kv_heads=2,vocab=128,seq=16", ptc::DType::kBF16, /*optimizer=*/true);
  const ptc::ModelLayout layout = FitLayout(spec, *ptc::ParseConfig("tp=2,pp=2,dp=1,per_worker=2"));
  RankFileOptions options;
  options.format = RankFileFormat::kDcp;
  EXPECT_EQ(PlanRankFiles(layout, options).status().code(), ptc::Code::kInvalidArgument);  // of a generation only
  const ptc::GenerationManifest m = BoxPieces(layout);
  for (const ptc::dcp::Keys keys : {ptc::dcp::Keys::kTorch, ptc::dcp::Keys::kMegatronCore}) {
    auto plan = ptc::dcp::PlanCheckpoint(m, keys);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto files = PlanDcpRankFiles(m, keys);
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    ASSERT_EQ(files->size(), 2u);
    ExpectConsistent(*files);
    std::map<Key, uint64_t> bytes;  // of every stored piece
    for (const ptc::ShardRecord& s : m.shards) {
      uint64_t n = 0;
      for (const ptc::Box& b : s.boxes) n += static_cast<uint64_t>(b.volume()) * 2;  // bf16
      bytes[{s.worker, s.tensor, s.boxes}] = n;
    }
    for (const ptc::TensorRecord& t : m.tensors) {
      if (t.dtype == ptc::DType::kF32) {
        for (auto& [key, n] : bytes) {
          if (std::get<1>(key) == t.name) n *= 2;
        }
      }
    }
    std::set<Key> placed;
    for (size_t i = 0; i < files->size(); ++i) {
      const ptc::RankFileSpec& f = (*files)[i];
      const ptc::dcp::File& d = plan->files[i];
      EXPECT_EQ(f.name, (keys == ptc::dcp::Keys::kTorch ? "dcp." : "torch_dist.") + d.name);
      EXPECT_EQ(f.worker, d.worker);
      EXPECT_EQ(f.size, d.size);
      EXPECT_TRUE(f.copies.empty());
      std::vector<std::pair<uint64_t, uint64_t>> ranges;
      for (const auto& l : f.literals) ranges.push_back({l.offset, l.offset + l.bytes.size()});
      for (const auto& p : f.placements) {
        const Key key{f.worker, p.tensor, p.boxes};
        ASSERT_EQ(p.boxes.size(), 1u) << p.tensor;
        ASSERT_TRUE(bytes.count(key)) << f.name << ": " << p.tensor << " is no piece of worker " << f.worker;
        placed.insert(key);
        ranges.push_back({p.offset, p.offset + bytes[key]});
      }
      std::sort(ranges.begin(), ranges.end());
      uint64_t at = 0;
      for (const auto& [begin, end] : ranges) {
        EXPECT_EQ(begin, at) << f.name;  // literals and pieces tile the file
        at = end;
      }
      EXPECT_EQ(at, f.size) << f.name;
    }
    for (const auto& [key, n] : bytes) {
      if (n > 0) {
        EXPECT_TRUE(placed.count(key)) << std::get<1>(key) << " on worker " << std::get<0>(key);
      }
    }
  }
  // fc1's two boxes (gate and up) as one piece: no chunk is that piece, no file.
  auto fused = PlanDcpRankFiles(BoxPieces(layout, /*box_targets=*/false), ptc::dcp::Keys::kTorch);
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  EXPECT_TRUE(fused->empty());
}

}  // namespace
}  // namespace ptcfs
