// The pure parts of the cluster layer's etcd client: base64, the gateway's
// JSON, member records, the job's keys. No etcd needed (cluster_etcd_test runs a real one).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "cluster/base64.h"
#include "cluster/etcd_codec.h"
#include "cluster/job_state.h"
#include "cluster/keys.h"
#include "cluster/membership.h"
#include "test_util.h"

namespace ptc::cluster {
namespace {

TEST(Base64, KnownVectorsAndRoundTrips) {
  // RFC 4648 section 10.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (auto [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    auto d = Base64Decode(encoded);
    ASSERT_TRUE(d.ok()) << encoded;
    EXPECT_EQ(*d, plain);
  }
  std::mt19937_64 rng(testing::TestSeed());
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    EXPECT_EQ(*Base64Decode(Base64Encode(s)), s);
  }
  for (const char* bad : {"Zg=", "Zg", "Z===", "Zm9v!A==", "=Zm9", "Zg==Zm9v", "Zm=v"}) {
    EXPECT_EQ(Base64Decode(bad).status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(EtcdCodec, PrefixRangeEnd) {
  EXPECT_EQ(PrefixRangeEnd("/ptcfs/j/members/"), "/ptcfs/j/members0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff", 1)), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdCodec, EncodesRequests) {
  EXPECT_EQ(EncodePutRequest("foo", "bar", 0), R"({"key":"Zm9v","value":"YmFy"})");
  EXPECT_EQ(EncodePutRequest("foo", "bar", 42), R"({"key":"Zm9v","lease":"42","value":"YmFy"})");
  EXPECT_EQ(EncodeRangeRequest("a", "b"), R"({"key":"YQ==","range_end":"Yg=="})");
  TxnRequest txn;
  txn.compare = {Compare::ModRevisionIs("a", 7), Compare::Absent("b"), Compare::ValueIs("c", "v")};
  txn.success = {TxnOp::Put("a", "x", 5), TxnOp::Delete("b")};
  txn.failure = {TxnOp::DeletePrefix("p/")};
  auto j = nlohmann::json::parse(EncodeTxnRequest(txn));
  EXPECT_EQ(j["compare"][0],
            nlohmann::json::parse(R"({"key":"YQ==","target":"MOD","result":"EQUAL","mod_revision":"7"})"));
  EXPECT_EQ(j["compare"][1]["target"], "CREATE");
  EXPECT_EQ(j["compare"][1]["create_revision"], "0");
  EXPECT_EQ(j["compare"][2]["value"], "dg==");
  EXPECT_EQ(j["success"][0]["request_put"]["lease"], "5");
  EXPECT_EQ(j["success"][1]["request_delete_range"]["key"], "Yg==");
  EXPECT_EQ(j["failure"][0]["request_delete_range"]["range_end"], Base64Encode("p0"));
  EXPECT_EQ(EncodeLeaseIdRequest(-3), R"({"ID":"-3"})");
}

TEST(EtcdCodec, DecodesResponses) {
  // As etcd 3.4's gateway answers (int64 as strings, zero fields left out).
  const char* range =
      R"({"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"2"},)"
      R"("kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"Yg==","lease":"77"},)"
      R"({"key":"Zm9w","create_revision":"4","mod_revision":"4","version":"1"}],"count":"2"})";
  auto r = DecodeRangeResponse("t", range);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0], (KeyValue{"foo", "b", 2, 3, 2, 77}));
  EXPECT_EQ(r->kvs[1], (KeyValue{"fop", "", 4, 4, 1, 0}));
  auto empty = DecodeRangeResponse("t", R"({"header":{"revision":"5"}})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->kvs.empty());
  auto txn = DecodeTxnResponse("t", R"({"header":{"revision":"3"},"succeeded":true,"responses":[]})");
  ASSERT_TRUE(txn.ok());
  EXPECT_TRUE(txn->succeeded);
  EXPECT_FALSE(DecodeTxnResponse("t", R"({"header":{"revision":"3"}})")->succeeded);
  EXPECT_EQ(*DecodeDeleteRangeResponse("t", R"({"header":{"revision":"4"},"deleted":"1"})"), 1);
  auto grant = DecodeLeaseGrantResponse("t", R"({"header":{"revision":"2"},"ID":"4111120367654036745","TTL":"1"})");
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->id, 4111120367654036745);
  EXPECT_EQ(grant->ttl, 1);
  EXPECT_EQ(*DecodeLeaseKeepAliveResponse("t", R"({"result":{"header":{},"ID":"5","TTL":"4"}})"
                                               "\n"),
            4);
  EXPECT_EQ(*DecodeLeaseKeepAliveResponse("t", R"({"result":{"header":{},"ID":"5"}})"), 0);
  Status e = DecodeErrorBody("etcd x", R"({"error":"etcdserver: requested lease not found","code":5})");
  EXPECT_EQ(e.code(), Code::kNotFound);
  EXPECT_NE(e.message().find("lease not found"), std::string::npos);
  EXPECT_TRUE(DecodeErrorBody("etcd x", "not json").ok());
  for (const char* bad : {"", "[]", R"({"header":{"revision":"x"}})",
                          R"({"header":{"revision":"1"},"kvs":[{"key":"!!"}]})", R"({"header":{},"kvs":{}})"}) {
    EXPECT_EQ(DecodeRangeResponse("t", bad).status().code(), Code::kCorruption) << bad;
  }
}

