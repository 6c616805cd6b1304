// The change of a mount alone (no cluster job): its part is the whole change,
// so it settles at once. Each write (fs/writes/) runs the same path over a
// LocalChange as over the change a job agreed (fs/participant.h).
//
// Thread safety: as AgreedChange (each method from the write's thread).
#pragma once

#include <map>
#include <set>
#include <vector>

#include "fs/participant.h"

namespace ptcfs {

class LocalChange final : public AgreedChange {
 public:
  explicit LocalChange(int worker) : worker_(worker), participants_{worker} {}

  bool alone() const override { return true; }
  // This worker alone.
  const std::set<int>& participants() const override { return participants_; }
  // Nothing to add: no other worker holds a part.
  ptc::Status BeforeCommit(ptc::GenerationWriter&, const std::string&) override { return ptc::Status::OK(); }
  // This worker's part alone (the shards in `writer`), settled by `settle`.
  // \error as `settle`.
  ptc::Result<std::map<int, ptc::Part>> BeforeSaveCommit(ptc::GenerationWriter& writer,
                                                         const std::vector<ptc::TensorRecord>& tensors,
                                                         const nlohmann::json& extra, const SettleFn& settle) override;
  // No one to tell: the write keeps the error itself.
  void Failed(const ptc::Status&) override {}
  bool has_last_resort() const override { return false; }
  // \error NotFound: a mount alone has no durable tier.
  ptc::Result<std::vector<ptc::ShardRecord>> LastResort() override;

 private:
  const int worker_;
  const std::set<int> participants_;
};

}  // namespace ptcfs
