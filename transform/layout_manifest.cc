#include "transform/layout_manifest.h"

#include <cstdio>
#include <unordered_map>

#include "ptc/base/checksum.h"
#include "ptc/store/model_spec.h"
#include "transform/plan.h"

namespace ptc::transform {

Result<GenerationManifest> LayoutManifest(const ModelLayout& layout) {
  GenerationManifest m;
  m.generation = 1;
  PTC_RETURN_IF_ERROR(DescribeModel(layout.spec(), layout.config(), &m));
  std::unordered_map<std::string_view, size_t> elem;  // bytes per element, by tensor
  for (const TensorRecord& t : m.tensors) elem.emplace(t.name, DTypeSize(t.dtype));
  PTC_ASSIGN_OR_RETURN(auto keys, TargetShardKeys(layout));
  std::unordered_map<int, uint64_t> pieces;  // per worker, for file names and offsets
  m.shards.reserve(keys.size());
  uint64_t made_up = 0x9e3779b97f4a7c15ull;
  for (auto& [key, worker] : keys) {
    auto it = elem.find(key.tensor);
    if (it == elem.end()) return InternalError("layout names no tensor '" + key.tensor + "'");
    uint64_t elems = 0;
    for (const Box& b : key.boxes) elems += b.volume();
    ShardRecord r;
    r.tensor = std::move(key.tensor);
    r.boxes = std::move(key.boxes);
    r.worker = worker;
    const uint64_t n = pieces[worker]++;
    char file[64];
    std::snprintf(file, sizeof file, "gen-000001/worker-%05d/shards-%06llu.h5", worker,
                  static_cast<unsigned long long>(n / 64));
    r.file = file;
    r.offset = 4096 + (n % 64) * 2048;  // made up: nothing is read
    r.nbytes = elems * it->second;
    const uint64_t blocks = (r.nbytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
    if (blocks > 1) {
      r.block_checksums.resize(blocks);
      for (uint64_t& c : r.block_checksums) c = made_up *= 0xff51afd7ed558ccdull;
    }
    r.checksum = made_up *= 0xc4ceb9fe1a85ec53ull;
    m.shards.push_back(std::move(r));
  }
  return m;
}

}  // namespace ptc::transform
