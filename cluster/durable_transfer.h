// A store's current generation to and from a durable tier's layout
// (durable.h) outside any job: `ptcfs export STORE s3://BUCKET/PREFIX`
// writes one whole copy (every worker's share, then durable.json last) and
// `ptcfs import s3://BUCKET/PREFIX STORE` commits such a copy as a new
// generation of a store, each piece's bytes checked against its record's
// checksum as they arrive (a missing, short or altered object is named and
// nothing is committed). The same for a directory tier.
//
// Thread safety: plain functions; the store's writer lock is the caller's.
#pragma once

#include <cstdint>
#include <string>

#include "cluster/durable_location.h"
#include "ptc/base/status.h"
#include "ptc/store/store.h"

namespace ptc::cluster {

// extra.durable of an exported copy: job "export", contents "STORE@generation N".
inline constexpr const char* kExportJob = "export";

struct TransferStats {
  uint64_t generation = 0;  // exported, or committed by the import
  uint64_t pieces = 0;
  uint64_t bytes = 0;
};

// \error as WriteDurableShare and CompleteDurable (the object or piece at fault named).
Result<TransferStats> ExportToTier(Env* env, const Store& store, const DurableLocation& tier);

// Commits the tier's copy as the next generation of `store` (every piece on
// worker 0): each share's object downloaded whole into the store and linked
// into the generation as gen-N/worker-00/tier-worker-WW.bin, its pieces
// described there and checked (LinkShare, durable_restore.h).
// \error NotFound when the tier holds no complete copy; Corruption naming the
//        tensor and object whose bytes differ from their record, or an object
//        of another size than its records; as DecodeManifest and the store's writer.
Result<TransferStats> ImportFromTier(const DurableLocation& tier, Store& store);

}  // namespace ptc::cluster
