// Filesystem without a mount (fs/filesystem.h): the operations the FUSE
// callbacks call, run against each other from two threads as libfuse's
// multithreaded loop may run them. Each test checks what the operations
// return; the ThreadSanitizer build (label threads) also fails a test whose
// operations touch a field of a node or a handle without its lock.
#include "fs/filesystem.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptcfs {
namespace {

namespace fs = std::filesystem;
using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kDims = "layers=2,hidden=16,heads=2,vocab=64,seq=8";
constexpr const char* kLatest = "latest_checkpointed_iteration.txt";

class FilesystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Ptcfs("synth --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt");
    ASSERT_EQ(r.first, 0) << r.second;
    r = Ptcfs("import --schema megatron-gpt --dims " + std::string(kDims) + " --config tp=2,pp=1 " + tmp_ / "ckpt " +
              tmp_ / "store");
    ASSERT_EQ(r.first, 0) << r.second;
    MountOptions options;
    options.store = tmp_ / "store";
    options.megatron = true;
    options.dcp = true;
    auto created = Filesystem::Create(options);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    fs_ = std::move(created).value();
    auto megatron = fs_->Lookup(kRootInode, "megatron");
    ASSERT_TRUE(megatron.ok()) << megatron.status().ToString();
    megatron_ = megatron->ino;
  }
  // Opens the latest file for writing.
  uint64_t OpenLatest() {
    auto latest = fs_->Lookup(megatron_, kLatest);
    EXPECT_TRUE(latest.ok()) << latest.status().ToString();
    auto open = fs_->Open(latest.ok() ? latest->ino : 0, O_WRONLY | O_TRUNC);
    EXPECT_TRUE(open.ok()) << open.status().ToString();
    return open.ok() ? open->fh : 0;
  }

  TempDir tmp_;  // before fs_: removed after the file system is gone
  std::unique_ptr<Filesystem> fs_;
  uint64_t megatron_ = 0;
};

// A framework writes latest_checkpointed_iteration.txt while the kernel
// flushes the same handle (close of a dup, or a flush racing a write).
TEST_F(FilesystemTest, LatestFileWrittenWhileFlushed) {
  const uint64_t fh = OpenLatest();
  std::atomic<bool> stop{false};
  std::atomic<int> parsed{0};  // flushes that found a write to commit
  std::thread flusher([&] {
    while (!stop) {
      const ptc::Status s = fs_->Flush(fh);  // each write is parsed once: not a number
      if (!s.ok()) {
        EXPECT_EQ(s.code(), ptc::Code::kInvalidArgument) << s.ToString();
        parsed++;
      }
    }
  });
  // Until many flushes ran among the writes (not one after the other), on a
  // busy machine too.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; (i < 2000 || parsed < 200) && std::chrono::steady_clock::now() < deadline; ++i) {
    const std::string text = i % 2 ? "not an iteration" : "x";
    auto n = fs_->Write(fh, text.data(), text.size(), 0);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, text.size());
    std::this_thread::yield();
  }
  stop = true;
  flusher.join();
  EXPECT_GE(parsed, 200);
  fs_->Release(fh);

  // One commit attempt per write: the flush after a write parses what was written, the next one nothing.
  const uint64_t again = OpenLatest();
  ASSERT_TRUE(fs_->Write(again, "12x", 3, 0).ok());
  const ptc::Status s = fs_->Flush(again);
  EXPECT_EQ(s.code(), ptc::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("'12x' is not an iteration number"), std::string::npos) << s.message();
  EXPECT_TRUE(fs_->Flush(again).ok());
  fs_->Release(again);
}

