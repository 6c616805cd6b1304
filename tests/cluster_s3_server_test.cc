// The durable tier on a real S3 server: radosgw of a single-node Ceph
// (tests/ceph/ceph.sh, started by tools/test.sh, which exports
// AWS_ENDPOINT_URL, the keys and PTCFS_S3_BUCKET). Skips without one, and
// fails instead under CI=true. Each test works under a prefix of its own.
//
// - an object uploaded in parts reads back bit for bit, by ranges;
// - the workers' shares and the manifest written last into the bucket; the
//   copy alone restores the job's tensors (equal to synth) through a
//   PeerEnv reading ranges of the bucket;
// - a share altered in the bucket is refused by name, and nothing is committed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "cluster/durable.h"
#include "cluster/durable_transfer.h"
#include "cluster/durable_location.h"
#include "cluster/peer_env.h"
#include "cluster/s3/s3_client.h"
#include "cluster/s3/s3_env.h"
#include "ptc/store/model_spec.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/covering.h"
#include "transform/execute.h"
#include "transform/plan.h"

namespace ptc::cluster {
namespace {

using namespace ::ptc::transform;
using testing::MakeStore;
using testing::Spec;
using testing::TempDir;

class S3Server : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bucket = std::getenv("PTCFS_S3_BUCKET");
    if (bucket == nullptr || std::getenv("AWS_ENDPOINT_URL") == nullptr) {
      const std::string why = "no S3 server: start one with tests/ceph/ceph.sh start DIR and source DIR/env";
      if (!testing::InCi()) GTEST_SKIP() << why;
      FAIL() << why << " (CI=true: tools/test.sh starts it)";
    }
    bucket_ = bucket;
    prefix_ = "test-" + std::to_string(std::random_device{}());
    auto tier = OpenDurableLocation("s3://" + bucket_ + "/" + prefix_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
  }
  void TearDown() override {
    if (tier_.env) (void)tier_.env->RemoveTree(prefix_);
  }

  std::string bucket_, prefix_;
  DurableLocation tier_;
};

TEST_F(S3Server, AMultipartObjectReadsBackByRanges) {
  auto client = s3::S3Client::FromEnvironment();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto env = s3::NewS3Env(*client, bucket_, {5 << 20, 3});
  std::mt19937_64 gen(11);
  std::string bytes((5 << 20) * 3 + 12345, '\0');
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = gen();
    std::memcpy(&bytes[i], &v, 8);
  }
  const std::string key = prefix_ + "/big.bin";
  auto f = env->OpenWrite(key);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(bytes.data(), bytes.size()).ok());
  EXPECT_FALSE(env->Exists(key));  // not before Close completes it
  ASSERT_TRUE((*f)->Close().ok());
  auto r = env->OpenRead(key);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->Size(), bytes.size());
  for (uint64_t at : {uint64_t{0}, uint64_t{(5 << 20) - 3}, uint64_t{bytes.size() - 1000}}) {
    std::string got(1000, '\0');
    ASSERT_TRUE((*r)->Read(at, got.size(), got.data()).ok());
    EXPECT_EQ(got, bytes.substr(at, 1000)) << at;
  }
  std::string short_read(10, '\0');
  EXPECT_EQ((*r)->Read(bytes.size() - 5, 10, short_read.data()).code(), Code::kCorruption);
}