TEST(EtcdCodec, WatchStreamMessages) {
  EXPECT_EQ(EncodeWatchCreateRequest("/a/", "/a0", 12),
            R"({"create_request":{"key":"L2Ev","range_end":"L2Ew","start_revision":"12"}})");
  // As etcd 3.4's gateway streams them, one per line.
  auto created = DecodeWatchMessage("w", R"({"result":{"header":{"revision":"1"},"created":true}})");
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(created->created);
  EXPECT_EQ(created->events, 0u);
  EXPECT_EQ(created->revision, 1);
  auto events = DecodeWatchMessage(
      "w", R"({"result":{"header":{"revision":"2"},"events":[{"kv":{"key":"L2ovYQ==","mod_revision":"2"}},)"
           R"({"type":"DELETE","kv":{"key":"L2ovYg=="}}]}})");
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  EXPECT_FALSE(events->created);
  EXPECT_EQ(events->events, 2u);
  auto compacted = DecodeWatchMessage(
      "w", R"({"result":{"header":{"revision":"9"},"compact_revision":"5","canceled":true}})");
  ASSERT_TRUE(compacted.ok());
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 5);
  Status failed = DecodeWatchMessage("etcd x: watch", R"({"error":{"grpc_code":14,"message":"transport closing"}})")
                      .status();
  EXPECT_EQ(failed.code(), Code::kIOError);
  EXPECT_NE(failed.message().find("etcd x: watch: the watch failed: transport closing"), std::string::npos);
  for (const char* bad : {"", "[]", "{}", R"({"result":[]})", R"({"result":{"header":{"revision":"1"},"created":1}})",
                          R"({"result":{"header":{"revision":"1"},"events":{}}})", R"({"result":{}})"}) {
    EXPECT_EQ(DecodeWatchMessage("w", bad).status().code(), Code::kCorruption) << bad;
  }
}

TEST(MemberRecord, KeysAndValues) {
  EXPECT_EQ(MemberKey("job-1", 3), "/ptcfs/job-1/members/3");
  EXPECT_EQ(MembersPrefix("job-1"), "/ptcfs/job-1/members/");
  Member m{3, "10.0.0.3:8470"};
  EXPECT_EQ(EncodeMember(m), R"({"address":"10.0.0.3:8470","worker":3})");
  EXPECT_EQ(*DecodeMember("k", EncodeMember(m)), m);
  EXPECT_EQ(DecodeMember("k", R"({"worker":-1,"address":"a:1"})").status().code(), Code::kCorruption);
  EXPECT_EQ(DecodeMember("k", R"({"worker":1})").status().code(), Code::kCorruption);
  EXPECT_TRUE(ValidateJobName("llama-70b_run.3").ok());
  for (const char* bad : {"", "a/b", "..", "a b", "job\n"}) EXPECT_FALSE(ValidateJobName(bad).ok()) << bad;
}

