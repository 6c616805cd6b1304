// Settling a DCP save taken on many workers (view/save_parts.h): every chunk
// file of the metadata on exactly one worker, the torch_dist state from the
// one part that carries it; anything else refused, naming the file or part.
#include "view/save_parts.h"

#include <gtest/gtest.h>

namespace ptcfs {
namespace {

using ptc::Code;

const std::set<std::string> kFiles = {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"};

std::map<int, ptc::Part> Parts(const std::map<int, std::vector<std::string>>& files,
                               const nlohmann::json* extra_of_worker_0 = nullptr) {
  std::map<int, ptc::Part> parts;
  for (const auto& [worker, names] : files) {
    parts[worker].extra = DcpSavePartExtra(names, worker == 0 ? extra_of_worker_0 : nullptr);
  }
  return parts;
}

TEST(SettleDcpSave, EveryFileOnExactlyOneWorker) {
  // Worker 2 ran no rank: an empty part.
  auto settled =
      SettleDcpSave(kFiles, false, Parts({{0, {"__0_0.distcp", "__2_0.distcp"}}, {1, {"__1_0.distcp"}}, {2, {}}}));
  ASSERT_TRUE(settled.ok()) << settled.status().ToString();
  EXPECT_FALSE(settled->manifest_extra.has_value());
  EXPECT_TRUE(settled->entries.empty());

  auto missing = SettleDcpSave(kFiles, false, Parts({{0, {"__0_0.distcp"}}, {1, {"__1_0.distcp"}}}));
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("chunk file __2_0.distcp of the save's .metadata was written on no worker"),
            std::string::npos)
      << missing.status().ToString();

  auto twice = SettleDcpSave(kFiles, false,
                             Parts({{0, {"__0_0.distcp", "__1_0.distcp"}}, {1, {"__1_0.distcp", "__2_0.distcp"}}}));
  EXPECT_EQ(twice.status().code(), Code::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("chunk file __1_0.distcp was written on worker 0 and on worker 1"),
            std::string::npos)
      << twice.status().ToString();
}

TEST(SettleDcpSave, TorchDistStateFromTheOnePartThatCarriesIt) {
  const nlohmann::json extra = {{"megatron", {{"iteration", 500}}}};
  const std::map<int, std::vector<std::string>> files = {{0, {"__0_0.distcp", "__2_0.distcp"}}, {1, {"__1_0.distcp"}}};
  auto settled = SettleDcpSave(kFiles, true, Parts(files, &extra));
  ASSERT_TRUE(settled.ok()) << settled.status().ToString();
  ASSERT_TRUE(settled->manifest_extra.has_value());
  EXPECT_EQ(*settled->manifest_extra, extra);
  // No part carries it; two do.
  EXPECT_EQ(SettleDcpSave(kFiles, true, Parts(files)).status().code(), Code::kCorruption);
  auto parts = Parts(files, &extra);
  parts[1].extra = DcpSavePartExtra({"__1_0.distcp"}, &extra);
  EXPECT_EQ(SettleDcpSave(kFiles, true, parts).status().code(), Code::kCorruption);
}

// The steps and groups each worker found in its files reach every worker:
// the same bytes, each distinct one carried once; a part whose entries are
// not DcpSavePartExtra's is refused naming it.
TEST(SettleDcpSave, OptimizerEntriesOfEveryPart) {
  using ptc::dcp::EntryBytes;
  const std::vector<EntryBytes> first = {{"__0_0.distcp", 5000, 100, std::string("step\0\x01", 6)},
                                         {"__0_0.distcp", 5000, 900, std::string("step\0\x01", 6)},
                                         {"__2_0.distcp", 7000, 10, "groups"}};
  const std::vector<EntryBytes> second = {{"__1_0.distcp", 6000, 0, std::string(300, '\xff')}};
  std::map<int, ptc::Part> parts;
  parts[0].extra = DcpSavePartExtra({"__0_0.distcp", "__2_0.distcp"}, nullptr, first);
  parts[1].extra = DcpSavePartExtra({"__1_0.distcp"}, nullptr, second);
  EXPECT_EQ(parts[0].extra["dcp"]["optimizer_entries"]["blobs"].size(), 2u);  // the two alike once
  auto settled = SettleDcpSave(kFiles, false, parts);
  ASSERT_TRUE(settled.ok()) << settled.status().ToString();
  std::vector<EntryBytes> all = first;
  all.insert(all.end(), second.begin(), second.end());
  EXPECT_EQ(settled->entries, all);
  for (const char* bad : {R"({"blobs": ["0g"], "at": []})", R"({"blobs": ["00"], "at": [["f", 1, 0, 1]]})",
                          R"({"blobs": [], "at": [["f", -1, 0, 0]]})", R"([])"}) {
    auto broken = parts;
    broken[1].extra["dcp"]["optimizer_entries"] = nlohmann::json::parse(bad);
    auto refused = SettleDcpSave(kFiles, false, broken);
    EXPECT_EQ(refused.status().code(), Code::kCorruption) << bad;
    EXPECT_NE(refused.status().message().find("worker 1's part"), std::string::npos) << refused.status().ToString();
  }
}

TEST(SettleDcpSave, APartThatIsNoneIsNamed) {
  auto parts = Parts({{0, {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}}});
  parts[3].extra = {{"save", {}}};  // a legacy save's part
  auto settled = SettleDcpSave(kFiles, false, parts);
  EXPECT_EQ(settled.status().code(), Code::kCorruption);
  EXPECT_NE(settled.status().message().find("worker 3's part of the DCP save"), std::string::npos);
  parts.erase(3);
  parts[0].extra["dcp"]["files"].push_back("elsewhere.distcp");
  EXPECT_EQ(SettleDcpSave(kFiles, false, parts).status().code(), Code::kCorruption);
}

}  // namespace
}  // namespace ptcfs
