// PyTorch DCP of a generation (ptc/checkpoint/dcp/dcp.h, view/dcp_file.h) without a
// mount or torch: the chunk boxes tile every tensor where its pieces are cut
// (replicas once), the keys follow the documented rule, bad manifests are
// refused naming the tensor, and every chunk of the rendered files is a
// torch.save file whose tensor equals the global tensor's box read straight
// from the store. (torch's own dcp.load of the mount: clients_test.)
#include "ptc/checkpoint/dcp/dcp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "ptc/checkpoint/dcp/entries.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/format/torch_file.h"
#include "test_util.h"
#include "view/dcp_file.h"
#include "view/export.h"

namespace ptc::dcp {
namespace {

using ::ptc::testing::TempDir;

Box B(std::vector<Index> begin, std::vector<Index> end) { return Box{std::move(begin), std::move(end)}; }

ShardRecord Piece(const std::string& tensor, std::vector<Box> boxes, int worker) {
  ShardRecord s;
  s.tensor = tensor;
  s.boxes = std::move(boxes);
  s.worker = worker;
  s.file = "gen-000001/worker-0" + std::to_string(worker) + "/" + tensor + ".h5";
  return s;
}

// Every byte of the plan's file `f` as the mount serves it.
Result<std::string> DcpFileBytes(const GenerationReader& reader, const Plan& plan, size_t f) {
  auto file = ptcfs::MakeDcpFile(reader, plan, f, -1);
  if (!file.ok()) return file.status();
  std::string bytes((*file)->size(), '\0');
  auto n =
      (*file)->Read(0, bytes.size(), bytes.data(), [](const ShardRecord&, uint64_t, uint64_t) { return Status::OK(); });
  if (!n.ok()) return n.status();
  if (*n != bytes.size()) return CorruptionError("short read of file " + std::to_string(f));
  return bytes;
}

// Each of `tensors` reads the same from `a` and `b`. With `masters_from_parameters`, `b`'s
// fp32 master `X.fp32` equals `a`'s parameter `X` (a torchtitan export imported again: it saves
// no masters, so the import makes them of the parameters).
void ExpectSameTensors(const GenerationReader& a, const GenerationReader& b, const std::vector<TensorRecord>& tensors,
                       bool masters_from_parameters = false) {
  for (const TensorRecord& t : tensors) {
    const bool master = masters_from_parameters && t.name.ends_with(".fp32");
    const std::string from = master ? t.name.substr(0, t.name.size() - 5) : t.name;
    const Box full = Box::Full(t.shape);
    std::string x(static_cast<size_t>(full.volume()) * DTypeSize(t.dtype), '\0'), y = x;
    ASSERT_TRUE(a.Read(from, full, x.data(), full, DenseLayout(full)).ok()) << from;
    ASSERT_TRUE(b.Read(t.name, full, y.data(), full, DenseLayout(full)).ok()) << t.name;
    EXPECT_TRUE(x == y) << t.name;
  }
}

TEST(DcpBoxes, DisjointPiecesStayWholeReplicasDropOverlapsSplit) {
  const Box left = B({0, 0}, {4, 8}), right = B({4, 0}, {8, 8});
  auto out = DisjointBoxes({left, right, left, right});  // two workers with the same pieces
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], std::make_pair(left, size_t{0}));
  EXPECT_EQ(out[1], std::make_pair(right, size_t{1}));
  // A piece cut differently from an earlier one: only what is not covered yet, from it.
  out = DisjointBoxes({left, B({2, 0}, {8, 8})});
  Index volume = 0;
  for (const auto& [box, source] : out) {
    volume += box.volume();
    if (source == 1) {
      EXPECT_FALSE(Intersect(box, left)) << box.ToString();
    }
  }
  EXPECT_EQ(volume, 64);
}

TEST(DcpPlan, KeysFollowTheRuleAndChunksGoToTheirWorkersFile) {
  GenerationManifest m;
  m.tensors = {{"w", DType::kBF16, {8, 8}},
               {"w.exp_avg", DType::kF32, {8, 8}},
               {"w.fp32", DType::kF32, {8, 8}},
               {"norm.exp_avg", DType::kF32, {8}}};  // no parameter "norm": a tensor of its own name
  m.shards = {Piece("w", {B({0, 0}, {4, 8})}, 0),
              Piece("w", {B({4, 0}, {8, 8})}, 1),
              Piece("w", {B({4, 0}, {8, 8})}, 0),
              Piece("w.exp_avg", {B({0, 0}, {8, 8})}, 1),
              Piece("w.fp32", {B({0, 0}, {8, 4}), B({0, 4}, {8, 8})}, 0),
              Piece("norm.exp_avg", {B({0}, {8})}, 0)};
  auto plan = PlanCheckpoint(m);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> keys;
  for (const Tensor& t : plan->tensors) keys.push_back(t.key);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"model.w", "optim.state.w.exp_avg", "optim.state.w.fp32", "model.norm.exp_avg"}));
  EXPECT_EQ(plan->tensors[1].path, (std::vector<std::string>{"optim", "state", "w", "exp_avg"}));
  ASSERT_EQ(plan->files.size(), 2u);
  EXPECT_EQ(plan->files[0].name, "__0_0.distcp");
  EXPECT_EQ(plan->files[1].name, "__1_0.distcp");
  std::map<std::string, std::vector<Box>> chunks;  // "file:key" -> boxes
  std::set<std::string> objects;                   // "file:key"
  for (const File& f : plan->files) {
    uint64_t offset = 0;
    for (const Chunk& c : f.chunks) {
      EXPECT_EQ(c.offset, offset);
      offset += c.size;
      if (c.object >= 0) {
        objects.insert(f.name + ":" + plan->objects[static_cast<size_t>(c.object)].key);
        continue;
      }
      chunks[f.name + ":" + plan->tensors[c.tensor].key].push_back(c.box);
    }
    EXPECT_EQ(f.size, offset);
  }
  // The optimizer's objects, in the first file: w's step (a 0-dim tensor) and Megatron's two
  // groups' settings as torch flattens get_optimizer_state_dict's param_groups list.
  for (const char* key :
       {"optim.state.w.step", "optim.param_groups.0.lr", "optim.param_groups.0.betas", "optim.param_groups.0.params",
        "optim.param_groups.1.weight_decay", "optim.param_groups.1.params"}) {
    EXPECT_EQ(objects.count(std::string("__0_0.distcp:") + key), 1u) << key;
  }
  EXPECT_EQ(objects.count("__0_0.distcp:optim.state.norm.exp_avg.step"), 0u);  // no optimizer state of its own
  ASSERT_FALSE(plan->objects.empty());
  EXPECT_TRUE(plan->objects[0].scalar);
  EXPECT_EQ(plan->objects[0].dtype, DType::kF32);
  // A box stored on several workers: in the lowest one's file.
  EXPECT_EQ(chunks["__0_0.distcp:model.w"], (std::vector<Box>{B({0, 0}, {4, 8}), B({4, 0}, {8, 8})}));
  EXPECT_EQ(chunks.count("__1_0.distcp:model.w"), 0u);
  EXPECT_EQ(chunks["__0_0.distcp:optim.state.w.fp32"].size(), 2u);  // each box of a piece
  EXPECT_EQ(chunks["__1_0.distcp:optim.state.w.exp_avg"].size(), 1u);
  EXPECT_EQ(plan->files[0].worker, 0);
  EXPECT_EQ(plan->files[1].worker, 1);

  // The order of the manifest's records does not change the plan (a
  // compaction's threads commit them in any order; its rank files are laid
  // out before).
  std::reverse(m.shards.begin(), m.shards.end());
  auto reversed = PlanCheckpoint(m);
  ASSERT_TRUE(reversed.ok()) << reversed.status().ToString();
  ASSERT_EQ(reversed->files.size(), plan->files.size());
  for (size_t f = 0; f < plan->files.size(); ++f) {
    ASSERT_EQ(reversed->files[f].chunks.size(), plan->files[f].chunks.size());
    for (size_t c = 0; c < plan->files[f].chunks.size(); ++c) {
      const Chunk &x = plan->files[f].chunks[c], &y = reversed->files[f].chunks[c];
      EXPECT_TRUE(x.tensor == y.tensor && x.box == y.box && x.offset == y.offset && x.object == y.object)
          << plan->files[f].name << " chunk " << c;
    }
  }
}

