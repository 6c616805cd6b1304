// hf/: the served generation's model as Hugging Face's save_pretrained
// writes it (ptc/checkpoint/hf/hf.h, view/hf_file.h): config.json and the
// index built with the tree, the shards rendered on read from the stored
// pieces. Like dcp/, it depends on the generation only.
#include <utility>

#include "view/hf_file.h"
#include "view/view_tree.h"

namespace ptcfs {
namespace {

// Shard `shard` of a Hugging Face model.
class HfRenderer final : public FileRenderer {
 public:
  HfRenderer(std::shared_ptr<const Snapshot> snap, std::shared_ptr<const ptc::hf::Plan> plan, size_t shard, int worker)
      : snap_(std::move(snap)), plan_(std::move(plan)), shard_(shard), worker_(worker) {}
  ptc::Result<std::unique_ptr<VirtualFile>> Render() const override {
    return MakeHfShardFile(snap_->reader(), *plan_, shard_, worker_);
  }

 private:
  std::shared_ptr<const Snapshot> snap_;
  std::shared_ptr<const ptc::hf::Plan> plan_;
  size_t shard_;
  int worker_;
};

class HfView final : public ViewTree {
 public:
  explicit HfView(const ViewOptions& options) : shard_bytes_(options.hf_shard_bytes), worker_(options.worker) {}
  std::string_view name() const override { return "hf"; }

  ptc::Result<std::vector<TreeFile>> Build(const std::shared_ptr<const Snapshot>& snap) const override {
    PTC_ASSIGN_OR_RETURN(ptc::hf::Plan plan, PlanHf(snap->reader().manifest(), shard_bytes_));
    auto shared = std::make_shared<const ptc::hf::Plan>(std::move(plan));
    std::vector<TreeFile> files;
    files.push_back(LiteralFile(ptc::hf::kConfigFile, shared->config_json));
    if (!shared->index_json.empty()) files.push_back(LiteralFile(ptc::hf::kIndexFile, shared->index_json));
    for (size_t i = 0; i < shared->shards.size(); ++i) {
      TreeFile f;
      f.path = shared->shards[i].file;
      PTC_ASSIGN_OR_RETURN(f.size, HfShardFileSize(*shared, i));
      f.renderer = std::make_shared<HfRenderer>(snap, shared, i, worker_);
      files.push_back(std::move(f));
    }
    return files;
  }

 private:
  uint64_t shard_bytes_;
  int worker_;
};

}  // namespace

std::unique_ptr<ViewTree> MakeHfView(const ViewOptions& options) { return std::make_unique<HfView>(options); }

}  // namespace ptcfs
