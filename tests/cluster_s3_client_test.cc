// The S3 client's retries (cluster/s3/retry.h, s3_client.h) and the S3Env's
// uploads and reads (s3_env.h), against an in-memory bucket that fails on
// demand (s3_fake.h). The real server: cluster_s3_server_test (radosgw).
#include <gtest/gtest.h>

#include <random>

#include "cluster/s3/retry.h"
#include "cluster/s3/s3_client.h"
#include "cluster/s3/s3_env.h"
#include "s3_fake.h"

namespace ptc::cluster::s3 {
namespace {

using testing::FakeS3;

class Forward final : public Transport {
 public:
  explicit Forward(Transport* t) : t_(t) {}
  Result<HttpResponse> Send(const HttpRequest& r) override { return t_->Send(r); }

 private:
  Transport* t_;
};

class S3ClientTest : public ::testing::Test {
 protected:
  std::shared_ptr<S3Client> Client(RetryPolicy p = {6, std::chrono::milliseconds(1), std::chrono::milliseconds(4)}) {
    S3Config c;
    c.endpoint = {"http", "fake", 80};
    c.credentials = {"AKID", "SECRET", ""};
    return std::make_shared<S3Client>(c, std::make_unique<Forward>(&fake_), p);
  }
  FakeS3 fake_;
};

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

TEST(RetryPolicy, TransientAnswersAndBackoff) {
  for (int s : {0, 500, 502, 503, 504}) EXPECT_TRUE(Transient(s)) << s;
  for (int s : {200, 400, 403, 404, 409, 416}) EXPECT_FALSE(Transient(s)) << s;
  const RetryPolicy p{6, std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};
  EXPECT_EQ(Backoff(p, 1, 0.5).count(), 50);
  EXPECT_EQ(Backoff(p, 2, 0.5).count(), 100);
  EXPECT_EQ(Backoff(p, 3, 0.999).count(), 399);
  EXPECT_EQ(Backoff(p, 10, 0.5).count(), 500);  // capped at 1 s
  EXPECT_EQ(Backoff(p, 1, 0.0).count(), 0);
}

TEST_F(S3ClientTest, SlowDownIsRetriedUntilItPasses) {
  fake_.Inject({"PUT", "", 503, 2});
  auto c = Client();
  ASSERT_TRUE(c->Put("bkt", "a/b", "hello").ok());
  EXPECT_EQ(fake_.requests(), 3);
  EXPECT_EQ(fake_.objects().at("a/b"), "hello");
}

TEST_F(S3ClientTest, NoAnswerIsRetriedToo) {
  fake_.Inject({"GET", "", 0, 1});
  fake_.Set("k", "0123456789");
  auto c = Client();
  char buf[4];
  ASSERT_TRUE(c->GetRange("bkt", "k", 3, 4, buf).ok());
  EXPECT_EQ(std::string(buf, 4), "3456");
  EXPECT_EQ(fake_.requests(), 2);
}

// A range streamed to a sink: every byte given once per request at its
// offset; a request that got no answer is sent again and gives them again
// from the start; the sink's error ends the read and it is not called again.
TEST_F(S3ClientTest, ARangeStreamsToItsSinkAgainFromTheStartOnARetry) {
  const std::string bytes = Bytes((3 << 20) + 77, 3);
  fake_.Set("k", bytes);
  auto c = Client();
  std::string got(bytes.size() - 10, '\0');
  int calls = 0;
  auto sink = [&](uint64_t at, const char* data, size_t n) {
    ++calls;
    if (at + n > got.size()) return IOError("past the end");
    std::copy(data, data + n, got.data() + at);
    return Status::OK();
  };
  ASSERT_TRUE(c->GetRangeTo("bkt", "k", 10, got.size(), sink).ok());
  EXPECT_EQ(got, bytes.substr(10));
  EXPECT_EQ(calls, 4);  // 1 MiB pieces
  fake_.Inject({"GET", "", 0, 1});
  calls = 0;
  got.assign(got.size(), '\0');
  ASSERT_TRUE(c->GetRangeTo("bkt", "k", 10, got.size(), sink).ok());
  EXPECT_EQ(got, bytes.substr(10));
  calls = 0;
  Status s = c->GetRangeTo("bkt", "k", 10, got.size(), [&](uint64_t, const char*, size_t) {
    ++calls;
    return IOError("the local disk is full");
  });
  EXPECT_EQ(s.message(), "the local disk is full") << s.ToString();
  EXPECT_EQ(calls, 1);
  // An object shorter than the range asked.
  s = c->GetRangeTo("bkt", "k", bytes.size() - 5, 10, sink);
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
}

TEST_F(S3ClientTest, GivesUpAfterTheLastTryNamingTheObjectAndWhy) {
  fake_.Inject({"PUT", "", 503, 100});
  Status s = Client()->Put("bkt", "gen-000001/worker-00.bin", "x");
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("s3://bkt/gen-000001/worker-00.bin"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("SlowDown"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("6 tries"), std::string::npos) << s.ToString();
  EXPECT_EQ(fake_.requests(), 6);
}

TEST_F(S3ClientTest, AFinalAnswerIsNotRetried) {
  fake_.Inject({"GET", "", 403, 100});
  auto got = Client()->Get("bkt", "k");
  EXPECT_EQ(got.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(fake_.requests(), 1);
  auto head = Client()->Head("bkt", "absent");
  ASSERT_TRUE(head.ok());
  EXPECT_FALSE(head->has_value());
}

TEST_F(S3ClientTest, AShortObjectIsCorruptionNamingIt) {
  fake_.Set("k", "0123");
  char buf[8];
  Status s = Client()->GetRange("bkt", "k", 2, 8, buf);
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find("s3://bkt/k"), std::string::npos) << s.ToString();
}

// A file larger than a part: a multipart upload, parts in parallel, the
// object there only once Close completes it; read back by ranges.
TEST_F(S3ClientTest, AFileIsUploadedInPartsAndAppearsWholeOnClose) {
  auto env = NewS3Env(Client(), "bkt", {64 << 10, 3});
  const std::string bytes = Bytes((64 << 10) * 5 + 1234, 7);
  auto f = env->OpenWrite("dir/obj.bin");
  ASSERT_TRUE(f.ok());
  for (size_t at = 0; at < bytes.size(); at += 10000) {
    ASSERT_TRUE((*f)->Append(bytes.data() + at, std::min<size_t>(10000, bytes.size() - at)).ok());
  }
  EXPECT_FALSE(env->Exists("dir/obj.bin"));
  EXPECT_EQ(fake_.open_uploads(), 1u);
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(fake_.objects().at("dir/obj.bin"), bytes);
  EXPECT_EQ(fake_.open_uploads(), 0u);
  auto r = env->OpenRead("dir/obj.bin");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Size(), bytes.size());
  std::string back(100000, '\0');
  ASSERT_TRUE((*r)->Read(200000, back.size(), back.data()).ok());
  EXPECT_EQ(back, bytes.substr(200000, 100000));
  auto names = env->ListDir("dir");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"obj.bin"});
}