TEST(DcpPlan, RefusesWhatIsNoCheckpointNamingTheTensor) {
  GenerationManifest m;
  m.tensors = {{"w", DType::kF32, {8, 8}}};
  m.shards = {Piece("w", {B({0, 0}, {4, 8})}, 0)};
  auto plan = PlanCheckpoint(m);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("tensor w: the stored pieces hold 32 of its 64 elements"), std::string::npos)
      << plan.status().ToString();
  m.shards = {Piece("w", {B({0, 0}, {8, 8})}, 0), Piece("v", {B({0, 0}, {8, 8})}, 0)};
  plan = PlanCheckpoint(m);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("a stored piece of v"), std::string::npos) << plan.status().ToString();
  m.shards = {Piece("w", {B({0, 0}, {8, 9})}, 0)};
  plan = PlanCheckpoint(m);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("tensor w: stored box [0:8, 0:9] lies outside [8, 8]"), std::string::npos)
      << plan.status().ToString();
}

// Every chunk of every rendered file against the store, for a store imported in
// a layout whose pieces are cut on both dims (tp) and across stages (pp).
TEST(DcpFile, EveryChunkIsATorchFileOfItsBox) {
  TempDir tmp;
  Env* env = Env::Default();
  const ModelSpec spec = ::ptc::testing::Spec("llama", "layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32",
                                              DType::kBF16, /*adam=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = Store::Open(env, tmp / "store");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto generation = (*store)->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  GenerationReader reader(**store, generation, /*verify=*/true);
  std::set<std::string> keys;
  size_t chunks = 0;
  for (size_t i = 0; i < plan->files.size(); ++i) {
    auto read = DcpFileBytes(reader, *plan, i);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    const std::string& bytes = *read;
    for (const Chunk& c : plan->files[i].chunks) {
      if (c.object >= 0) continue;  // the optimizer's step and groups (DcpOptimizer)
      const Tensor& t = plan->tensors[c.tensor];
      const ::ptc::testing::StringFile blob(bytes.substr(c.offset, c.size), t.key);
      auto tf = ReadTorchFile(blob, t.key);
      ASSERT_TRUE(tf.ok()) << t.key << ": " << tf.status().ToString();
      ASSERT_TRUE(tf->root.is_tensor()) << t.key;
      EXPECT_EQ(tf->root.tensor().shape, c.box.shape()) << t.key;
      EXPECT_EQ(tf->root.tensor().dtype, t.dtype) << t.key;
      auto got = ReadTensorBytes(blob, *tf, tf->root.tensor(), t.key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::string want(static_cast<size_t>(c.box.volume()) * DTypeSize(t.dtype), '\0');
      ASSERT_TRUE(reader.Read(t.name, c.box, want.data(), c.box, DenseLayout(c.box)).ok());
      EXPECT_TRUE(*got == want) << t.key << " " << c.box.ToString();
      keys.insert(t.key);
      ++chunks;
    }
  }
  EXPECT_EQ(keys.size(), generation->tensors.size());
  EXPECT_GT(chunks, keys.size());  // tp pieces: more chunks than tensors
  // The .metadata names only DCP's classes, torch's dtypes, Size and layout helpers.
  const std::string metadata = EncodeMetadata(*plan);
  EXPECT_EQ(metadata.substr(0, 2), "\x80\x02");
  for (const char* name : {"torch.distributed.checkpoint.metadata\nMetadata", "torch\nSize", "torch\nbfloat16",
                           "torch.distributed.checkpoint.filesystem\n_StorageInfo"}) {
    EXPECT_NE(metadata.find(name), std::string::npos) << name;
  }
}

// .metadata as ptcfs writes it reads back as it was planned.
TEST(DcpMetadata, ParsesWhatEncodeMetadataWrites) {
  GenerationManifest m;
  m.tensors = {{"w", DType::kBF16, {8, 6}}, {"w.exp_avg", DType::kF32, {8, 6}}};
  m.shards = {Piece("w", {B({0, 0}, {4, 6})}, 0), Piece("w", {B({4, 0}, {8, 6})}, 1),
              Piece("w.exp_avg", {B({0, 0}, {8, 6})}, 0)};
  auto plan = PlanCheckpoint(m);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto saved = ParseMetadata(EncodeMetadata(*plan), ".metadata");
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_EQ(saved->tensors.size(), 3u);  // w, its exp_avg, its step
  EXPECT_EQ(saved->tensors[0].key, "model.w");
  EXPECT_EQ(saved->tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(saved->tensors[0].shape, (Shape{8, 6}));
  ASSERT_EQ(saved->tensors[0].chunks.size(), 2u);
  const SavedChunk& second = saved->tensors[0].chunks[1];
  EXPECT_EQ(second.box, B({4, 0}, {8, 6}));
  EXPECT_EQ(second.file, "__1_0.distcp");
  EXPECT_EQ(second.offset, 0u);
  EXPECT_EQ(second.length, plan->files[1].chunks[0].size);
  EXPECT_EQ(saved->tensors[1].key, "optim.state.w.exp_avg");
  EXPECT_EQ(saved->tensors[2].key, "optim.state.w.step");
  EXPECT_EQ(saved->tensors[2].shape, Shape{});
  ASSERT_EQ(saved->tensors[2].chunks.size(), 1u);
  EXPECT_EQ(saved->tensors[2].chunks[0].box.volume(), 1);
  std::set<std::string> bytes;
  for (const SavedBytes& b : saved->bytes) {
    bytes.insert(b.key);
    EXPECT_EQ(b.file, "__0_0.distcp") << b.key;
    EXPECT_GT(b.length, 0u) << b.key;
  }
  EXPECT_EQ(bytes.count("optim.param_groups.0.params"), 1u);
  EXPECT_EQ(bytes.count("optim.param_groups.1.eps"), 1u);
  EXPECT_EQ(TensorOfKey("model.w"), "w");
  EXPECT_EQ(TensorOfKey("optim.state.w.exp_avg"), "w.exp_avg");
  EXPECT_EQ(TensorOfKey("optim.state.w.step"), "");
  EXPECT_EQ(TensorOfKey("optimizer.w"), "");
}

TEST(DcpMetadata, RefusesNamingTheEntry) {
  auto expect_refused = [](const std::string& data, const std::string& part) {
    auto saved = ParseMetadata(data, "ckpt/.metadata");
    ASSERT_FALSE(saved.ok()) << part;
    EXPECT_NE(saved.status().message().find(part), std::string::npos) << saved.status().ToString();
    EXPECT_NE(saved.status().message().find("ckpt/.metadata"), std::string::npos) << saved.status().ToString();
  };
  expect_refused(
      "\x80\x02"
      "cos\nsystem\n.",
      "unknown global 'os.system'");
  expect_refused(pickle::Pickle(pickle::Value::Dict()), "not a torch.distributed.checkpoint.metadata.Metadata");
  GenerationManifest m;
  m.tensors = {{"w", DType::kF32, {8}}};
  m.shards = {Piece("w", {B({0}, {8})}, 0)};
  Plan plan = *PlanCheckpoint(m);
  plan.files[0].name = "../x";
  expect_refused(EncodeMetadata(plan), "relative_path '../x' is not a file name of the directory");
  plan.files[0].name = "__0_0.distcp";
  plan.files[0].chunks[0].box = B({4}, {12});
  expect_refused(EncodeMetadata(plan), "model.w: chunk at [4] of sizes [8] lies outside [8]");
}

// A checkpoint exported (as torch would read it) imported into a new store
// holds the same tensors; a damaged one is refused naming the chunk, and no
// store is made.
class DcpImport : public ::testing::Test {
 protected:
  void SetUp() override {
    Env* env = Env::Default();
    spec_ = ::ptc::testing::Spec("llama", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16", DType::kBF16,
                                 /*adam=*/true);
    const ParallelConfig config = *ParseConfig("tp=2,pp=2");
    ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec_, config), 3, tmp_ / "src").ok());
    ASSERT_TRUE(ImportCheckpoint(env, tmp_ / "src", tmp_ / "store", spec_.schema, spec_.dims, config).ok());
    store_ = std::move(Store::Open(env, tmp_ / "store")).value();
    ASSERT_TRUE(ptcfs::ExportDcp(env, *store_, store_->CurrentSnapshot(), tmp_ / "dcp").ok());
    plan_ = *PlanCheckpoint(*store_->CurrentSnapshot());
  }
  Result<ImportResult> Import(const std::string& to) {
    return ImportDcp(Env::Default(), tmp_ / "dcp", tmp_ / to, spec_.schema, spec_.dims, *ParseConfig("tp=1"));
  }
  void ExpectRefused(const Plan& plan, const std::string& part) {
    ::ptc::testing::Spit(tmp_ / "dcp/.metadata", EncodeMetadata(plan));
    auto result = Import("bad");
    ASSERT_FALSE(result.ok()) << part;
    EXPECT_NE(result.status().message().find(part), std::string::npos) << result.status().ToString();
    EXPECT_FALSE(std::filesystem::exists(tmp_ / "bad")) << part;
  }
  // Every tensor of store_ reads back the same from `copy`.
  void ExpectSameTensors(const Store& copy) {
    GenerationReader a(*store_, store_->CurrentSnapshot(), true), b(copy, copy.CurrentSnapshot(), true);
    ::ptc::dcp::ExpectSameTensors(a, b, store_->current().tensors);
  }
  TempDir tmp_;
  ModelSpec spec_;
  std::unique_ptr<Store> store_;
  Plan plan_;
};