// A save renames its staged files and directories (Node::staged changes under
// the file system's lock) while other requests stat and open them.
TEST_F(FilesystemTest, StagedFilesRenamedWhileStatted) {
  auto dir = fs_->Mkdir(megatron_, "iter_0000200");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  auto created = fs_->Create(dir->ino, "a", O_WRONLY | O_CREAT);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const uint64_t ino = created->first.ino;
  ASSERT_TRUE(fs_->Write(created->second.fh, "bytes", 5, 0).ok());
  fs_->Release(created->second.fh);

  std::atomic<bool> stop{false};
  std::atomic<int> seen{0};
  std::thread reader([&] {
    while (!stop) {
      // Between the rename on disk and the new path in the node a stat can
      // miss the file (ENOENT); any answer it gives is the file's.
      auto attr = fs_->GetAttr(ino);
      if (attr.ok()) {
        EXPECT_EQ(attr->attr.st_size, 5);
        seen++;
      }
      auto h = fs_->Open(ino, O_RDONLY);
      if (h.ok()) {
        auto bytes = fs_->Read(h->fh, 0, 16);
        if (bytes.ok()) {
          EXPECT_EQ(std::string(bytes->bytes.begin(), bytes->bytes.end()), "bytes");
        }
        fs_->Release(h->fh);
      }
    }
  });
  std::string file = "a", iter = "iter_0000200";
  for (int i = 0; i < 400; ++i) {
    if (i % 2) {
      const std::string to = file == "a" ? "b" : "a";
      ASSERT_TRUE(fs_->Rename(dir->ino, file, dir->ino, to).ok());
      file = to;
    } else {
      const std::string to = iter == "iter_0000200" ? "iter_0000300" : "iter_0000200";
      ASSERT_TRUE(fs_->Rename(megatron_, iter, megatron_, to).ok());
      iter = to;
    }
  }
  stop = true;
  reader.join();
  // The node follows the file: stat and read find it where it now is.
  auto attr = fs_->GetAttr(ino);
  ASSERT_TRUE(attr.ok()) << attr.status().ToString();
  EXPECT_EQ(attr->attr.st_size, 5);
  EXPECT_EQ(Slurp(tmp_ / ("store/ingest/" + iter + "/" + file)), "bytes");
  EXPECT_EQ(fs_->Lookup(dir->ino, file).value().ino, ino);
}

// A cluster mount hands a config to its job: "proposed" until its agent
// applies it; a change the job aborted first (another worker failed at once)
// ends as "failed" with the reason; a proposal the job refused, or a change
// that cannot start here, says so too. (The agent's side: worker/agent.cc,
// worker_agent_test.)
TEST_F(FilesystemTest, AProposalEndsInItsOutcome) {
  using ptc::Code, ptc::FailedPreconditionError, ptc::ParallelConfig, ptc::Status;
  // A job that records what it is asked and answers as told.
  struct Job final : JobParticipant {
    Status Propose(const std::string& text, const ParallelConfig&) override {
      asked = text;
      return answer;
    }
    nlohmann::json StatusPart() const override { return {{"job", "j"}}; }
    ptc::Result<std::shared_ptr<AgreedChange>> ProposeSave(uint64_t) override {
      return FailedPreconditionError("no saves here");
    }
    ptc::Result<std::shared_ptr<AgreedChange>> ProposeDcpSave(const std::string&, const std::string&) override {
      return FailedPreconditionError("no saves here");
    }
    std::string asked;
    Status answer = Status::OK();
  } job;
  // A change that records the failure it is told of.
  struct Change final : AgreedChange {
    const std::set<int>& participants() const override { return workers; }
    Status BeforeCommit(ptc::GenerationWriter&, const std::string&) override { return Status::OK(); }
    ptc::Result<std::map<int, ptc::Part>> BeforeSaveCommit(ptc::GenerationWriter&,
                                                           const std::vector<ptc::TensorRecord>&, const nlohmann::json&,
                                                           const SettleFn&) override {
      return FailedPreconditionError("no saves here");
    }
    void Failed(const Status& s) override { told = s; }
    bool has_last_resort() const override { return false; }
    ptc::Result<std::vector<ptc::ShardRecord>> LastResort() override { return FailedPreconditionError("none"); }
    std::set<int> workers = {0};
    Status told = Status::OK();
  };
  Controller& c = fs_->controller();
  c.SetParticipant(&job);
  std::string& asked = job.asked;
  Status& answer = job.answer;
  auto state = [&] { return nlohmann::json::parse(c.StatusJson(fs_->snapshot())); };
  EXPECT_EQ(state()["cluster"], nlohmann::json({{"job", "j"}}));
  c.EndProposal(FailedPreconditionError("not proposed here"), /*by_agent=*/false);
  EXPECT_EQ(state()["state"], "serving");
  // A recovery the agent proposed on its own, aborted before this worker applied it.
  c.EndProposal(FailedPreconditionError("the change to generation 2 was aborted: cannot be recovered"),
                /*by_agent=*/true);
  EXPECT_EQ(state()["state"], "failed");
  EXPECT_EQ(state()["last_error"], "the change to generation 2 was aborted: cannot be recovered");
  ASSERT_TRUE(c.Reconfigure("tp=1,pp=1\n", fs_->snapshot()).ok());
  EXPECT_EQ(asked, "tp=1,pp=1\n");
  EXPECT_EQ(state()["state"], "proposed");
  EXPECT_EQ(state()["generation"], 1);
  c.EndProposal(FailedPreconditionError("the change to generation 2 was aborted: worker 2 failed"), /*by_agent=*/false);
  EXPECT_EQ(state()["state"], "failed");
  EXPECT_EQ(state()["last_error"], "the change to generation 2 was aborted: worker 2 failed");
  c.EndProposal(FailedPreconditionError("once only"), /*by_agent=*/true);  // not proposed: nothing changes
  EXPECT_EQ(state()["last_error"], "the change to generation 2 was aborted: worker 2 failed");
  // Refused by the job: the state stays as it was, the reason is kept.
  answer = FailedPreconditionError("a change is under way");
  EXPECT_EQ(c.Reconfigure("tp=1,pp=1\n", fs_->snapshot()).code(), Code::kFailedPrecondition);
  EXPECT_EQ(state()["state"], "failed");
  EXPECT_EQ(state()["last_error"], "a change is under way");
  // A bad config never reaches the job.
  asked.clear();
  EXPECT_EQ(c.Reconfigure("tp=3\n", fs_->snapshot()).code(), Code::kInvalidArgument);
  EXPECT_TRUE(asked.empty());
  // Proposed, then the job's change cannot start here: failed, and the job is told.
  answer = Status::OK();
  ASSERT_TRUE(c.Reconfigure("tp=2,pp=1\n", fs_->snapshot()).ok());
  EXPECT_EQ(state()["state"], "proposed");
  EXPECT_TRUE(state()["last_error"].is_null());
  auto change = std::make_shared<Change>();
  EXPECT_FALSE(c.Apply("{\"config\": \"tp=2,pp=1\", \"step\": 5}\n", fs_->snapshot(), change).ok());
  EXPECT_EQ(state()["state"], "failed");
  EXPECT_EQ(change->told.code(), Code::kInvalidArgument) << change->told.ToString();
  EXPECT_EQ(state()["last_error"], change->told.message());
  c.SetParticipant(nullptr);
}

