// `ptcfs import`: a per-rank safetensors checkpoint into a store.
//
// All rank files are checked against their views before the store is
// touched; every replica (dp copies, tp-replicated tensors, tied embeddings)
// must agree by checksum; tensors replicated across the ranks of one worker
// are stored once on that worker. The result is committed as a new
// generation; on any failure the store is as it was (a store this call
// created is removed again).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/env.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/format/crc_ledger.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"

namespace ptc {

struct ImportResult {
  uint64_t generation = 0;
  uint64_t shards = 0;
  uint64_t bytes_stored = 0;
  uint64_t bytes_read = 0;
};

// A checkpoint of any format, to import.
struct CheckpointSource {
  ModelSpec spec;
  ParallelConfig config;
  // Opens (and checks) the files of one rank of `config`.
  std::function<Result<std::unique_ptr<RankCheckpoint>>(const RankView&)> open_rank;
  // The rank's file, for messages.
  std::function<std::string(int rank)> rank_file;
  // Entries set in the new manifest's extra (over those kept from the store).
  nlohmann::json extra = nlohmann::json::object();
  // The rank files are the store's own from now on (a save's staged files, on
  // the store's file system, never written again): WriteRanks links each into
  // the generation (GenerationWriter::AdoptFile) and points the pieces that
  // lie whole in it at their bytes instead of copying them. A file that cannot
  // be linked is copied from as before.
  bool adopt_files = false;
  // The zip CRC-32s open_rank left to the import (torch files): the import
  // hands over each tensor it reads whole (the bytes it hashes anyway) and
  // checks every member before the generation is committed, reading only
  // what no tensor covered (ptc/format/crc_ledger.h). Null: open_rank checked them.
  std::shared_ptr<CrcLedger> crcs;
};

// Imports `source` into the store at `store_path` (created when absent): every
// rank is opened (checked) before the store is touched; the CRCs of
// source.crcs are checked before the generation commits.
// \error as ValidateConfig, source.open_rank and CrcLedger::Verify; InvalidArgument when replicas
//        of a tensor disagree; as Store::Create / Store::Open and the GenerationWriter.
Result<ImportResult> ImportFrom(Env* env, const CheckpointSource& source, const std::string& store_path,
                                const ProgressFn& progress = {});
// The same into an open store (which must have no active writer).
// \error as above; FailedPrecondition while another writer is active.
Result<ImportResult> ImportInto(Store* store, const CheckpointSource& source, const ProgressFn& progress = {});

// Writes the shards of `ranks` (of source.config) into `writer`, all on
// `worker` (the one whose disk holds them), without committing: one worker's
// part of a save spread over many (docs/cluster.md). Each rank is opened
// (checked) before anything is written; replicas must agree among these ranks.
// \error as ImportInto.
Result<ImportResult> WriteRanks(Env* env, GenerationWriter* writer, const CheckpointSource& source,
                                const std::vector<int>& ranks, int worker, const ProgressFn& progress = {});

// Copies bytes [offset, offset + size) of `file`, the dense bytes of `boxes`
// of `tensor`, into a new stored piece on `worker` and adds it to `writer`;
// `buf` is the copy buffer, `progress` gets each block's bytes, read errors
// are labelled `what`. For imports whose pieces lie whole in their files.
// \error as GenerationWriter::NewShard, RandomAccessFile::Read and ShardSink.
Status WritePiece(GenerationWriter& writer, const std::string& tensor, DType dtype, std::vector<Box> boxes, int worker,
                  const RandomAccessFile& file, uint64_t offset, uint64_t size, std::vector<char>& buf,
                  const ProgressFn& progress, const std::string& what);

// Runs `write` on the store at `store_path`, created when absent (and removed
// again, or emptied when its directory existed, when `write` fails).
// \error as Store::Create / Store::Open, and `write`'s.
Result<ImportResult> ImportWith(Env* env, const std::string& store_path,
                                const std::function<Result<ImportResult>(Store*)>& write);

// A per-rank safetensors checkpoint (checkpoint.h).
// \error as InferModelSpec, ValidateConfig and RankCheckpoint::Open (missing
//        rank file, wrong shape or dtype, unknown tensor, malformed header).
// \error InvalidArgument when replicas of a tensor disagree, naming the tensor,
//        its boxes and both ranks.
// \error as Store::Create / Store::Open and the GenerationWriter.
Result<ImportResult> ImportCheckpoint(Env* env, const std::string& src_dir, const std::string& store_path,
                                      const Schema& schema, const ModelDims& dims, const ParallelConfig& config,
                                      const ProgressFn& progress = {});

}  // namespace ptc
