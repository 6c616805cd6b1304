// dcp/: the served generation as a PyTorch Distributed Checkpoint
// (ptc/checkpoint/dcp/dcp.h, view/dcp_file.h): the chunk files rendered on
// read from the stored pieces, .metadata built with the tree. It depends on
// the generation only: a reconfigure serves the same files. The directory
// takes dcp.save's checkpoints (SaveKind::kDcp); the save that made the
// generation shows it again under its own name (dcp/step-9/), so that a job
// looking for its latest step directory (torchtitan's checkpointer) resumes
// from it.
#include <set>
#include <utility>

#include "ptc/checkpoint/dcp/entries.h"
#include "view/dcp_file.h"
#include "view/view_tree.h"

namespace ptcfs {
namespace {

// File `file` of a DCP checkpoint.
class DcpRenderer final : public FileRenderer {
 public:
  DcpRenderer(std::shared_ptr<const Snapshot> snap, std::shared_ptr<const ptc::dcp::Plan> plan, size_t file, int worker)
      : snap_(std::move(snap)), plan_(std::move(plan)), file_(file), worker_(worker) {}
  ptc::Result<std::unique_ptr<VirtualFile>> Render() const override {
    return MakeDcpFile(snap_->reader(), *plan_, file_, worker_);
  }

 private:
  std::shared_ptr<const Snapshot> snap_;
  std::shared_ptr<const ptc::dcp::Plan> plan_;
  size_t file_;
  int worker_;
};

// The name of the save that made the generation, when it is one a directory
// of dcp/ can have and no file of dcp/ has.
std::string SaveName(const nlohmann::json& extra, const ptc::dcp::Plan& plan) {
  if (!extra.is_object() || !extra.contains(ptc::dcp::kSaveNameKey) || !extra[ptc::dcp::kSaveNameKey].is_string()) {
    return "";
  }
  const std::string name = extra[ptc::dcp::kSaveNameKey].get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) return "";
  if (name == ptc::dcp::kMetadataFile) return "";
  for (const ptc::dcp::File& f : plan.files) {
    if (f.name == name) return "";
  }
  return name;
}

class DcpView final : public ViewTree {
 public:
  explicit DcpView(const ViewOptions& options) : keys_(options.dcp_keys), worker_(options.worker) {}
  std::string_view name() const override { return "dcp"; }
  SaveKind saves() const override { return SaveKind::kDcp; }

  ptc::Result<std::vector<TreeFile>> Build(const std::shared_ptr<const Snapshot>& snap) const override {
    PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(snap->reader().manifest(), keys_));
    std::vector<TreeFile> files;
    const std::string save_name = SaveName(snap->reader().manifest().extra, plan);
    std::vector<std::string> dirs;
    if (!save_name.empty()) dirs.push_back(save_name + "/");
    dirs.push_back("");
    AddDcpFiles(dirs, snap, std::move(plan), worker_, &files);
    return files;
  }

 private:
  ptc::dcp::Keys keys_;
  int worker_;
};

}  // namespace

void AddDcpFiles(const std::vector<std::string>& dirs, const std::shared_ptr<const Snapshot>& snap, ptc::dcp::Plan plan,
                 int worker, std::vector<TreeFile>* files) {
  auto shared = std::make_shared<const ptc::dcp::Plan>(std::move(plan));
  const std::string metadata = ptc::dcp::EncodeMetadata(*shared);
  for (const std::string& dir : dirs) {
    files->push_back(LiteralFile(dir + ptc::dcp::kMetadataFile, metadata));
    for (size_t i = 0; i < shared->files.size(); ++i) {
      TreeFile f;
      f.path = dir + shared->files[i].name;
      f.size = shared->files[i].size;
      f.renderer = std::make_shared<DcpRenderer>(snap, shared, i, worker);
      f.kernel_readable = true;
      files->push_back(std::move(f));
    }
  }
}

std::unique_ptr<ViewTree> MakeDcpView(const ViewOptions& options) { return std::make_unique<DcpView>(options); }

}  // namespace ptcfs
