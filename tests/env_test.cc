// One conformance suite run against every Env (POSIX in a temporary directory,
// memory), plus the fault-injecting wrapper.
#include "ptc/base/env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "ptc/base/fault_injection_env.h"

namespace ptc {
namespace {

struct EnvCase {
  std::string name;
  std::function<std::unique_ptr<Env>()> make;  // nullptr env means Env::Default()
  bool posix;
};

class EnvConformance : public ::testing::TestWithParam<EnvCase> {
 protected:
  void SetUp() override {
    if (GetParam().posix) {
      char tmpl[] = "/tmp/ptcfs_env_test.XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      root_ = tmpl;
      env_ = Env::Default();
    } else {
      owned_ = GetParam().make();
      env_ = owned_.get();
      root_ = "/mem/root";
      ASSERT_TRUE(env_->CreateDirs(root_).ok());
    }
  }
  void TearDown() override {
    if (GetParam().posix) std::filesystem::remove_all(root_);
  }
  std::string P(std::string_view rel) const { return JoinPath(root_, rel); }

  std::unique_ptr<Env> owned_;
  Env* env_ = nullptr;
  std::string root_;
};

TEST_P(EnvConformance, WriteReadRoundTrip) {
  auto w = env_->OpenWrite(P("a.bin"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append("hello ", 6).ok());
  ASSERT_TRUE((*w)->Append("world", 5).ok());
  ASSERT_TRUE((*w)->PWrite(20, "X", 1).ok());  // grows with a zero gap
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  ASSERT_TRUE((*w)->Close().ok());  // idempotent
  EXPECT_FALSE((*w)->Append("z", 1).ok());

  auto r = env_->OpenRead(P("a.bin"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Size(), 21u);
  EXPECT_EQ((*r)->path(), P("a.bin"));
  char buf[21];
  ASSERT_TRUE((*r)->Read(0, 21, buf).ok());
  EXPECT_EQ(std::string(buf, 11), "hello world");
  EXPECT_EQ(buf[15], '\0');
  EXPECT_EQ(buf[20], 'X');
  EXPECT_EQ((*r)->fd() >= 0, GetParam().posix);
  auto size = env_->FileSize(P("a.bin"));
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 21u);
}

TEST_P(EnvConformance, ShortReadIsCorruption) {
  ASSERT_TRUE(WriteFileAtomic(env_, P("s"), "abc").ok());
  auto r = env_->OpenRead(P("s"));
  ASSERT_TRUE(r.ok());
  char buf[8];
  Status s = (*r)->Read(1, 3, buf);
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find(P("s")), std::string::npos) << s.ToString();
  EXPECT_EQ((*r)->Read(10, 1, buf).code(), Code::kCorruption);
  EXPECT_TRUE((*r)->Read(3, 0, buf).ok());
}

TEST_P(EnvConformance, MissingFiles) {
  EXPECT_EQ(env_->OpenRead(P("nope")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->OpenExisting(P("nope")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->FileSize(P("nope")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->ListDir(P("nope")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->OpenWrite(P("nodir/f")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->Rename(P("nope"), P("x")).code(), Code::kNotFound);
  EXPECT_FALSE(env_->Remove(P("nope")).ok());
  EXPECT_TRUE(env_->RemoveTree(P("nope")).ok());
  EXPECT_FALSE(env_->Exists(P("nope")));
  EXPECT_EQ(ReadFileToString(env_, P("nope")).status().code(), Code::kNotFound);
}

TEST_P(EnvConformance, OpenExistingKeepsContent) {
  ASSERT_TRUE(WriteFileAtomic(env_, P("e"), "0123456789").ok());
  auto w = env_->OpenExisting(P("e"));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->PWrite(2, "ab", 2).ok());
  ASSERT_TRUE((*w)->Append("Z", 1).ok());  // at the previous end
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(*ReadFileToString(env_, P("e")), "01ab456789Z");
}

TEST_P(EnvConformance, DirectoriesAndListing) {
  ASSERT_TRUE(env_->CreateDirs(P("d/e/f")).ok());
  ASSERT_TRUE(env_->CreateDirs(P("d/e/f")).ok());  // exists: OK
  EXPECT_TRUE(env_->IsDirectory(P("d/e")));
  EXPECT_TRUE(env_->Exists(P("d/e/f")));
  ASSERT_TRUE(WriteFileAtomic(env_, P("d/b.txt"), "b").ok());
  ASSERT_TRUE(WriteFileAtomic(env_, P("d/a.txt"), "a").ok());
  EXPECT_FALSE(env_->IsDirectory(P("d/a.txt")));
  auto names = env_->ListDir(P("d"));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"a.txt", "b.txt", "e"}));  // no .tmp left over
  EXPECT_FALSE(env_->CreateDirs(P("d/a.txt/x")).ok());
  EXPECT_FALSE(env_->Remove(P("d/e")).ok());   // not empty
  ASSERT_TRUE(env_->Remove(P("d/e/f")).ok());  // empty directory
  EXPECT_FALSE(env_->Exists(P("d/e/f")));
  ASSERT_TRUE(env_->Remove(P("d/a.txt")).ok());
  ASSERT_TRUE(env_->SyncDir(P("d")).ok());
  ASSERT_TRUE(env_->RemoveTree(P("d")).ok());
  EXPECT_FALSE(env_->Exists(P("d")));
  EXPECT_FALSE(env_->Exists(P("d/b.txt")));
}

TEST_P(EnvConformance, RenameReplacesAtomically) {
  ASSERT_TRUE(WriteFileAtomic(env_, P("m"), "old").ok());
  auto reader = env_->OpenRead(P("m"));
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(WriteFileAtomic(env_, P("m"), "newer").ok());
  EXPECT_EQ(*ReadFileToString(env_, P("m")), "newer");
  char buf[3];
  ASSERT_TRUE((*reader)->Read(0, 3, buf).ok());  // an open handle keeps the old file
  EXPECT_EQ(std::string(buf, 3), "old");
  EXPECT_FALSE(env_->Exists(P("m.tmp")));
}

TEST_P(EnvConformance, LinkGivesAFileASecondName) {
  ASSERT_TRUE(WriteFileAtomic(env_, P("a"), "bytes").ok());
  ASSERT_TRUE(env_->Link(P("a"), P("b")).ok());
  ASSERT_TRUE(env_->Remove(P("a")).ok());  // the other name keeps the bytes
  EXPECT_EQ(*ReadFileToString(env_, P("b")), "bytes");
  EXPECT_EQ(env_->Link(P("absent"), P("c")).code(), Code::kNotFound);
  ASSERT_TRUE(WriteFileAtomic(env_, P("a"), "other").ok());
  EXPECT_EQ(env_->Link(P("a"), P("b")).code(), Code::kAlreadyExists);
  EXPECT_EQ(*ReadFileToString(env_, P("b")), "bytes");
}

TEST_P(EnvConformance, RenameDirectory) {
  ASSERT_TRUE(env_->CreateDirs(P("x/y")).ok());
  ASSERT_TRUE(WriteFileAtomic(env_, P("x/y/f"), "f").ok());
  ASSERT_TRUE(env_->Rename(P("x"), P("z")).ok());
  EXPECT_FALSE(env_->Exists(P("x")));
  EXPECT_EQ(*ReadFileToString(env_, P("z/y/f")), "f");
}

TEST_P(EnvConformance, ConcurrentReads) {
  std::string data(1 << 16, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(WriteFileAtomic(env_, P("c"), data).ok());
  auto r = env_->OpenRead(P("c"));
  ASSERT_TRUE(r.ok());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::string buf(4096, '\0');
      for (size_t off = t * 512; off + buf.size() <= data.size(); off += 4096) {
        if (!(*r)->Read(off, buf.size(), buf.data()).ok() || buf != data.substr(off, buf.size())) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// Output trees: entries made by name in their directory, one entry per name,
// files created new; the same answers from every Env.
TEST_P(EnvConformance, OutputDirMakesEntriesByName) {
  auto out = env_->OpenOutputDir(P("out/tree"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)->path(), P("out/tree"));
  auto sub = (*out)->CreateDir("rank-00000");
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_TRUE((*out)->CreateDir("rank-00000").ok());  // an existing directory is reused
  auto w = (*sub)->NewWritableFile("model.safetensors");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append("bytes", 5).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(*ReadFileToString(env_, P("out/tree/rank-00000/model.safetensors")), "bytes");
  auto again = (*sub)->NewWritableFile("model.safetensors");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists) << again.status().ToString();
  EXPECT_EQ(*ReadFileToString(env_, P("out/tree/rank-00000/model.safetensors")), "bytes");
  for (const std::string bad : {"", ".", "..", "../x", "a/b", "/abs"}) {
    EXPECT_EQ((*out)->CreateDir(bad).status().code(), Code::kInvalidArgument) << bad;
    auto f = (*out)->NewWritableFile(bad);
    EXPECT_EQ(f.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(f.status().message().find(P("out/tree")), std::string::npos) << f.status().ToString();
  }
  EXPECT_EQ((*out)->Rename("x", "../y").code(), Code::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(**sub, "latest.txt", "12").ok());
  ASSERT_TRUE(WriteFileAtomic(**sub, "latest.txt", "13").ok());  // replaces
  EXPECT_EQ(*ReadFileToString(env_, P("out/tree/rank-00000/latest.txt")), "13");
  EXPECT_FALSE(env_->Exists(P("out/tree/rank-00000/latest.txt.tmp")));
  EXPECT_EQ((*out)->CreateDir("rank-00000/latest.txt").status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*sub)->CreateDir("latest.txt").status().code(), Code::kAlreadyExists);  // a file
}

// POSIX: a link in an output tree is refused, naming it, whatever it points to.
TEST(PosixOutputDir, RefusesLinks) {
  char tmpl[] = "/tmp/ptcfs_env_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  Env* env = Env::Default();
  ASSERT_TRUE(WriteFileAtomic(env, root + "/victim", "victim").ok());
  ASSERT_TRUE(env->CreateDirs(root + "/elsewhere").ok());
  ASSERT_TRUE(env->CreateDirs(root + "/out").ok());
  std::filesystem::create_symlink(root + "/victim", root + "/out/file");
  std::filesystem::create_symlink(root + "/nowhere", root + "/out/dangling");
  std::filesystem::create_directory_symlink(root + "/elsewhere", root + "/out/dir");
  auto out = env->OpenOutputDir(root + "/out");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (const char* name : {"file", "dangling", "dir"}) {
    auto f = (*out)->NewWritableFile(name);
    EXPECT_EQ(f.status().code(), Code::kPermissionDenied) << name;
    EXPECT_NE(f.status().message().find(root + "/out/" + name + ": a symbolic link"), std::string::npos)
        << f.status().ToString();
    auto d = (*out)->CreateDir(name);
    EXPECT_EQ(d.status().code(), Code::kPermissionDenied) << name;
    EXPECT_NE(d.status().message().find(root + "/out/" + name + ": a symbolic link"), std::string::npos)
        << d.status().ToString();
  }
  // OpenWrite by path does not follow a link as its last component either.
  EXPECT_EQ(env->OpenWrite(root + "/out/file").status().code(), Code::kPermissionDenied);
  EXPECT_FALSE(std::filesystem::exists(root + "/nowhere"));
  EXPECT_TRUE(std::filesystem::is_empty(root + "/elsewhere"));
  EXPECT_EQ(*ReadFileToString(env, root + "/victim"), "victim");
  std::filesystem::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(All, EnvConformance,
                         ::testing::Values(EnvCase{"Posix", nullptr, true}, EnvCase{"Mem", NewMemEnv, false}),
                         [](const auto& info) { return info.param.name; });

TEST(PathHelpers, JoinAndDirName) {
  EXPECT_EQ(JoinPath("a/b", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("a/b/", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(JoinPath("a", ""), "a");
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("/a"), "/");
  EXPECT_EQ(DirName("a"), ".");
  EXPECT_EQ(DirName("a/b/"), "a");
}

TEST(FaultInjection, FailsTheNthMutatingOpAndAfter) {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  env.FailAfter(2);
  auto w = env.OpenWrite("/d/f");  // op 0
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Append("a", 1).ok());  // op 1
  Status s = (*w)->Sync();                 // op 2: fails
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("injected fault in Sync"), std::string::npos) << s.ToString();
  EXPECT_FALSE(env.Rename("/d/f", "/d/g").ok());  // sticky
  EXPECT_TRUE(env.Exists("/d/f"));                // failed op did nothing
  EXPECT_TRUE(env.OpenRead("/d/f").ok());         // reads are never failed
  EXPECT_EQ(env.ops(), 4);
  EXPECT_EQ(env.failures(), 2);
  env.Disarm();
  EXPECT_TRUE(env.Rename("/d/f", "/d/g").ok());
}

TEST(FaultInjection, FailOnceAndCode) {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  env.FailOnceAfter(1, Code::kCorruption);
  EXPECT_TRUE(env.CreateDirs("/a").ok());
  EXPECT_EQ(env.CreateDirs("/b").code(), Code::kCorruption);
  EXPECT_TRUE(env.CreateDirs("/c").ok());
  EXPECT_FALSE(env.Exists("/b"));
}

TEST(FaultInjection, OnlyRenameAndSync) {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  env.SetOnlyRenameAndSync(true);
  env.FailAfter(0);
  EXPECT_TRUE(env.CreateDirs("/d").ok());
  auto w = env.OpenWrite("/d/f");
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Append("x", 1).ok());
  EXPECT_FALSE((*w)->Sync().ok());
  EXPECT_FALSE(env.Rename("/d/f", "/d/g").ok());
  EXPECT_EQ(env.ops(), 2);
}

// Every failure point of WriteFileAtomic leaves the old content or the new one.
TEST(FaultInjection, WriteFileAtomicAllOrNothing) {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  ASSERT_TRUE(WriteFileAtomic(&env, "/d/m", "old").ok());
  for (int n = 0;; ++n) {
    env.FailAfter(n);
    Status s = WriteFileAtomic(&env, "/d/m", "new");
    env.Disarm();
    std::string now = *ReadFileToString(&env, "/d/m");
    if (s.ok()) {
      EXPECT_EQ(now, "new");
      break;
    }
    EXPECT_TRUE(now == "old" || now == "new") << now;
    ASSERT_TRUE(WriteFileAtomic(&env, "/d/m", "old").ok());
    ASSERT_LT(n, 100);
  }
}

// The output tree's entries are counted and failed like the Env's paths.
TEST(FaultInjection, OutputDirOpsAreCounted) {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  auto out = env.OpenOutputDir("/o");  // op 0 (CreateDirs)
  ASSERT_TRUE(out.ok());
  env.FailAfter(2);
  auto dir = (*out)->CreateDir("d");  // op 0
  ASSERT_TRUE(dir.ok());
  auto w = (*dir)->NewWritableFile("f");  // op 1
  ASSERT_TRUE(w.ok());
  Status s = (*w)->Append("x", 1);  // op 2: fails
  EXPECT_NE(s.message().find("/o/d/f: injected fault in Append"), std::string::npos) << s.ToString();
  EXPECT_NE((*dir)->NewWritableFile("g").status().message().find("/o/d/g: injected fault in OpenWrite"),
            std::string::npos);
  EXPECT_FALSE(env.Exists("/o/d/g"));  // the failed op did nothing
  EXPECT_FALSE(WriteFileAtomic(**dir, "h", "h").ok());
  EXPECT_EQ(env.ops(), 5);
  env.Disarm();
  EXPECT_TRUE(WriteFileAtomic(**dir, "h", "h").ok());
}

}  // namespace
}  // namespace ptc