TEST_F(DcpImport, ImportsEveryTensorBitForBit) {
  auto result = Import("copy");
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  auto copy = std::move(Store::Open(Env::Default(), tmp_ / "copy")).value();
  EXPECT_EQ(ParseConfig(copy->current().config)->ToString(), "tp=1,pp=1,dp=1,per_worker=8");
  ExpectSameTensors(*copy);
}

// Issue 41, item 6: 32k chunks took 24 s to check (every pair compared), and
// each empty chunk became a stored file. Empty chunks are accepted and store
// nothing; the check sorts instead of comparing every pair (bench/RESULTS.md:
// 10^5 chunks).
TEST_F(DcpImport, EmptyChunksStoreNothingAndManyChunksCheckQuickly) {
  auto plain = Import("plain");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  Plan plan = plan_;
  const Chunk first = plan.files[0].chunks[0];
  ASSERT_EQ(first.box.rank(), 2u);
  // At every offset no chunk starts at (DCP keys a chunk's storage by its
  // tensor and offset): [r:r, c:c], no element.
  for (Index r = 0; r <= 64; ++r) {
    for (Index c = 1; c <= 32; ++c) {
      Chunk empty = first;
      empty.box = B({r, c}, {r, c});
      plan.files[0].chunks.push_back(empty);
    }
  }
  ::ptc::testing::Spit(tmp_ / "dcp/.metadata", EncodeMetadata(plan));
  auto result = Import("copy");
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  auto copy = std::move(Store::Open(Env::Default(), tmp_ / "copy")).value();
  ExpectSameTensors(*copy);
  auto files = [](const std::string& dir) {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.is_regular_file();
    return n;
  };
  EXPECT_EQ(files(tmp_ / "copy"), files(tmp_ / "plain"));
  // An overlap among many chunks is still found: one row block cut into
  // 20000 one-element chunks, and one of them moved onto its neighbour.
  plan = plan_;
  Chunk& row = plan.files[0].chunks[0];
  ASSERT_EQ(row.box, B({0, 0}, {32, 32}));
  std::vector<Chunk> cells;
  for (Index r = 0; r < 32; ++r) {
    for (Index c = 0; c < 32; ++c) {
      Chunk cell = row;
      cell.box = B({r, c}, {r + 1, c + 1});
      cells.push_back(cell);
    }
  }
  cells[700].box = B({21, 29}, {22, 30});  // cell (21, 28) moved onto (21, 29)
  plan.files[0].chunks.erase(plan.files[0].chunks.begin());
  plan.files[0].chunks.insert(plan.files[0].chunks.begin(), cells.begin(), cells.end());
  ExpectRefused(plan, "chunk [21:22, 29:30]");
}

TEST_F(DcpImport, RefusesADamagedCheckpointNamingTheChunk) {
  Plan plan = plan_;
  plan.files[0].chunks.erase(plan.files[0].chunks.begin());  // the first tensor's first chunk
  ExpectRefused(plan, "key model.embedding.word_embeddings.weight: the chunks hold 1024 of its 2048 elements");
  plan = plan_;
  ASSERT_EQ(plan.files[0].chunks[1].box, B({32, 0}, {64, 32}));
  plan.files[0].chunks[1].box = B({16, 0}, {48, 32});  // half over the first chunk
  ExpectRefused(plan, "overlaps chunk");
  plan = plan_;
  plan.files[0].chunks[0].offset += 1;  // not where its torch.save file starts
  ExpectRefused(plan, "key model.embedding.word_embeddings.weight, chunk [0:32, 0:32] (__0_0.distcp bytes 1+");
  plan = plan_;
  plan.files[0].chunks[0].size = plan.files[0].size + 1;  // past the file's end
  ExpectRefused(plan, "lies past the end of the file");
  plan = plan_;
  plan.tensors[0].key = "model.embedding.weight";
  ExpectRefused(plan, "key model.embedding.weight: the model has no tensor embedding.weight");
  plan = plan_;
  plan.tensors[0].key = "extra.thing";
  ExpectRefused(plan, "key extra.thing names no tensor ptcfs keeps");
  std::filesystem::remove(tmp_ / ("dcp/" + plan_.files[0].name));
  ExpectRefused(plan_, "__0_0.distcp");
}

// Megatron-Core's keys: each layer's tensors stacked under one key, the
// optimizer state under optimizer.state.*, each layer module's _extra_state an
// object; read back (each stacked chunk to its layer's tensor) into a store
// that then holds the same tensors.
TEST_F(DcpImport, MegatronCoreKeysStackTheLayersAndReadBack) {
  auto plan = PlanCheckpoint(*store_->CurrentSnapshot(), Keys::kMegatronCore);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, Shape> shapes;
  for (const Tensor& t : plan->tensors) shapes[t.key] = KeyShape(t);
  EXPECT_EQ(shapes["decoder.layers.self_attention.linear_qkv.weight"], (Shape{2, 64, 32}));
  EXPECT_EQ(shapes["optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"], (Shape{2, 32, 128}));
  EXPECT_EQ(shapes["optimizer.state.fp32_param.embedding.word_embeddings.weight"], (Shape{64, 32}));
  EXPECT_EQ(shapes.count("decoder.layers.0.self_attention.linear_qkv.weight"), 0u);
  ASSERT_EQ(plan->objects.size(), 2u * 5u);
  EXPECT_EQ(plan->objects[1].key, "decoder.layers.self_attention.linear_qkv._extra_state/shard_0_2");
  ASSERT_TRUE(
      ptcfs::ExportDcp(Env::Default(), *store_, store_->CurrentSnapshot(), tmp_ / "mcore", {}, Keys::kMegatronCore)
          .ok());
  auto saved = ParseMetadata(::ptc::testing::Slurp(tmp_ / "mcore/.metadata"), "mcore/.metadata");
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->bytes.size(), 10u);
  auto source =
      OpenDcp(Env::Default(), tmp_ / "mcore", spec_.schema, spec_.dims, *ParseConfig("tp=1"), Keys::kMegatronCore);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto copy = std::move(Store::Create(Env::Default(), tmp_ / "copy")).value();
  ASSERT_TRUE(WriteDcp(copy.get(), *source, nlohmann::json::object(), "").ok());
  ExpectSameTensors(*copy);
}

