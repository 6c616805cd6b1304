// A model spec with a parallel config that partitions it, checked once.
//
// ModelLayout::Make runs ValidateConfig; code that takes a ModelLayout does
// not check the pair again, and asks it for rank views instead of computing
// them. Views are kept once computed, one per distinct view body: without
// ZeRO every dp (and cp) replica of a (tp, pp) position has the same tensors
// (with experts: of a (tp, etp, ep, pp) position), so a layout of dp=1000
// computes tp*pp bodies, not 1000 times as many.
//
// A value: copies share the spec, the config and the kept views.
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <tuple>

#include "ptc/base/mutex.h"
#include "ptc/base/status.h"
#include "ptc/model/config.h"
#include "ptc/model/view.h"

namespace ptc {

class ModelLayout {
 public:
  // \error as ValidateConfig.
  static Result<ModelLayout> Make(ModelSpec spec, ParallelConfig config);

  const ModelSpec& spec() const { return shared_->spec; }
  const ParallelConfig& config() const { return shared_->config; }
  int world_size() const { return shared_->config.world_size(); }

  // The tensors of `rank`'s files.
  // \error InvalidArgument when rank is outside the world, or naming the rule
  //   whose shape formula fails.
  Result<RankView> View(int rank) const;
  // The tensors of `rank`'s files without a copy: the view body `rank` shares
  // with the ranks of its body key (below); its `rank` and `coords` are those
  // of whichever of them was computed first. For loops over every rank.
  // `keep`: the layout keeps a body it computes for the ranks sharing it (a
  // loop over the ranks of a ZeRO-1 config, whose every rank has a body of
  // its own, passes false: nothing to share, memory to spare).
  // \error as View.
  Result<std::shared_ptr<const RankView>> Body(int rank, bool keep = true) const;

 private:
  // (tp, pp, etp, ep, index in the dp x cp group and edp under ZeRO else 0):
  // ranks sharing a key share their tensors.
  using BodyKey = std::tuple<int, int, int, int, int, int>;
  struct Shared {
    ModelSpec spec;
    ParallelConfig config;
    Mutex mu;
    std::map<BodyKey, std::shared_ptr<const RankView>> bodies GUARDED_BY(mu);
  };
  explicit ModelLayout(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  std::shared_ptr<Shared> shared_;
};

}  // namespace ptc
