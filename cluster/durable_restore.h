// A job whose every worker comes back on an empty disk resumes from its
// durable tier alone (docs/cluster.md, "Durable tier", "Every worker lost").
// The tier's copy (durable.json) is a generation in the layout of its day,
// each piece in the share of the worker that held it. Each worker, before it
// mounts, downloads its own share's object into its store (ranged GETs in
// parallel, straight to the file) and commits the *restored generation*: the
// copy's config, tensors and dataset position, every piece on the worker
// whose share holds it, in that worker's gen-R/worker-WW/restored.bin at the
// copy's offset (an HDF5 file of external storage describing each,
// ShardRecord::h5). That manifest is a pure function of the copy and R
// (RestoredManifest), so every worker computes the same one, with the same
// digest, and the job agrees it (Coordinator::Join) without any exchange;
// a worker's own records are checked against it byte for byte (checksums of
// what arrived), so a share altered in the bucket is refused by name.
//
// Thread safety: plain functions; the store is the caller's, before it is shared.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cluster/durable.h"
#include "cluster/durable_location.h"
#include "ptc/base/status.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store.h"

namespace ptc::cluster {

// The adopted file holding a worker's pieces of a restored generation.
inline constexpr std::string_view kRestoredFile = "restored.bin";
// The tier's record of the job's latest generation whose contents it holds
// a copy of: {"job": J, "generation": N, "config": C, "contents": K}, written
// by a worker once it knows the copy serves that generation (a change of
// layout after the copy makes a newer one), so that a job restored from the
// bucket alone goes back to its last layout.
inline constexpr std::string_view kJobRecord = "job.json";

struct JobRecord {
  std::string job;
  uint64_t generation = 0;
  std::string config;
  std::string contents;
};
std::string EncodeJobRecord(const JobRecord& r);

// The tier's copy of job `job`'s tensors, whatever its contents: durable.json
// decoded, with its identity.
struct DurableCopy {
  GenerationManifest manifest;  // files relative to the tier; extra without "durable"
  DurableIdentity id;
  // kJobRecord when the tier holds one of this job and these contents: the
  // job's latest generation the copy serves.
  std::optional<JobRecord> latest;
};

// \error NotFound when the tier holds no complete copy; Corruption as
//        DecodeManifest or when extra.durable or job.json is malformed;
//        FailedPrecondition when it is another job's copy (both named).
Result<DurableCopy> ReadDurableCopy(const DurableLocation& tier, const std::string& job);

// Generation `generation` restored from `copy` (pure): its config, tensors,
// schema, dims and extra; each piece on its share's worker, `file`
// gen-R/worker-WW/restored.bin at the copy's offset, `h5`
// gen-R/worker-WW/<stem>.sK.h5 (K counting each stem per worker in offset
// order, as GenerationWriter names them).
// \error Corruption naming durable.json when a worker's pieces are not in one
//        object, or overlap.
Result<GenerationManifest> RestoredManifest(const GenerationManifest& copy, uint64_t generation);

// Each worker's share of `copy` (its pieces, in offset order in the share's object).
std::map<int, std::vector<const ShardRecord*>> SharesOf(const GenerationManifest& copy);

// One share of the tier's `copy` linked into the generation `writer` builds:
// its object downloaded whole into the store (ranged GETs of 64 MiB, 4 at
// once, each streamed into the file where it belongs as it arrives: from a
// bucket, no buffer beyond the transport's 1 MiB reads), linked as
// gen-N/worker-WW/`name` of `worker`, each of `pieces` (the share, in offset
// order) then described there (GenerationWriter::NewShardIn) and its bytes
// checked against the copy's checksums. The records, for AddShard.
// \error Corruption naming the object and the tensor whose bytes differ from
//        the copy's records (altered), or an object of another size than its
//        pieces end at; as the tier's Env and the writer.
Result<std::vector<ShardRecord>> LinkShare(const DurableLocation& tier, const GenerationManifest& copy,
                                           const std::vector<const ShardRecord*>& pieces, Store& store,
                                           GenerationWriter& writer, int worker, const std::string& name);

// Writes `worker`'s pieces of `restored` (RestoredManifest of `copy`) into
// `store` (no generation yet, opened with the worker's PeerEnv, so that the
// other workers' files count as present) and commits it as generation
// restored.generation: the share's object downloaded whole into the store,
// then every piece checked against its record.
// \error Corruption naming the object and tensor whose bytes differ from the
//        copy's records, or an object of another size than its records
//        imply; FailedPrecondition when the store holds a generation; as the
//        tier's Env and the store's writer.
Status RestoreShare(const DurableLocation& tier, const GenerationManifest& copy, const GenerationManifest& restored,
                    int worker, Store& store);

}  // namespace ptc::cluster
