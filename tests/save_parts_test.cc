// Settling a DCP save taken on many workers (fs/save_parts.h): every chunk
// file of the metadata on exactly one worker, the torch_dist state from the
// one part that carries it; anything else refused, naming the file or part.
#include "fs/save_parts.h"

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
  EXPECT_FALSE(settled->has_value());

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
  ASSERT_TRUE(settled->has_value());
  EXPECT_EQ(**settled, extra);
  // No part carries it; two do.
  EXPECT_EQ(SettleDcpSave(kFiles, true, Parts(files)).status().code(), Code::kCorruption);
  auto parts = Parts(files, &extra);
  parts[1].extra = DcpSavePartExtra({"__1_0.distcp"}, &extra);
  EXPECT_EQ(SettleDcpSave(kFiles, true, parts).status().code(), Code::kCorruption);
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
