// The typed change request (cluster/change_request.h): every kind round-trips
// through its text, the texts workers have written since the protocol began
// decode to the same kind, and a malformed request is an error naming the
// field at fault. No etcd needed.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cluster/change_request.h"
#include "test_util.h"

namespace ptc::cluster {
namespace {

TEST(ChangeRequest, EveryKindRoundTrips) {
  const std::vector<ChangeRequest> requests = {
      RelayoutRequest{"tp=4,pp=1"},
      RelayoutRequest{R"({"config": "tp=2,pp=2", "step": 1200, "epoch": 0})"},
      SaveRequest{0},
      SaveRequest{1200},
      SaveRequest{UINT64_MAX},
      DcpSaveRequest{0, 0, 0, ".dcp/step-1"},
      DcpSaveRequest{7, kMaxDcpMetadataBytes, UINT64_MAX, "iter_0000100"},
      DcpSaveRequest{2, 171'529'483, 0x0123456789abcdef, ".dcp/a name with spaces "},
      CompactionRequest{false},
      CompactionRequest{true},
  };
  for (const ChangeRequest& r : requests) {
    const std::string text = EncodeRequest(r);
    ASSERT_TRUE(ValidateRequest(r).ok()) << text;
    auto back = DecodeRequest("test", text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status().ToString();
    EXPECT_EQ(*back, r) << text;
  }
}

TEST(ChangeRequest, RandomRequestsRoundTrip) {
  std::mt19937_64 rng(testing::TestSeed());
  auto text = [&rng] {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = " ast=,{}\"1-p"[rng() % 12];
    return s;
  };
  int valid = 0;
  for (int i = 0; i < 2000; ++i) {
    ChangeRequest r;
    switch (rng() % 4) {
      case 0:
        r = RelayoutRequest{text()};
        break;
      case 1:
        r = SaveRequest{rng()};
        break;
      case 2:
        r = DcpSaveRequest{static_cast<int>(rng() % 100) - 10, rng() % (kMaxDcpMetadataBytes + 100), rng(), text()};
        break;
      default:
        r = CompactionRequest{rng() % 2 == 0};
        break;
    }
    if (!ValidateRequest(r).ok()) continue;
    ++valid;
    auto back = DecodeRequest("test", EncodeRequest(r));
    ASSERT_TRUE(back.ok()) << EncodeRequest(r) << ": " << back.status().ToString();
    EXPECT_EQ(*back, r) << EncodeRequest(r);
  }
  EXPECT_GT(valid, 1000);
}

// The texts of the protocol as it was (a request string parsed by prefix).
TEST(ChangeRequest, TheWireTextIsAsBefore) {
  EXPECT_EQ(EncodeRequest(SaveRequest{42}), "save 42");
  EXPECT_EQ(EncodeRequest(DcpSaveRequest{1, 2048, 0xabc, ".dcp/s"}), "dcp-save 1 2048 0000000000000abc .dcp/s");
  EXPECT_EQ(EncodeRequest(CompactionRequest{false}), "compact");
  EXPECT_EQ(EncodeRequest(CompactionRequest{true}), "compact rank-files");
  EXPECT_EQ(EncodeRequest(RelayoutRequest{"tp=2"}), "tp=2");
  // A config text is a change of layout whatever it holds (the mount validated it).
  EXPECT_EQ(*DecodeRequest("test", "saved=1"), ChangeRequest(RelayoutRequest{"saved=1"}));
  EXPECT_EQ(*DecodeRequest("test", "compaction"), ChangeRequest(RelayoutRequest{"compaction"}));
  EXPECT_EQ(*DecodeRequest("test", "save 007"), ChangeRequest(SaveRequest{7}));
}

TEST(ChangeRequest, MalformedRequestsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"save", "\"iteration\""},
      {"save ", "\"iteration\""},
      {"save x", "\"iteration\""},
      {"save -1", "\"iteration\""},
      {"save 1 2", "\"iteration\""},
      {"save 99999999999999999999", "\"iteration\""},
      {"dcp-save", "\"worker\""},
      {"dcp-save x 1 s", "\"worker\""},
      {"dcp-save -1 1 0123456789abcdef s", "\"worker\""},
      {"dcp-save 1", "\"bytes\""},
      {"dcp-save 1 x 0123456789abcdef s", "\"bytes\""},
      {"dcp-save 1 1073741825 0123456789abcdef s", "\"bytes\""},
      {"dcp-save 1 2 s", "\"checksum\""},
      {"dcp-save 1 2 123 s", "\"checksum\""},
      {"dcp-save 1 2 0123456789abcdeg s", "\"checksum\""},
      {"dcp-save 1 2 0x23456789abcdef s", "\"checksum\""},
      {"dcp-save 1 2 0123456789abcdef", "\"save\""},
      {"dcp-save 1 2 0123456789abcdef ", "\"save\""},
      {"compact all", "\"into\""},
      {"compact ", "\"into\""},
      {"", "\"config\""},
  };
  for (const auto& [text, field] : rows) {
    auto r = DecodeRequest("etcd key /ptcfs/j/change", text);
    ASSERT_FALSE(r.ok()) << "'" << text << "' decoded";
    EXPECT_EQ(r.status().code(), Code::kCorruption) << text;
    EXPECT_NE(r.status().message().find("etcd key /ptcfs/j/change: "), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(field), std::string::npos) << text << ": " << r.status().message();
  }
}

TEST(ChangeRequest, InvalidValuesAreRefusedBeforeTheyAreEncoded) {
  EXPECT_EQ(ValidateRequest(RelayoutRequest{""}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(RelayoutRequest{"save 3"}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(RelayoutRequest{"compact"}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(DcpSaveRequest{-1, 1, 0, "s"}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(DcpSaveRequest{1, kMaxDcpMetadataBytes + 1, 0, "s"}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(DcpSaveRequest{1, 1, 0, ""}).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ptc::cluster