// torchtitan's keys: its names, q and k rows in its RoPE order (every chunk of
// the rendered files against rows read straight from linear_qkv), no key for
// the fp32 masters; the checkpoint imports (told by its keys) back into the
// same tensors, the masters from the float32 parameters; a save of bf16
// parameters with optimizer state is refused naming the key.
TEST(DcpTorchtitan, KeysPermuteQueryAndKeyRowsAndReadBack) {
  TempDir tmp;
  Env* env = Env::Default();
  const Index heads = 4, groups = 2, hd = 8, hidden = 32;
  const ModelSpec spec = ::ptc::testing::Spec("llama", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16",
                                              DType::kF32, /*adam=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp / "store")).value();
  auto generation = store->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation, Keys::kTorchtitan);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, Shape> shapes;
  for (const Tensor& t : plan->tensors) shapes[t.key] = KeyShape(t);
  EXPECT_EQ(shapes["layers.1.attention.qkv_linear.wq.weight"], (Shape{heads * hd, hidden}));
  EXPECT_EQ(shapes["layers.0.attention.qkv_linear.wk.weight"], (Shape{groups * hd, hidden}));
  EXPECT_EQ(shapes["optimizer.state.layers.1.feed_forward.w3.weight.exp_avg_sq"], (Shape{128, hidden}));
  EXPECT_EQ(shapes["optimizer.state.layers.0.attention.qkv_linear.wqkv.weight.exp_avg"],
            (Shape{(heads + 2 * groups) * hd, hidden}));
  EXPECT_EQ(shapes.count("optimizer.state.layers.0.attention.qkv_linear.wq.weight.exp_avg"), 0u);
  EXPECT_EQ(shapes["tok_embeddings.weight"], (Shape{64, hidden}));
  // 3 + 2*9 parameters, and the two moments of the optimizer's 3 + 2*7 (wq, wk, wv one wqkv); no masters.
  EXPECT_EQ(shapes.size(), 21u + 2u * 17u);
  // Key row r of wq (head h, r = h*hd + 2i + t) is row i + t*hd/2 of head h in linear_qkv,
  // whose groups hold their heads' q rows, then k, then v; wqkv is linear_qkv's rows with
  // the q and k heads woven so.
  const Index per = heads / groups;
  auto src_row = [&](const std::string& key, Index r) {
    const Index i = (r % hd) / 2, t = r % 2;
    if (key.find(".wqkv.") != std::string::npos) {
      const Index slot = (r % ((per + 2) * hd)) / hd;  // q heads, k, v of the group
      return slot <= per ? r - r % hd + t * hd / 2 + i : r;
    }
    const Index h = r / hd;
    const bool q = key.find(".wq.") != std::string::npos;
    const Index g = q ? h / per : h, base = g * (per + 2) * hd + (q ? (h % per) * hd : per * hd);
    return base + t * hd / 2 + i;
  };
  GenerationReader reader(*store, generation, /*verify=*/true);
  size_t checked = 0;
  std::set<std::string> parts;  // files holding chunks
  for (size_t f = 0; f < plan->files.size(); ++f) {
    auto read = DcpFileBytes(reader, *plan, f);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    const std::string& bytes = *read;
    for (const Chunk& c : plan->files[f].chunks) {
      if (c.object >= 0) continue;
      const Tensor& t = plan->tensors[c.tensor];
      // A __W_0.distcp chunk is a whole stored box (a rank file may hold it); the others are in __W_1.
      const std::vector<Segment> segments = ChunkSegments(t, c.box);
      const bool whole = segments.size() == 1 && segments[0].layout == DenseLayout(segments[0].box, 0) &&
                         std::any_of(generation->shards.begin(), generation->shards.end(), [&](const ShardRecord& s) {
                           return s.tensor == segments[0].tensor &&
                                  std::find(s.boxes.begin(), s.boxes.end(), segments[0].box) != s.boxes.end();
                         });
      EXPECT_EQ(whole, plan->files[f].name.ends_with("_0.distcp")) << plan->files[f].name << " " << t.key;
      parts.insert(plan->files[f].name);
      if (t.key.find(".wq.") == std::string::npos && t.key.find(".wk.") == std::string::npos &&
          t.key.find(".wqkv.") == std::string::npos) {
        continue;
      }
      const ::ptc::testing::StringFile blob(bytes.substr(c.offset, c.size), t.key);
      auto tf = ReadTorchFile(blob, t.key);
      ASSERT_TRUE(tf.ok()) << tf.status().ToString();
      auto got = ReadTensorBytes(blob, *tf, tf->root.tensor(), t.key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (Index r = c.box.begin[0]; r < c.box.end[0]; ++r) {
        const Box row = B({src_row(t.key, r), 0}, {src_row(t.key, r) + 1, hidden});
        std::string want(hidden * 4, '\0');
        ASSERT_TRUE(reader.Read(t.name, row, want.data(), row, DenseLayout(row)).ok());
        EXPECT_EQ(got->substr(static_cast<size_t>((r - c.box.begin[0]) * hidden * 4), want.size()), want)
            << t.key << " row " << r;
        ++checked;
      }
    }
  }
  // 2 layers: the wq and wk rows of the parameters, the wqkv rows of both moments.
  EXPECT_EQ(checked, 2u * ((heads + groups) * hd + 2u * (heads + 2 * groups) * hd));
  EXPECT_EQ(parts, (std::set<std::string>{"__0_0.distcp", "__0_1.distcp"}));
  // Exported and imported (the keys tell torchtitan's): the same tensors, masters = parameters.
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, generation, tmp / "titan", {}, Keys::kTorchtitan).ok());
  auto source = OpenDcp(env, tmp / "titan", spec.schema, spec.dims, *ParseConfig("tp=1"));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto copy = std::move(Store::Create(env, tmp / "copy")).value();
  ASSERT_TRUE(WriteDcp(copy.get(), *source, nlohmann::json::object(), "").ok());
  GenerationReader back(*copy, copy->CurrentSnapshot(), true);
  for (const TensorRecord& t : generation->tensors) {
    const bool master = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".fp32") == 0;
    const std::string from = master ? t.name.substr(0, t.name.size() - 5) : t.name;
    const Box full = Box::Full(t.shape);
    std::string x(static_cast<size_t>(full.volume()) * 4, '\0'), y = x;
    ASSERT_TRUE(reader.Read(from, full, x.data(), full, DenseLayout(full)).ok());
    ASSERT_TRUE(back.Read(t.name, full, y.data(), full, DenseLayout(full)).ok()) << t.name;
    EXPECT_TRUE(x == y) << t.name;
  }
  // bf16 parameters with optimizer state: torchtitan has no masters to take them from.
  const ModelSpec bf16 = ::ptc::testing::Spec("llama", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16",
                                              DType::kBF16, /*adam=*/true);
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(bf16, config), 3, tmp / "src16").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src16", tmp / "store16", bf16.schema, bf16.dims, config).ok());
  auto store16 = std::move(Store::Open(env, tmp / "store16")).value();
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store16, store16->CurrentSnapshot(), tmp / "titan16", {}, Keys::kTorchtitan).ok());
  auto refused = OpenDcp(env, tmp / "titan16", bf16.schema, bf16.dims, *ParseConfig("tp=1"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("key lm_head.weight is BF16: torchtitan keeps no fp32 masters"),
            std::string::npos)
      << refused.status().ToString();
  // A schema without Llama's names has none of torchtitan's.
  const ModelSpec gpt =
      ::ptc::testing::Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16", DType::kF32, /*adam=*/false);
  auto names = TorchtitanTensors(gpt);
  ASSERT_FALSE(names.ok());
  EXPECT_NE(names.status().message().find("torchtitan's names are Llama's"), std::string::npos)
      << names.status().ToString();
}