TEST_F(S3ClientTest, AnUnclosedFileLeavesNoObjectAndNoUpload) {
  auto env = NewS3Env(Client(), "bkt", {64 << 10, 2});
  {
    auto f = env->OpenWrite("x.bin");
    const std::string bytes = Bytes(200 << 10, 3);
    ASSERT_TRUE((*f)->Append(bytes.data(), bytes.size()).ok());
  }
  EXPECT_TRUE(fake_.objects().empty());
  EXPECT_EQ(fake_.open_uploads(), 0u);
}

TEST_F(S3ClientTest, APartThatKeepsFailingFailsTheFileNamingIt) {
  fake_.Inject({"PUT", "partNumber=2", 500, 100});
  auto env = NewS3Env(Client(), "bkt", {64 << 10, 2});
  auto f = env->OpenWrite("gen-000003/worker-01.bin");
  const std::string bytes = Bytes(300 << 10, 5);
  Status s = (*f)->Append(bytes.data(), bytes.size());
  if (s.ok()) s = (*f)->Close();
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("s3://bkt/gen-000003/worker-01.bin"), std::string::npos) << s.ToString();
  (void)(*f)->Close();
  f->reset();
  EXPECT_TRUE(fake_.objects().empty());
  EXPECT_EQ(fake_.open_uploads(), 0u);
}

TEST_F(S3ClientTest, RenameAndRemoveTree) {
  auto env = NewS3Env(Client(), "bkt");
  ASSERT_TRUE(WriteFileAtomic(env.get(), "p/durable.json", "{}").ok());
  fake_.Set("p/gen-000001/worker-00.bin", "a");
  fake_.Set("p/gen-000001/worker-00.json", "b");
  auto names = env->ListDir("p");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"durable.json", "gen-000001"}));
  ASSERT_TRUE(env->RemoveTree("p/gen-000001").ok());
  EXPECT_EQ(fake_.objects(), (std::map<std::string, std::string>{{"p/durable.json", "{}"}}));
}

TEST(S3Url, ParsesBucketAndPrefixAndRefusesBadOnes) {
  auto u = ParseS3Url("s3://my-bucket/jobs/a/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->bucket, "my-bucket");
  EXPECT_EQ(u->prefix, "jobs/a");
  EXPECT_EQ(ParseS3Url("s3://B/x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseS3Url("s3://ok-bucket/a//b").status().code(), Code::kInvalidArgument);
  auto e = ParseEndpoint("http://127.0.0.1:7480");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->port, 7480);
  EXPECT_EQ(ParseEndpoint("ftp://x").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ptc::cluster::s3
