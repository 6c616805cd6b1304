#include "fs/writes/local_change.h"

namespace ptcfs {

ptc::Result<std::map<int, ptc::Part>> LocalChange::BeforeSaveCommit(ptc::GenerationWriter& writer,
                                                                    const std::vector<ptc::TensorRecord>&,
                                                                    const nlohmann::json& extra,
                                                                    const SettleFn& settle) {
  std::map<int, ptc::Part> parts;
  parts[worker_] = ptc::Part{writer.Shards(), extra};
  PTC_RETURN_IF_ERROR(settle(parts).status());
  return parts;
}

ptc::Result<std::vector<ptc::ShardRecord>> LocalChange::LastResort() {
  return ptc::NotFoundError("a mount alone has no durable tier");
}

}  // namespace ptcfs