// torch's keys of an MoE store: each expert's tensors under their global names
// (model.decoder.layers.I.mlp.experts.local_experts.E...), their ZeRO-1 optimizer
// state cut from the expert flat buffers over edp and the rest over dp: chunks tile
// every tensor where those pieces cut it, and the export imports back whole at tp=1.
// A carried tensor with dims (torchtitan's expert_bias_E) keeps its shape in the
// manifest; a shape that is no list of sizes, or on an object, is refused naming the key.
TEST(DcpMoe, CarriedExpertBiasKeepsItsShapeInTheManifest) {
  const CarriedEntry bias{"layers.1.moe.expert_bias_E", /*scalar=*/true, DType::kF32, "abc", Shape{4}};
  nlohmann::json extra = nlohmann::json::object();
  SetSavedEntries({bias}, "step-3", &extra);
  auto back = EntriesOf(extra, "manifest");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->front(), bias);
  EXPECT_TRUE(ExpertBiasKey(bias.key));
  EXPECT_TRUE(CarriedTensorKey(bias.key, Keys::kTorchtitan));
  EXPECT_FALSE(CarriedTensorKey(bias.key, Keys::kTorch));
  EXPECT_FALSE(ExpertBiasKey("layers.1.moe.expert_bias_E.x"));
  for (const nlohmann::json& shape : {nlohmann::json({-1}), nlohmann::json("4"), nlohmann::json({1.5})}) {
    nlohmann::json bad = extra;
    bad[kEntriesKey][0]["shape"] = shape;
    auto refused = EntriesOf(bad, "manifest");
    ASSERT_FALSE(refused.ok()) << shape.dump();
    EXPECT_NE(refused.status().message().find("layers.1.moe.expert_bias_E"), std::string::npos)
        << refused.status().ToString();
  }
  nlohmann::json object = extra;
  object[kEntriesKey][0].erase("scalar");
  EXPECT_FALSE(EntriesOf(object, "manifest").ok());
}

TEST(DcpMoe, TorchKeysOfExpertsAndTheirZeroShardsReadBack) {
  TempDir tmp;
  Env* env = Env::Default();
  const ModelSpec spec = ::ptc::testing::Spec(
      "llama", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48,experts=4,moe_ffn=16,dense_first=1",
      DType::kBF16, /*adam=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,dp=4,ep=2,zero=1");  // edp = 2
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp / "store")).value();
  auto generation = store->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, Index> covered;
  std::map<std::string, Shape> shapes;
  for (const Tensor& t : plan->tensors) shapes[t.key] = t.shape;
  for (const File& f : plan->files) {
    for (const Chunk& c : f.chunks) {
      if (c.object < 0) covered[plan->tensors[c.tensor].key] += c.box.volume();
    }
  }
  const std::string fc1 = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight";
  EXPECT_EQ(shapes["model." + fc1], (Shape{32, 32}));
  EXPECT_EQ(shapes["optim.state." + fc1 + ".exp_avg_sq"], (Shape{32, 32}));
  EXPECT_EQ(shapes.count("model.decoder.layers.0.mlp.router.weight"), 0u);  // layer 0 dense
  for (const auto& [key, shape] : shapes) EXPECT_EQ(covered[key], NumElements(shape)) << key;
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, generation, tmp / "dcp").ok());
  auto back = ImportDcp(env, tmp / "dcp", tmp / "copy", spec.schema, spec.dims, *ParseConfig("tp=1"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto copy = std::move(Store::Open(env, tmp / "copy")).value();
  GenerationReader a(*store, generation, true), b(*copy, copy->CurrentSnapshot(), true);
  for (const TensorRecord& t : generation->tensors) {
    const Box full = Box::Full(t.shape);
    std::string x(static_cast<size_t>(full.volume()) * DTypeSize(t.dtype), '\0'), y = x;
    ASSERT_TRUE(a.Read(t.name, full, x.data(), full, DenseLayout(full)).ok());
    ASSERT_TRUE(b.Read(t.name, full, y.data(), full, DenseLayout(full)).ok()) << t.name;
    EXPECT_TRUE(x == y) << t.name;
  }
}

// torchtitan's MoE (its Qwen3's names): each layer's experts one [experts, ...]
// tensor per weight, w1/w3 the gate/up halves of every expert's linear_fc1,
// w2 its linear_fc2; expert-parallel pieces (ep=2, etp=2) make chunks cut at
// expert and row boundaries; each chunk's rows are read back from the store
// one by one; the export imports back at tp=1, masters = parameters.
TEST(DcpTorchtitan, MoeExpertsStackIntoOneTensorPerLayerAndReadBack) {
  TempDir tmp;
  Env* env = Env::Default();
  const Index experts = 4, moe_ffn = 16, hidden = 32;
  const ModelSpec spec = ::ptc::testing::Spec(
      "llama", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48,experts=4,moe_ffn=16", DType::kF32,
      /*adam=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,dp=2,ep=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp / "store")).value();
  auto generation = store->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation, Keys::kTorchtitan);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::string inner = "layers.1.moe.routed_experts.inner_experts.";
  std::map<std::string, Shape> shapes;
  for (const Tensor& t : plan->tensors) shapes[t.key] = KeyShape(t);
  EXPECT_EQ(shapes[inner + "w1_EFD"], (Shape{experts, moe_ffn, hidden}));
  EXPECT_EQ(shapes[inner + "w3_EFD"], (Shape{experts, moe_ffn, hidden}));
  EXPECT_EQ(shapes[inner + "w2_EDF"], (Shape{experts, hidden, moe_ffn}));
  EXPECT_EQ(shapes["layers.0.moe.router.gate.weight"], (Shape{experts, hidden}));
  EXPECT_EQ(shapes["optimizer.state." + inner + "w3_EFD.exp_avg_sq"], (Shape{experts, moe_ffn, hidden}));
  EXPECT_EQ(shapes["optimizer.state.layers.0.attention.qkv_linear.wqkv.weight.exp_avg"], (Shape{64, hidden}));
  EXPECT_EQ(shapes.count("layers.0.feed_forward.w1.weight"), 0u);
  // Per layer 4 attention + router + 3 stacked + 2 norms; 3 outside; the optimizer's: wqkv for q/k/v.
  EXPECT_EQ(shapes.size(), 3u + 2u * 10u + 2u * (3u + 2u * 8u));
  // One step and group settings per stacked key (not per expert), and each layer's expert_bias_E, zeros.
  std::map<std::string, const Object*> objects;
  for (const Object& o : plan->objects) objects[o.key] = &o;
  EXPECT_EQ(objects.count("optimizer.state." + inner + "w1_EFD.step"), 1u);
  ASSERT_EQ(objects.count("layers.1.moe.expert_bias_E"), 1u);
  EXPECT_EQ(objects["layers.1.moe.expert_bias_E"]->shape, (Shape{experts}));
  // Every chunk of a stacked key: element (e, r, c) is expert e's linear_fc1 row r (w1),
  // moe_ffn + r (w3), or linear_fc2 row r (w2).
  GenerationReader reader(*store, generation, /*verify=*/true);
  size_t rows = 0;
  std::set<Index> cuts;  // where the chunks of w1 are cut along the rows
  for (size_t f = 0; f < plan->files.size(); ++f) {
    auto read = DcpFileBytes(reader, *plan, f);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    const std::string& bytes = *read;
    for (const Chunk& c : plan->files[f].chunks) {
      if (c.object >= 0) continue;
      const Tensor& t = plan->tensors[c.tensor];
      if (t.key.find(".inner_experts.") == std::string::npos) continue;
      const Box key_box = KeyBox(t, c.box);
      ASSERT_EQ(key_box.rank(), 3u);
      EXPECT_EQ(key_box.end[0] - key_box.begin[0], 1);  // one expert per stored piece
      const Index e = key_box.begin[0];
      const bool w2 = t.key.find("w2_EDF") != std::string::npos, w3 = t.key.find("w3_EFD") != std::string::npos;
      if (t.key.ends_with("w1_EFD")) cuts.insert(key_box.begin[1]);
      const size_t at = t.key.find("layers.") + 7;
      const std::string layer = t.key.substr(at, t.key.find('.', at) - at);
      const std::string global = "decoder.layers." + layer + ".mlp.experts.local_experts." + std::to_string(e) +
                                 (w2 ? ".linear_fc2.weight" : ".linear_fc1.weight");
      EXPECT_TRUE(t.name == global || t.name == global + ".exp_avg" || t.name == global + ".exp_avg_sq") << t.name;
      const ::ptc::testing::StringFile blob(bytes.substr(c.offset, c.size), t.key);
      auto tf = ReadTorchFile(blob, t.key);
      ASSERT_TRUE(tf.ok()) << tf.status().ToString();
      EXPECT_EQ(tf->root.tensor().shape, key_box.shape());
      auto got = ReadTensorBytes(blob, *tf, tf->root.tensor(), t.key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const Index cols = key_box.end[2] - key_box.begin[2];
      for (Index r = key_box.begin[1]; r < key_box.end[1]; ++r) {
        const Index src = w3 ? moe_ffn + r : r;
        const Box row = B({src, key_box.begin[2]}, {src + 1, key_box.end[2]});
        std::string want(static_cast<size_t>(cols) * 4, '\0');
        ASSERT_TRUE(reader.Read(t.name, row, want.data(), row, DenseLayout(row)).ok());
        EXPECT_EQ(got->substr(static_cast<size_t>((r - key_box.begin[1]) * cols * 4), want.size()), want)
            << t.key << " expert " << e << " row " << r;
        ++rows;
      }
    }
  }
  // 2 layers x 4 experts x (w1 + w3 rows, w2's in two column halves: etp=2 cuts them) of the
  // parameters and their two moments.
  EXPECT_EQ(rows, 3u * 2u * experts * (2 * moe_ffn + 2 * hidden));
  EXPECT_EQ(cuts, (std::set<Index>{0, moe_ffn / 2}));  // etp=2 cut each half in two
  // Exported and imported at tp=1: the same tensors, masters = parameters.
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, generation, tmp / "titan", {}, Keys::kTorchtitan).ok());
  auto source = OpenDcp(env, tmp / "titan", spec.schema, spec.dims, *ParseConfig("tp=1"));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ(source->entries.size(), 2u);  // the expert biases, carried
  auto copy = std::move(Store::Create(env, tmp / "copy")).value();
  ASSERT_TRUE(WriteDcp(copy.get(), *source, nlohmann::json::object(), "").ok());
  GenerationReader back(*copy, copy->CurrentSnapshot(), true);
  ExpectSameTensors(reader, back, generation->tensors, /*masters_from_parameters=*/true);
  // Rendered again from the copy: the biases are the carried ones, not made anew.
  auto again = PlanCheckpoint(*copy->CurrentSnapshot(), Keys::kTorchtitan);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  size_t biases = 0;
  for (const Object& o : again->objects) biases += o.key.ends_with(".moe.expert_bias_E") ? 1 : 0;
  EXPECT_EQ(biases, 2u);
}

