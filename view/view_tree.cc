#include "view/view_tree.h"

#include <utility>

namespace ptcfs {

std::vector<std::unique_ptr<ViewTree>> MakeViewTrees(const ViewOptions& options) {
  std::vector<std::unique_ptr<ViewTree>> trees;
  trees.push_back(MakeModelView(options));
  if (options.megatron) trees.push_back(MakeMegatronView(options));
  if (options.dcp) trees.push_back(MakeDcpView(options));
  if (options.hf) trees.push_back(MakeHfView(options));
  return trees;
}

TreeFile LiteralFile(std::string path, std::string text) {
  TreeFile f;
  f.path = std::move(path);
  f.size = text.size();
  f.literal = std::move(text);
  return f;
}

}  // namespace ptcfs
