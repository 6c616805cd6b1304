// libFuzzer entry point for what a cluster worker settles a save from: the
// other workers' parts (their `extra`, JSON read from etcd): a Megatron
// save's (SettleSave) and a DCP save's (SettleDcpSave, its optimizer entries
// as hex). None may crash; a DCP part that settles must settle again from
// what DcpSavePartExtra writes of it.
// Run: ./save_parts_fuzz -max_total_time=60 -max_len=4096 tests/fuzz/corpus/save_parts_fuzz
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/model/config.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"
#include "view/save_parts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json extra = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (extra.is_discarded()) return 0;
  std::map<int, ptc::Part> parts;
  parts[0].extra = extra;
  static const std::set<std::string> kFiles = {"__0_0.distcp", "__1_0.distcp"};
  for (const bool torch_dist : {false, true}) {
    auto settled = ptcfs::SettleDcpSave(kFiles, torch_dist, parts);
    if (!settled.ok() || torch_dist) continue;
    std::vector<std::string> files;
    for (const auto& f : extra["dcp"]["files"]) files.push_back(f.get<std::string>());
    std::map<int, ptc::Part> again;
    again[0].extra = ptcfs::DcpSavePartExtra(files, nullptr, settled->entries);
    auto twice = ptcfs::SettleDcpSave(kFiles, false, again);
    if (!twice.ok() || !(twice->entries == settled->entries)) __builtin_trap();
  }
  static const ptc::ModelSpec kSpec = [] {
    ptc::ModelSpec spec;
    spec.schema = *ptc::LoadSchema("megatron-gpt");
    spec.dims = *ptc::ParseDims("layers=2,hidden=8,heads=2,vocab=16,seq=4");
    return spec;
  }();
  static const ptc::ParallelConfig kConfig = *ptc::ParseConfig("tp=1,pp=2,dp=1,per_worker=1");
  (void)ptcfs::SettleSave(7, kSpec, kConfig, std::nullopt, parts);
  return 0;
}