// torchtitan's DeepSeek-V3 (MLA) of a store with the router's bias (hf::ExpertBiasSchema, what
// an HF DeepseekV3 import makes): the attention's keys whole, the bias the tensor of
// moe.expert_bias_E (no zeros made for it, nothing carried), the export imports back bit for bit.
TEST(DcpTorchtitan, DeepseekMlaKeysAndTheRouterBiasAsATensorReadBack) {
  TempDir tmp;
  Env* env = Env::Default();
  ModelSpec spec = ::ptc::testing::Spec("llama",
                                        "layers=2,hidden=16,heads=4,vocab=32,seq=8,ffn=24,q_lora=8,kv_lora=6,qk_nope=4,"
                                        "qk_rope=2,v_head=6,experts=4,moe_ffn=8,shared_ffn=8,dense_first=1");
  spec.schema = *hf::ExpertBiasSchema(spec.schema);
  const ParallelConfig config = *ParseConfig("tp=2,dp=2,ep=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp / "store")).value();
  auto generation = store->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation, Keys::kTorchtitan);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, std::string> names;
  for (const Tensor& t : plan->tensors) names[t.key] = t.name;
  EXPECT_EQ(names["layers.1.attention.wkv_b.weight"], "decoder.layers.1.self_attention.linear_kv_up_proj.weight");
  EXPECT_EQ(names["layers.0.attention.q_norm.weight"],
            "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight");
  EXPECT_EQ(names["layers.1.moe.expert_bias_E"], "decoder.layers.1.mlp.router.expert_bias");
  EXPECT_EQ(names.count("layers.0.moe.expert_bias_E"), 0u);  // layer 0 is dense
  for (const Object& o : plan->objects) EXPECT_FALSE(o.key.ends_with("expert_bias_E")) << o.key;
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, generation, tmp / "titan", {}, Keys::kTorchtitan).ok());
  auto source = OpenDcp(env, tmp / "titan", spec.schema, spec.dims, *ParseConfig("tp=1"));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_TRUE(source->entries.empty());  // the bias is the model's tensor, not carried
  auto copy = std::move(Store::Create(env, tmp / "copy")).value();
  ASSERT_TRUE(WriteDcp(copy.get(), *source, nlohmann::json::object(), "").ok());
  GenerationReader a(*store, generation, true), b(*copy, copy->CurrentSnapshot(), true);
  ExpectSameTensors(a, b, generation->tensors);
}