// A job that takes every proposal and no save (a cluster mount's participant).
struct ProposalsOnly final : JobParticipant {
  ptc::Status Propose(const std::string&, const ptc::ParallelConfig&) override { return ptc::Status::OK(); }
  nlohmann::json StatusPart() const override { return {{"job", "j"}}; }
  ptc::Result<std::shared_ptr<AgreedChange>> ProposeSave(uint64_t) override {
    return ptc::FailedPreconditionError("no saves here");
  }
  ptc::Result<std::shared_ptr<AgreedChange>> ProposeDcpSave(const std::string&, const std::string&) override {
    return ptc::FailedPreconditionError("no saves here");
  }
};

// An agreed change that holds its commit until released.
struct HeldChange final : AgreedChange {
  const std::set<int>& participants() const override { return workers; }
  ptc::Status BeforeCommit(ptc::GenerationWriter&, const std::string&) override {
    reached.set_value();
    release.get_future().wait();
    return ptc::Status::OK();
  }
  ptc::Result<std::map<int, ptc::Part>> BeforeSaveCommit(ptc::GenerationWriter&, const std::vector<ptc::TensorRecord>&,
                                                         const nlohmann::json&, const SettleFn&) override {
    return ptc::FailedPreconditionError("no saves here");
  }
  void Failed(const ptc::Status&) override {}
  bool has_last_resort() const override { return false; }
  ptc::Result<std::vector<ptc::ShardRecord>> LastResort() override { return ptc::FailedPreconditionError("none"); }
  std::set<int> workers = {0};
  std::promise<void> reached, release;
};

