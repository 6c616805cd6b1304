// Filesystem: the dcp/ tree, PyTorch Distributed Checkpoint of the generation
// served (ptc/checkpoint/dcp.h, fs/dcp_file.h): the chunks rendered on read
// from the stored pieces, .metadata built with the tree. New directories are
// dcp.save's checkpoints, staged (kDcpStaging) until their .metadata lands
// (Filesystem::Rename, Controller::IngestDcp).
#include "fs/filesystem.h"
#include "fs/node.h"

namespace ptcfs {

ptc::Result<std::shared_ptr<Node>> Filesystem::BuildDcpTree(const std::shared_ptr<const Snapshot>& snap) {
  PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(snap->reader().manifest()));
  auto shared = std::make_shared<const ptc::dcp::Plan>(std::move(plan));
  auto dir = NewDir(snap);
  dir->kind = Node::kDcpDir;
  StagedOf(*dir) = std::string(kDcpStaging);
  auto metadata = std::make_shared<Node>();
  metadata->kind = Node::kLiteralFile;
  metadata->snap = snap;
  metadata->literal = ptc::dcp::EncodeMetadata(*shared);
  metadata->size = metadata->literal.size();
  dir->children[ptc::dcp::kMetadataFile] = AddNode(metadata);
  for (size_t i = 0; i < shared->files.size(); ++i) {
    auto file = std::make_shared<Node>();
    file->kind = Node::kDcpFile;
    file->snap = snap;
    file->view = i;
    file->size = shared->files[i].size;
    file->dcp = shared;
    dir->children[shared->files[i].name] = AddNode(file);
  }
  AddStaged(*dir, snap);  // saves under way
  return dir;
}

}  // namespace ptcfs
