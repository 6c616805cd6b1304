// model/: every rank's tensors as safetensors files (model.safetensors, and
// optim.safetensors with optimizer state) and as .npy files (tensors/, with
// dtypes.json), rendered from the stored pieces on open.
#include <map>
#include <utility>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/format/npy.h"
#include "view/view_tree.h"

namespace ptcfs {
namespace {

// A rank's model.safetensors or optim.safetensors.
class SafetensorsRenderer final : public FileRenderer {
 public:
  SafetensorsRenderer(std::shared_ptr<const Snapshot> snap, size_t view, bool optim)
      : snap_(std::move(snap)), view_(view), optim_(optim) {}
  ptc::Result<std::unique_ptr<VirtualFile>> Render() const override {
    const ptc::RankView& view = snap_->views()[view_];
    return MakeSafetensorsFile(snap_->reader(), optim_ ? view.optim : view.model, snap_->Metadata(view.rank),
                               snap_->WorkerOf(view.rank));
  }

 private:
  std::shared_ptr<const Snapshot> snap_;
  size_t view_;
  bool optim_;
};

// One local tensor of a rank as a .npy file: the rank's model tensors, then its optimizer's.
class NpyRenderer final : public FileRenderer {
 public:
  NpyRenderer(std::shared_ptr<const Snapshot> snap, size_t view, size_t tensor)
      : snap_(std::move(snap)), view_(view), tensor_(tensor) {}
  ptc::Result<std::unique_ptr<VirtualFile>> Render() const override {
    const ptc::RankView& view = snap_->views()[view_];
    const ptc::LocalTensor& t =
        tensor_ < view.model.size() ? view.model[tensor_] : view.optim[tensor_ - view.model.size()];
    return MakeNpyFile(snap_->reader(), t, snap_->WorkerOf(view.rank));
  }

 private:
  std::shared_ptr<const Snapshot> snap_;
  size_t view_;
  size_t tensor_;
};

class ModelView final : public ViewTree {
 public:
  explicit ModelView(const ViewOptions& options) : safetensors_(options.safetensors), npy_(options.npy) {}
  std::string_view name() const override { return "model"; }

  ptc::Result<std::vector<TreeFile>> Build(const std::shared_ptr<const Snapshot>& snap) const override {
    std::vector<TreeFile> files;
    for (size_t v = 0; v < snap->views().size(); ++v) {
      const ptc::RankView& view = snap->views()[v];
      const std::string dir = ptc::RankDirName(view.rank) + "/";
      if (safetensors_) {
        const auto meta = snap->Metadata(view.rank);
        for (const bool optim : {false, true}) {
          const std::vector<ptc::LocalTensor>& tensors = optim ? view.optim : view.model;
          if (optim && tensors.empty()) continue;
          TreeFile f;
          f.path = dir + (optim ? "optim.safetensors" : "model.safetensors");
          PTC_ASSIGN_OR_RETURN(f.size, SafetensorsFileSize(tensors, meta), f.path);
          f.renderer = std::make_shared<SafetensorsRenderer>(snap, v, optim);
          f.kernel_readable = true;
          files.push_back(std::move(f));
        }
      }
      if (npy_) AddNpyFiles(snap, v, dir + "tensors/", &files);
    }
    return files;
  }

 private:
  static void AddNpyFiles(const std::shared_ptr<const Snapshot>& snap, size_t v, const std::string& dir,
                          std::vector<TreeFile>* files) {
    const ptc::RankView& view = snap->views()[v];
    std::map<std::string, ptc::DType> dtypes;
    size_t i = 0;
    for (const auto* list : {&view.model, &view.optim}) {
      for (const ptc::LocalTensor& t : *list) {
        TreeFile f;
        f.path = dir + t.name + ".npy";
        f.size = NpyFileSize(t);
        f.renderer = std::make_shared<NpyRenderer>(snap, v, i++);
        files->push_back(std::move(f));
        dtypes[t.name + ".npy"] = t.dtype;
      }
    }
    files->push_back(LiteralFile(dir + std::string(ptc::kNpyDTypesFile), *ptc::EncodeNpyDTypes(dtypes)));
  }

  bool safetensors_;
  bool npy_;
};

}  // namespace

std::unique_ptr<ViewTree> MakeModelView(const ViewOptions& options) { return std::make_unique<ModelView>(options); }

}  // namespace ptcfs