// Every key of a job, in one place (keys.h).
TEST(Keys, TheJobsLayout) {
  EXPECT_EQ(JobPrefix("j"), "/ptcfs/j/");
  EXPECT_EQ(MembersPrefix("j"), "/ptcfs/j/members/");
  EXPECT_EQ(MemberKey("j", 3), "/ptcfs/j/members/3");
  EXPECT_EQ(CommittedKey("j"), "/ptcfs/j/committed");
  EXPECT_EQ(ChangeKey("j"), "/ptcfs/j/change");
  EXPECT_EQ(GenerationPrefix("j", 5), "/ptcfs/j/gen/5/");
  EXPECT_EQ(PartsPrefix("j", 5), "/ptcfs/j/gen/5/part/");
  EXPECT_EQ(PartKey("j", 5, 2), "/ptcfs/j/gen/5/part/2");
  EXPECT_EQ(AbortedKey("j", 5), "/ptcfs/j/gen/5/aborted");
  EXPECT_EQ(PartKeyWorker("j", 5, PartKey("j", 5, 12)), 12);
  for (const char* bad : {"/ptcfs/j/gen/5/part/", "/ptcfs/j/gen/5/part/x", "/ptcfs/j/gen/5/part/-1",
                          "/ptcfs/j/gen/5/part/1x", "/ptcfs/j/gen/6/part/1", "/ptcfs/j/gen/5/part/99999999999"}) {
    EXPECT_FALSE(PartKeyWorker("j", 5, bad)) << bad;
  }
  EXPECT_EQ(PartChunkKey("j", 5, 2, 7), "/ptcfs/j/gen/5/part/2/7");
  EXPECT_EQ(PartChunkOf("j", 5, PartChunkKey("j", 5, 2, 7)), std::make_pair(2, size_t{7}));
  EXPECT_FALSE(PartKeyWorker("j", 5, PartChunkKey("j", 5, 2, 7)));  // a chunk is no part
  for (const char* bad : {"/ptcfs/j/gen/5/part/2", "/ptcfs/j/gen/5/part/2/", "/ptcfs/j/gen/5/part//1",
                          "/ptcfs/j/gen/5/part/2/x", "/ptcfs/j/gen/5/part/2/1/1", "/ptcfs/j/gen/6/part/2/1"}) {
    EXPECT_FALSE(PartChunkOf("j", 5, bad)) << bad;
  }
}

// A part over the largest value is cut into chunks and joined back; chunks
// missing, altered or of another change are named.
TEST(PartValues, CutAndJoined) {
  const std::string text = EncodePart("c1", Part{}, {});
  const PartValues whole = CutPart("c1", text, text.size());
  EXPECT_EQ(whole.head, text);
  EXPECT_TRUE(whole.chunks.empty());
  const PartValues cut = CutPart("c1", text, 7);
  ASSERT_EQ(cut.chunks.size(), (text.size() + 6) / 7);
  std::map<size_t, std::string> chunks;
  for (size_t i = 0; i < cut.chunks.size(); ++i) {
    EXPECT_LE(cut.chunks[i].size(), 7u);
    chunks[i] = cut.chunks[i];
  }
  auto joined = DecodePart("k", cut.head, chunks);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined->first, "c1");
  auto missing = chunks;
  missing.erase(1);
  EXPECT_NE(DecodePart("k", cut.head, missing).status().message().find("k: chunk 1 of"), std::string::npos);
  auto altered = chunks;
  altered[0][0] ^= 1;
  EXPECT_NE(DecodePart("k", cut.head, altered).status().message().find("chunks are not the"), std::string::npos);
  // A head of change c1 over the chunks of c2's part.
  const PartValues other = CutPart("c1", EncodePart("c2", Part{}, {}), 7);
  std::map<size_t, std::string> other_chunks;
  for (size_t i = 0; i < other.chunks.size(); ++i) other_chunks[i] = other.chunks[i];
  EXPECT_NE(DecodePart("k", other.head, other_chunks).status().message().find("its chunks are of change c2"),
            std::string::npos);
}

}  // namespace
}  // namespace ptc::cluster