// torchtitan's shared experts (MoE.shared_experts, a FeedForward): w1/w3 the gate/up
// halves of shared_experts.linear_fc1, w2 its linear_fc2, plain [rows, cols] keys;
// in tp=2 pieces (each rank [gate_r; up_r]) every chunk's rows read back from the store
// row by row, the export imports back into the same tensors; a gated store
// (Qwen2-MoE's shared_experts.gate_weight) is refused naming the rule.
TEST(DcpTorchtitan, SharedExpertsAreItsMoeSharedExpertsAndReadBack) {
  TempDir tmp;
  Env* env = Env::Default();
  const Index shared = 24, hidden = 32;
  const std::string dims =
      "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48,experts=4,moe_ffn=16,shared_ffn=24";
  const ModelSpec spec = ::ptc::testing::Spec("llama", dims, DType::kF32, /*adam=*/true);
  const ParallelConfig config = *ParseConfig("tp=2,dp=2,ep=2");
  ASSERT_TRUE(WriteSynthCheckpoint(env, ::ptc::testing::FitLayout(spec, config), 3, tmp / "src").ok());
  ASSERT_TRUE(ImportCheckpoint(env, tmp / "src", tmp / "store", spec.schema, spec.dims, config).ok());
  auto store = std::move(Store::Open(env, tmp / "store")).value();
  auto generation = store->CurrentSnapshot();
  auto plan = PlanCheckpoint(*generation, Keys::kTorchtitan);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, Shape> shapes;
  for (const Tensor& t : plan->tensors) shapes[t.key] = KeyShape(t);
  for (const char* layer : {"layers.0.", "layers.1."}) {
    const std::string p = std::string(layer) + "moe.shared_experts.";
    EXPECT_EQ(shapes[p + "w1.weight"], (Shape{shared, hidden}));
    EXPECT_EQ(shapes[p + "w3.weight"], (Shape{shared, hidden}));
    EXPECT_EQ(shapes[p + "w2.weight"], (Shape{hidden, shared}));
    EXPECT_EQ(shapes["optimizer.state." + p + "w1.weight.exp_avg"], (Shape{shared, hidden}));
    EXPECT_EQ(shapes["optimizer.state." + p + "w2.weight.exp_avg_sq"], (Shape{hidden, shared}));
  }
  GenerationReader reader(*store, generation, /*verify=*/true);
  size_t rows = 0;
  for (size_t f = 0; f < plan->files.size(); ++f) {
    auto read = DcpFileBytes(reader, *plan, f);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    const std::string& bytes = *read;
    for (const Chunk& c : plan->files[f].chunks) {
      if (c.object >= 0) continue;
      const Tensor& t = plan->tensors[c.tensor];
      if (t.key.find(".shared_experts.") == std::string::npos) continue;
      const Box key_box = KeyBox(t, c.box);
      const bool w2 = t.key.find(".w2.") != std::string::npos, w3 = t.key.find(".w3.") != std::string::npos;
      const std::string global = t.key.substr(t.key.find("layers."), t.key.find(".moe.") - t.key.find("layers."));
      EXPECT_TRUE(t.name.starts_with("decoder." + global + ".mlp.shared_experts." +
                                     (w2 ? "linear_fc2.weight" : "linear_fc1.weight")))
          << t.key << " " << t.name;
      const ::ptc::testing::StringFile blob(bytes.substr(c.offset, c.size), t.key);
      auto tf = ReadTorchFile(blob, t.key);
      ASSERT_TRUE(tf.ok()) << tf.status().ToString();
      auto got = ReadTensorBytes(blob, *tf, tf->root.tensor(), t.key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const Index cols = key_box.end[1] - key_box.begin[1];
      for (Index r = key_box.begin[0]; r < key_box.end[0]; ++r) {
        const Index src = w3 ? shared + r : r;
        const Box row = B({src, key_box.begin[1]}, {src + 1, key_box.end[1]});
        std::string want(static_cast<size_t>(cols) * 4, '\0');
        ASSERT_TRUE(reader.Read(t.name, row, want.data(), row, DenseLayout(row)).ok());
        EXPECT_EQ(got->substr(static_cast<size_t>((r - key_box.begin[0]) * cols * 4), want.size()), want)
            << t.key << " row " << r;
        ++rows;
      }
    }
  }
  // 2 layers x (w1 + w3 rows, w2's rows in two column halves: tp=2 cuts linear_fc2's columns) x 3
  // (the parameter and its two moments).
  EXPECT_EQ(rows, 2u * 3u * (2 * shared + 2 * hidden));
  ASSERT_TRUE(ptcfs::ExportDcp(env, *store, generation, tmp / "titan", {}, Keys::kTorchtitan).ok());
  auto source = OpenDcp(env, tmp / "titan", spec.schema, spec.dims, *ParseConfig("tp=1"));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto copy = std::move(Store::Create(env, tmp / "copy")).value();
  ASSERT_TRUE(WriteDcp(copy.get(), *source, nlohmann::json::object(), "").ok());
  GenerationReader back(*copy, copy->CurrentSnapshot(), true);
  ExpectSameTensors(reader, back, generation->tensors, /*masters_from_parameters=*/true);
  // The shared experts' sigmoid gate (Qwen2-MoE's) has no torchtitan name.
  auto gated = hf::SharedGateSchema(spec.schema);
  ASSERT_TRUE(gated.ok()) << gated.status().ToString();
  auto refused = TorchtitanTensors(ModelSpec{*gated, spec.dims, DType::kF32, false});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rule 'decoder.layers.{i}.mlp.shared_experts.gate_weight'"),
            std::string::npos)
      << refused.status().message();
}

// Adam's steps and the param groups of a save (SavedOptimizer): torch.save
// entries in a file, as DCP writes them; kept as one group or Megatron's two,
// refused naming the key or the groups otherwise.
class DcpOptimizer : public ::testing::Test {
 protected:
  DcpOptimizer() {
    model_ = NameTensors({{"w", DType::kF32, {4, 4}},
                          {"norm", DType::kF32, {4}},
                          {"w.exp_avg", DType::kF32, {4, 4}},
                          {"norm.exp_avg", DType::kF32, {4}}},
                         Keys::kTorch);
  }
  // An entry: the value's torch.save bytes appended to the file.
  SavedChunk Put(const pickle::Value& value, const std::vector<megatron::CarriedTensor>& storages = {}) {
    auto bytes = TorchSaveBytes(value, storages);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    SavedChunk c{Box{}, "__0_0.distcp", file_.size(), bytes->size()};
    file_ += *bytes;
    return c;
  }
  void Step(const std::string& key, float step) {
    pickle::Tensor t;
    t.storage_key = "s";
    t.storage_numel = 1;
    std::string bytes(4, '\0');
    std::memcpy(bytes.data(), &step, 4);
    saved_.tensors.push_back(
        SavedTensor{key, DType::kF32, {}, {Put(pickle::Value::FromTensor(t), {{"s", DType::kF32, 1, bytes}})}});
  }
  void Setting(const std::string& key, const pickle::Value& v) {
    const SavedChunk c = Put(v);
    saved_.bytes.push_back(SavedBytes{key, c.file, c.offset, c.length});
  }
  Result<std::optional<megatron::OptimizerMeta>> Read(Keys keys = Keys::kTorch) {
    const ::ptc::testing::StringFile file(file_, "__0_0.distcp");
    return SavedOptimizer(
        saved_, model_, keys, [&](const std::string&) -> Result<const RandomAccessFile*> { return &file; },
        "save/.metadata");
  }
  std::vector<Tensor> model_;
  SavedCheckpoint saved_;
  std::string file_;
};

TEST_F(DcpOptimizer, OneGroupOfEveryParameterAndTheSteps) {
  Step("optim.state.w.step", 7);
  Step("optim.state.norm.step", 7);
  Setting("optim.param_groups.0.lr", pickle::Value::Float(3e-4));
  Setting("optim.param_groups.0.params", pickle::Value::List({pickle::Value::Str("w"), pickle::Value::Str("norm")}));
  auto meta = Read();
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ASSERT_TRUE(meta->has_value());
  ASSERT_EQ((*meta)->steps.size(), 1u);  // one value, both parameters
  EXPECT_EQ((*meta)->steps[0].params.size(), 2u);
  ASSERT_EQ((*meta)->groups.items().size(), 1u);
  EXPECT_EQ(*(*meta)->groups.items()[0].Find("lr"), pickle::Value::Float(3e-4));
  EXPECT_EQ((*meta)->groups.items()[0].Find("params"), nullptr);
}

// A save taken on many workers: each part carries the bytes of the entries
// in its files; together they read as the whole save does. An entry no part
// carries is refused naming its key.
TEST_F(DcpOptimizer, PartsCarryTheirEntriesToEveryWorker) {
  Step("optim.state.w.step", 7);
  Step("optim.state.norm.step", 9);
  Setting("optim.param_groups.0.lr", pickle::Value::Float(3e-4));
  Setting("optim.param_groups.0.params", pickle::Value::List({pickle::Value::Str("w"), pickle::Value::Str("norm")}));
  auto whole = Read();
  ASSERT_TRUE(whole.ok() && whole->has_value()) << whole.status().ToString();
  OptimizerPart part{std::make_shared<const SavedCheckpoint>(saved_), model_, Keys::kTorch, {}};
  std::vector<EntryBytes> entries;
  auto carry = [&](const SavedChunk& c) {
    entries.push_back(EntryBytes{c.file, file_.size(), c.offset, file_.substr(c.offset, c.length)});
  };
  for (const SavedTensor& t : saved_.tensors) carry(t.chunks.front());
  for (const SavedBytes& b : saved_.bytes) carry(SavedChunk{Box{}, b.file, b.offset, b.length});
  auto parts = PartsOptimizer(part, entries, "save/.metadata");
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_TRUE(parts->has_value());
  megatron::MegatronState from_parts, from_whole;
  from_parts.optimizer = **parts;
  from_whole.optimizer = **whole;
  EXPECT_EQ(megatron::EncodeMegatronState(from_parts), megatron::EncodeMegatronState(from_whole));
  ASSERT_EQ((*parts)->steps.size(), 2u);
  entries.erase(entries.begin() + 1);  // norm's step: on no worker's part
  parts = PartsOptimizer(part, entries, "save/.metadata");
  ASSERT_FALSE(parts.ok());
  EXPECT_NE(parts.status().message().find("key optim.state.norm.step"), std::string::npos) << parts.status().ToString();
  EXPECT_NE(parts.status().message().find("no worker's part carries"), std::string::npos) << parts.status().ToString();
}