class S3Tier : public S3Server {
 protected:
  void SetUp() override {
    S3Server::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    spec_ = Spec("llama", "layers=6,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96");
    MakeStore(tmp_, spec_, *ParseConfig("tp=2,pp=3,dp=1,per_worker=2"), 7);
    auto store = Store::Open(Env::Default(), tmp_ / "store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    m_ = store_->CurrentSnapshot();
    id_ = {"job-s3", "contents-s3"};
    for (int w = 0; w < 3; ++w) {
      Status s = WriteDurableShare(Env::Default(), *store_, *m_, w, tier_.dir, nullptr, tier_.get());
      ASSERT_TRUE(s.ok()) << s.ToString();
      auto done = CompleteDurable(tier_.get(), *m_, id_, w, tier_.dir);
      ASSERT_TRUE(done.ok()) << done.status().ToString();
      ASSERT_EQ(*done, w == 2) << "complete before every share is in";
    }
  }
  // Restores every tensor into tp=1,pp=2 from the bucket alone.
  Status Restore() {
    PeerEnvOptions o;
    o.durable_dir = tier_.dir;
    o.durable_env = tier_.env;
    PeerEnv env(Env::Default(), tmp_ / "store", o);
    PTC_ASSIGN_OR_RETURN(auto store, Store::Open(&env, tmp_ / "store"));
    auto source = std::make_shared<GenerationManifest>(*store->CurrentSnapshot());
    source->shards.clear();  // nothing but the bucket
    PTC_ASSIGN_OR_RETURN(auto pieces, LoadDurable(tier_.get(), tier_.dir, id_, source->tensors));
    source->shards = pieces;
    const ParallelConfig to = *ParseConfig("tp=1,pp=2,dp=1,per_worker=2");
    PTC_ASSIGN_OR_RETURN(auto plan, MakePlan({source.get(), spec_, to, {}, std::set<int>{kDurableWorker}, {kDurableWorker}}));
    if (!plan.missing.empty()) return InternalError("the plan lacks pieces");
    Covering covering = MakeCovering(plan, *source, CommitMode::kWorkerLocal);
    ExecuteOptions options;
    options.mode = CommitMode::kWorkerLocal;
    return ExecuteCovering(*store, source, spec_, to, covering, options).status();
  }

  TempDir tmp_;
  ModelSpec spec_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<const GenerationManifest> m_;
  DurableIdentity id_;
};

TEST_F(S3Tier, TheBucketAloneRestoresTheTensors) {
  auto names = tier_.get()->ListDir(tier_.dir);
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, (std::vector<std::string>{"durable.json", "gen-000001"}));
  store_.reset();
  Status s = Restore();
  ASSERT_TRUE(s.ok()) << s.ToString();
  testing::ExpectStoreHolds(tmp_, spec_, *ParseConfig("tp=1,pp=2,dp=1,per_worker=2"), 7);
}

TEST_F(S3Tier, AnAlteredObjectIsRefusedByName) {
  auto pieces = LoadDurable(tier_.get(), tier_.dir, id_, m_->tensors);
  ASSERT_TRUE(pieces.ok());
  const ShardRecord victim = pieces->front();
  const std::string key = JoinPath(tier_.dir, victim.file.substr(kDurablePrefix.size()));
  auto bytes = ReadFileToString(tier_.get(), key);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  (*bytes)[victim.offset + victim.nbytes / 2] ^= 0x01;
  {
    auto f = tier_.get()->OpenWrite(key);
    ASSERT_TRUE((*f)->Append(bytes->data(), bytes->size()).ok());
    ASSERT_TRUE((*f)->Close().ok());
  }
  const uint64_t before = store_->CurrentSnapshot()->generation;
  store_.reset();
  Status s = Restore();
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find(victim.tensor), std::string::npos) << s.ToString();
  auto store = Store::Open(Env::Default(), tmp_ / "store");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->CurrentSnapshot()->generation, before);  // nothing committed
}

// `ptcfs export STORE s3://...` then `ptcfs import s3://... STORE2`: the
// second store holds the first's tensors bit for bit (exported and compared
// with synth); an object altered in between fails the import by name and
// leaves no store.
TEST_F(S3Server, ExportAndImportRoundTripThroughTheBucket) {
  TempDir a, b, c;
  const ModelSpec spec = Spec("llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=96,seq=16,ffn=96");
  const ParallelConfig config = *ParseConfig("tp=2,pp=2,dp=1");
  MakeStore(a, spec, config, 5);
  const std::string url = "s3://" + bucket_ + "/" + prefix_;
  const std::string ptcfs = PTCFS_BINARY;
  ASSERT_EQ(std::system((ptcfs + " export " + std::string(a / "store") + " " + url + " >/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((ptcfs + " import " + url + " " + std::string(b / "store") + " >/dev/null").c_str()), 0);
  testing::ExpectStoreHolds(b, spec, config, 5);
  // One byte of the first share altered in the bucket.
  auto copy = ReadFileToString(tier_.get(), JoinPath(prefix_, "durable.json"));
  ASSERT_TRUE(copy.ok());
  auto m = DecodeManifest("durable.json", *copy);
  ASSERT_TRUE(m.ok());
  const ShardRecord victim = m->shards.front();
  const std::string key = JoinPath(prefix_, victim.file);
  auto bytes = ReadFileToString(tier_.get(), key);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[victim.offset] ^= 0x40;
  auto f = tier_.get()->OpenWrite(key);
  ASSERT_TRUE((*f)->Append(bytes->data(), bytes->size()).ok() && (*f)->Close().ok());
  const std::string out = std::string(c / "err.txt");
  EXPECT_NE(std::system((ptcfs + " import " + url + " " + std::string(c / "store") + " 2>" + out).c_str()), 0);
  const std::string error = testing::Slurp(out);
  EXPECT_NE(error.find(victim.tensor), std::string::npos) << error;
  EXPECT_NE(error.find(key), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(c / "store"));
}

}  // namespace
}  // namespace ptc::cluster
