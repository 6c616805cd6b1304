// Filesystem: the dcp/ tree, PyTorch Distributed Checkpoint of the generation
// served (ptc/checkpoint/dcp.h, fs/dcp_file.h): the chunks rendered on read
// from the stored pieces, .metadata built with the tree. New directories are
// dcp.save's checkpoints, staged (kDcpStaging) until their .metadata lands
// (Filesystem::Rename, Controller::IngestDcp).
#include "fs/filesystem.h"
#include "fs/node.h"
#include "ptc/checkpoint/dcp_entries.h"
#include "ptc/checkpoint/megatron_optimizer.h"

namespace ptcfs {

std::shared_ptr<Node> Filesystem::LiteralNode(const std::shared_ptr<const Snapshot>& snap, std::string text) {
  auto n = std::make_shared<Node>();
  n->kind = Node::kLiteralFile;
  n->snap = snap;
  n->literal = std::move(text);
  n->size = n->literal.size();
  return n;
}

void Filesystem::AddDcpFiles(Node& dir, const std::shared_ptr<const Snapshot>& snap, ptc::dcp::Plan plan) {
  auto shared = std::make_shared<const ptc::dcp::Plan>(std::move(plan));
  dir.children[ptc::dcp::kMetadataFile] = AddNode(LiteralNode(snap, ptc::dcp::EncodeMetadata(*shared)));
  for (size_t i = 0; i < shared->files.size(); ++i) {
    auto file = std::make_shared<Node>();
    file->kind = Node::kDcpFile;
    file->snap = snap;
    file->view = i;
    file->size = shared->files[i].size;
    file->dcp = shared;
    dir.children[shared->files[i].name] = AddNode(file);
  }
}

ptc::Result<std::shared_ptr<Node>> Filesystem::BuildDcpTree(const std::shared_ptr<const Snapshot>& snap) {
  PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(snap->reader().manifest(), options_.dcp_keys));
  auto dir = NewDir(snap);
  dir->kind = Node::kDcpDir;
  StagedOf(*dir) = std::string(kDcpStaging);
  // The save that made this generation shows it again under its own name
  // (dcp/step-9/), so that a job looking for its latest step directory
  // (torchtitan's checkpointer) resumes from it.
  const nlohmann::json& extra = snap->reader().manifest().extra;
  std::string save_name;
  if (extra.is_object() && extra.contains(ptc::dcp::kSaveNameKey) && extra[ptc::dcp::kSaveNameKey].is_string()) {
    save_name = extra[ptc::dcp::kSaveNameKey].get<std::string>();
  }
  if (!Staging::Join("", save_name).ok()) save_name.clear();  // "" among them
  if (!save_name.empty()) {  // (a file of dcp/ of the same name, added next, takes its place)
    auto saved = NewDir(snap);
    AddDcpFiles(*saved, snap, plan);
    dir->children[save_name] = AddNode(saved);
  }
  AddDcpFiles(*dir, snap, std::move(plan));
  AddStaged(*dir, snap);  // saves under way
  return dir;
}

ptc::Result<std::shared_ptr<Node>> Filesystem::BuildTorchDistDir(const std::shared_ptr<const Snapshot>& snap,
                                                                 const ptc::megatron::MegatronState& state) {
  PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan,
                       ptc::dcp::PlanCheckpoint(snap->reader().manifest(), ptc::dcp::Keys::kMegatronCore));
  const ptc::pickle::Value* args = state.carried.is_dict() ? state.carried.Find("args") : nullptr;
  // The optimizer's groups and step, when the store has optimizer state (its
  // fp32 masters make it Float16OptimizerWithFloat16Params' layout).
  std::vector<ptc::megatron::CarriedTensor> storages;
  std::optional<ptc::pickle::Value> optimizer_common;
  if (snap->spec().optimizer) {
    PTC_ASSIGN_OR_RETURN(optimizer_common, ptc::megatron::McoreOptimizerCommon(state, /*masters=*/true, &storages));
  }
  PTC_ASSIGN_OR_RETURN(
      std::string common,
      ptc::dcp::McoreCommon(state.iteration, args, optimizer_common ? &*optimizer_common : nullptr, storages));
  auto dir = NewDir(snap);
  dir->children[ptc::dcp::kMcoreMetadataFile] = AddNode(LiteralNode(snap, ptc::dcp::McoreMetadataJson()));
  dir->children[ptc::dcp::kMcoreCommonFile] = AddNode(LiteralNode(snap, std::move(common)));
  AddDcpFiles(*dir, snap, std::move(plan));
  return dir;
}

}  // namespace ptcfs
