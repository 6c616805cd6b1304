// Filesystem: the hf/ tree, the served generation's model as Hugging Face's
// save_pretrained writes it (ptc/checkpoint/hf.h, fs/hf_file.h): config.json
// and the index built with the tree, the shards rendered on read from the
// stored pieces. Like dcp/, it depends on the generation only: a reconfigure
// serves the same files.
#include "fs/filesystem.h"
#include "fs/hf_file.h"
#include "fs/node.h"

namespace ptcfs {

ptc::Result<std::shared_ptr<Node>> Filesystem::BuildHfTree(const std::shared_ptr<const Snapshot>& snap) {
  PTC_ASSIGN_OR_RETURN(ptc::hf::Plan plan, PlanHf(snap->reader().manifest(), options_.hf_shard_bytes));
  auto shared = std::make_shared<const ptc::hf::Plan>(std::move(plan));
  auto dir = NewDir(snap);
  dir->children[ptc::hf::kConfigFile] = AddNode(LiteralNode(snap, shared->config_json));
  if (!shared->index_json.empty()) dir->children[ptc::hf::kIndexFile] = AddNode(LiteralNode(snap, shared->index_json));
  for (size_t i = 0; i < shared->shards.size(); ++i) {
    PTC_ASSIGN_OR_RETURN(uint64_t size, HfShardFileSize(*shared, i));
    auto file = std::make_shared<Node>();
    file->kind = Node::kHfFile;
    file->snap = snap;
    file->view = i;
    file->size = size;
    file->hf = shared;
    dir->children[shared->shards[i].file] = AddNode(file);
  }
  return dir;
}

}  // namespace ptcfs