TEST_F(DcpOptimizer, MegatronsTwoGroupsInEitherOrder) {
  Setting("optim.param_groups.0.weight_decay", pickle::Value::Float(0.0));
  Setting("optim.param_groups.0.params", pickle::Value::List({pickle::Value::Str("norm")}));
  Setting("optim.param_groups.1.weight_decay", pickle::Value::Float(0.1));
  Setting("optim.param_groups.1.params", pickle::Value::List({pickle::Value::Str("w")}));
  auto meta = Read();
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ASSERT_EQ((*meta)->groups.items().size(), 2u);
  EXPECT_EQ(*(*meta)->groups.items()[0].Find("weight_decay"), pickle::Value::Float(0.1));  // the 2-D parameter's
  EXPECT_EQ(*(*meta)->groups.items()[1].Find("weight_decay"), pickle::Value::Float(0.0));
  EXPECT_TRUE((*meta)->steps.empty());
}

TEST_F(DcpOptimizer, RefusesWhatItCannotKeepNamingTheKey) {
  // Two groups that mix the classes: w and norm in one with other settings than w in the other.
  Setting("optim.param_groups.0.lr", pickle::Value::Float(1e-3));
  Setting("optim.param_groups.0.params", pickle::Value::List({pickle::Value::Str("w"), pickle::Value::Str("norm")}));
  Setting("optim.param_groups.1.lr", pickle::Value::Float(2e-3));
  Setting("optim.param_groups.1.params", pickle::Value::List({pickle::Value::Str("w")}));
  auto meta = Read();
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("param group 1 and param group 0 have different optimizer settings"),
            std::string::npos)
      << meta.status().ToString();
  saved_ = {};
  Setting("optim.param_groups.0.params", pickle::Value::List({pickle::Value::Str("nothing")}));
  meta = Read();
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("key optim.param_groups.0.params: an entry is no parameter name"),
            std::string::npos)
      << meta.status().ToString();
  saved_ = {};
  const SavedChunk c = Put(pickle::Value::Str("seven"));
  saved_.tensors.push_back(SavedTensor{"optim.state.w.step", DType::kF32, {}, {c}});
  meta = Read();
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("key optim.state.w.step"), std::string::npos) << meta.status().ToString();
  EXPECT_NE(meta.status().message().find("not a step"), std::string::npos) << meta.status().ToString();
  saved_ = {};
  Setting("optim.param_groups.x.lr", pickle::Value::Float(1.0));
  meta = Read();
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("not optim.param_groups.G.K"), std::string::npos) << meta.status().ToString();
  // Nothing of the optimizer's: nothing to keep.
  saved_ = {};
  meta = Read();
  ASSERT_TRUE(meta.ok());
  EXPECT_FALSE(meta->has_value());
}

// Issue 41, item 7: a torch_dist save's metadata.json was never read, so one
// that is no JSON, or names another backend, was taken silently.
TEST(McoreMetadata, IsCheckedNamingTheFieldAtFault) {
  ::ptc::testing::TempDir tmp;
  auto check = [&](const std::string& text) {
    ::ptc::testing::Spit(tmp / "metadata.json", text);
    return CheckMcoreMetadata(Env::Default(), tmp.path());
  };
  EXPECT_TRUE(check(McoreMetadataJson()).ok()) << check(McoreMetadataJson()).ToString();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"sharded_backend": "zarr", "common_backend": "torch"})", R"("sharded_backend" is "zarr")"},
      {R"({"sharded_backend": "torch_dist"})", R"("common_backend" is missing)"},
      {R"({"sharded_backend": "torch_dist", "sharded_backend": "zarr", "common_backend": "torch"})",
       R"(names "sharded_backend" twice)"}};
  for (const auto& [text, part] : bad) {
    const Status s = check(text);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << text;
    EXPECT_TRUE(::ptc::testing::Contains(s.message(), "metadata.json")) << s.ToString();
    EXPECT_TRUE(::ptc::testing::Contains(s.message(), part)) << part << " not in " << s.ToString();
  }
}

// CheckChunksDisjoint (the sweep, dcp/read.h) says what comparing every pair
// of chunks says, for random chunkings of small tensors: grids with a cell
// moved, duplicated or split, and random boxes (seed printed; PTCFS_SEED
// replays one).
TEST(ChunkCheck, AgreesWithComparingEveryPair) {
  const char* env_seed = std::getenv("PTCFS_SEED");
  const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : 20261206;
  std::mt19937_64 rng(seed);
  auto pick = [&](Index n) { return static_cast<Index>(rng() % static_cast<uint64_t>(n)); };
  auto pairwise = [](const SavedTensor& t) {
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (Intersect(t.chunks[i].box, t.chunks[j].box) && t.chunks[i].box.volume() > 0 &&
            t.chunks[j].box.volume() > 0) {
          return false;
        }
      }
    }
    return true;
  };
  int overlapping = 0;
  for (int round = 0; round < 3000; ++round) {
    SavedTensor t;
    t.key = "w";
    const size_t rank = 1 + static_cast<size_t>(pick(3));
    for (size_t d = 0; d < rank; ++d) t.shape.push_back(1 + pick(6));
    auto add = [&](Box b) { t.chunks.push_back(SavedChunk{std::move(b), "f", 0, 0}); };
    if (round % 2 == 0) {  // a grid of random cuts, then one change
      std::vector<std::vector<Index>> cuts(rank);
      for (size_t d = 0; d < rank; ++d) {
        cuts[d] = {0, t.shape[d]};
        for (int k = 0; k < 2; ++k) cuts[d].push_back(pick(t.shape[d] + 1));
        std::sort(cuts[d].begin(), cuts[d].end());
        cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
      }
      std::vector<size_t> at(rank, 0);
      while (true) {
        Box b;
        for (size_t d = 0; d < rank; ++d) {
          b.begin.push_back(cuts[d][at[d]]);
          b.end.push_back(cuts[d][at[d] + 1]);
        }
        add(b);
        size_t d = 0;
        while (d < rank && ++at[d] + 1 == cuts[d].size()) at[d++] = 0;
        if (d == rank) break;
      }
      Box& victim = t.chunks[static_cast<size_t>(pick(static_cast<Index>(t.chunks.size())))].box;
      switch (pick(3)) {
        case 0:
          add(victim);  // twice
          break;
        case 1: {  // moved by one along a dimension, where it fits
          const size_t d = static_cast<size_t>(pick(static_cast<Index>(rank)));
          if (victim.end[d] < t.shape[d]) ++victim.begin[d], ++victim.end[d];
          break;
        }
        default:
          break;  // left a tiling
      }
    } else {  // random boxes
      for (Index n = 1 + pick(6); n > 0; --n) {
        Box b;
        for (size_t d = 0; d < rank; ++d) {
          const Index a = pick(t.shape[d] + 1), c = pick(t.shape[d] + 1);
          b.begin.push_back(std::min(a, c));
          b.end.push_back(std::max(a, c));
        }
        add(b);
      }
    }
    const bool want = pairwise(t);
    overlapping += !want;
    ASSERT_EQ(CheckChunksDisjoint(t, "w").ok(), want) << "seed " << seed << " round " << round;
  }
  EXPECT_GT(overlapping, 300);  // both answers were asked for
}

}  // namespace
}  // namespace ptc::dcp
