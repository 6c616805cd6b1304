// The durable tier of a cluster job (docs/cluster.md, "Durable tier"): a
// directory outside the workers (a shared file system every worker mounts
// at the same path) holding one whole copy of the job's tensors, the last
// source of a piece that no live worker holds.
//
//   DIR/durable.json                 the copy: a generation manifest, files relative to DIR
//   DIR/gen-NNNNNN/worker-WW.bin     worker WW's share of generation N, its pieces back to back
//   DIR/gen-NNNNNN/worker-WW.json    the share's records (a manifest), written after its bytes
//
// A copy is of the job's *contents* (Committed::contents): a change of layout
// moves bytes but never changes them, so a copy written once, in the layout
// of its day, is a source for every later generation of the same contents.
// Each worker writes its share (DurableShare: its pieces that no lower worker
// holds too), checked against their checksums as they are read; the worker
// that finds every share present writes durable.json (atomically) and removes
// older shares. durable.json's extra.durable = {"job": J, "contents": C}.
//
// Thread safety: plain values and functions; concurrent writers of one
// directory are other workers, each writing its own files.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store.h"

namespace ptc::cluster {

inline constexpr std::string_view kDurableManifest = "durable.json";
// How a worker's store names the tier's files: ROOT/.durable/REL is DIR/REL
// (PeerEnvOptions::durable_dir).
inline constexpr std::string_view kDurablePrefix = ".durable/";
// The worker a copy's pieces are on, as sources of a plan: no worker's id.
inline constexpr int kDurableWorker = -1;

struct DurableIdentity {
  std::string job;
  std::string contents;  // Committed::contents
};

// The records of `m` that `worker` copies into the tier: its own, less those
// of which a lower worker holds an identical piece (same tensor and boxes).
std::vector<ShardRecord> DurableShare(const GenerationManifest& m, int worker);

// Copies `worker`'s share of `m` (a generation of `store`, read through
// `env`) into `dir` of `tier` (null: `env`; an S3Env writes each share as
// one multipart upload, whole or not at all): the bytes, checked against their records' checksums as
// they are read, synced; then the share's records. Nothing when the share
// is empty. `stop` (may be null), asked between chunks, ends the copy.
// \error as VerifyingShardReader (Corruption naming a bad piece) and the Env
//        (the file at fault named); FailedPrecondition "cancelled" when stopped.
Status WriteDurableShare(Env* env, const Store& store, const GenerationManifest& m, int worker,
                         const std::string& dir, const std::atomic<bool>* stop = nullptr, Env* tier = nullptr);

// When `dir` holds every worker's share of `m`: writes durable.json, the copy
// of `m` for `id` (atomically: through a temporary file of `worker`'s own, as
// two workers may complete at once), then removes the other generations'
// shares. False when a share is still missing.
// \error Corruption naming a share's records that do not parse or do not
//        match `m`; as the Env.
Result<bool> CompleteDurable(Env* env, const GenerationManifest& m, const DurableIdentity& id, int worker,
                             const std::string& dir);

// durable.json's text checked as the copy of `id`, with `tensors`: its
// records. `label` starts every message.
// \error Corruption as DecodeManifest, or when extra.durable is malformed;
//        FailedPrecondition when it is another job's, of other contents, or
//        its tensors differ from `tensors` (the first named).
Result<std::vector<ShardRecord>> DecodeDurable(std::string_view label, std::string_view text,
                                               const DurableIdentity& id, const std::vector<TensorRecord>& tensors);

// The tier's copy for `id` as source pieces of a plan: DecodeDurable of
// DIR/durable.json, each record on kDurableWorker, its file kDurablePrefix +
// REL.
// \error NotFound when `dir` holds no complete copy; as DecodeDurable.
Result<std::vector<ShardRecord>> LoadDurable(Env* env, const std::string& dir, const DurableIdentity& id,
                                             const std::vector<TensorRecord>& tensors);

}  // namespace ptc::cluster