// Issue 41, item 7: a rename onto dcp/NAME/.metadata refused because the
// mount is busy (EBUSY: a change under way) used to move the file anyway, so
// that the retry met ENOENT. A busy refusal now changes nothing: the file
// keeps its name, and the retry commits (here: is refused by the job, EIO).
TEST_F(FilesystemTest, ABusyDcpCommitLeavesTheFileWhereItWas) {
  Controller& c = fs_->controller();
  ProposalsOnly job;
  c.SetParticipant(&job);
  auto dcp = fs_->Lookup(kRootInode, "dcp");
  ASSERT_TRUE(dcp.ok()) << dcp.status().ToString();
  auto dir = fs_->Mkdir(dcp->ino, "step-1");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  auto created = fs_->Create(dir->ino, ".metadata.tmp", O_WRONLY | O_CREAT);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ASSERT_TRUE(fs_->Write(created->second.fh, "meta", 4, 0).ok());
  fs_->Release(created->second.fh);
  // A change under way: the mount writes until the change is released.
  ASSERT_TRUE(c.Reconfigure("tp=1,pp=1\n", fs_->snapshot()).ok());
  auto change = std::make_shared<HeldChange>();
  ASSERT_TRUE(c.Apply("tp=1,pp=1\n", fs_->snapshot(), change).ok());
  change->reached.get_future().wait();
  const ptc::Status busy = fs_->Rename(dir->ino, ".metadata.tmp", dir->ino, ".metadata");
  EXPECT_EQ(busy.code(), ptc::Code::kFailedPrecondition) << busy.ToString();
  EXPECT_EQ(ErrnoOf(busy), EBUSY);
  EXPECT_TRUE(fs_->Lookup(dir->ino, ".metadata.tmp").ok()) << "moved although refused";
  EXPECT_FALSE(fs_->Lookup(dir->ino, ".metadata").ok());
  EXPECT_EQ(Slurp(tmp_ / "store/ingest/.dcp/step-1/.metadata.tmp"), "meta");
  change->release.set_value();
  for (int i = 0; i < 500 && nlohmann::json::parse(c.StatusJson(fs_->snapshot()))["state"] != "serving"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(nlohmann::json::parse(c.StatusJson(fs_->snapshot()))["state"], "serving");
  const ptc::Status again = fs_->Rename(dir->ino, ".metadata.tmp", dir->ino, ".metadata");
  EXPECT_EQ(ErrnoOf(again), EIO) << again.ToString();  // the save reached the job this time
  EXPECT_TRUE(ptc::testing::Contains(again.message(), "no saves here")) << again.ToString();
  c.SetParticipant(nullptr);
}

// Issue 41, item 5: a dcp.save into dcp/runs/step-5 returned normally and
// committed nothing. A save is a directory directly under dcp/: a directory
// inside one is refused (EACCES) saying so, and so is a .metadata landing in one.
TEST_F(FilesystemTest, ASaveNestedInDcpIsRefusedSayingWhy) {
  auto dcp = fs_->Lookup(kRootInode, "dcp");
  ASSERT_TRUE(dcp.ok()) << dcp.status().ToString();
  auto runs = fs_->Mkdir(dcp->ino, "runs");
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  auto nested = fs_->Mkdir(runs->ino, "step-5");
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(ErrnoOf(nested.status()), EACCES);
  EXPECT_TRUE(ptc::testing::Contains(nested.status().message(), "dcp/runs/step-5: a DCP save is a directory directly "
                                                                "under dcp/"))
      << nested.status().ToString();
  const auto status = nlohmann::json::parse(fs_->controller().StatusJson(fs_->snapshot()));
  EXPECT_EQ(status["last_error"], nested.status().message()) << status.dump();  // dcp.save's OSError says EACCES only
  // Nor is a save moved into another one.
  auto other = fs_->Mkdir(dcp->ino, "other");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const ptc::Status moved = fs_->Rename(dcp->ino, "other", runs->ino, "other");
  EXPECT_EQ(ErrnoOf(moved), EACCES) << moved.ToString();
  EXPECT_TRUE(fs_->Lookup(dcp->ino, "other").ok());
  EXPECT_TRUE(fs::is_directory(tmp_ / "store/ingest/.dcp/other"));
  // Renamed among themselves, saves stay saves.
  EXPECT_TRUE(fs_->Rename(dcp->ino, "other", dcp->ino, "step-6").ok());
}

}  // namespace
}  // namespace ptcfs
