// The dataset state of a store: which dataset (and its fingerprint), the seed,
// the global batch size and the position (epoch, consumed samples). It lives in
// the generation manifest as extra["dataset"] (docs/dataset_format.md), so it
// is committed, versioned and rolled back with the model state.
//
// Position: consumed = step * B within the current epoch (N at its end). The
// step of a state is within its epoch: steps 0..ceil(N/B) are valid, the last
// one meaning "epoch finished" (every view empty); a step beyond is an error,
// never a silent roll-over into the next epoch. The next epoch is chosen
// explicitly (StateAtStep's `epoch`).
//
// Thread safety: values and functions; the store operations take the store's
// single GenerationWriter, so they fail (FailedPrecondition) while another
// writer is active.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/dataset/source.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"

namespace ptc {

struct DatasetFile {
  std::string path;  // absolute
  uint64_t size = 0;
  friend bool operator==(const DatasetFile&, const DatasetFile&) = default;
};

struct DatasetState {
  DatasetFormat format = DatasetFormat::kMegatron;
  std::string source;              // absolute: the Megatron prefix or the .jsonl file
  std::string index;               // JSONL: the line index, relative to the store root; else empty
  std::vector<DatasetFile> files;  // fingerprint: PREFIX.idx, PREFIX.bin / the .jsonl
  uint64_t index_checksum = 0;     // fingerprint: xxh64 of PREFIX.idx / of the JSONL index's pairs
  uint64_t num_samples = 0;        // N >= 1
  uint64_t global_batch = 1;       // B >= 1, fixed for the dataset's life in the store
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t consumed = 0;                 // in this epoch: a multiple of B, or N
  std::vector<uint64_t> length_buckets;  // optional length-group bounds (Megatron only)

  uint64_t steps_per_epoch() const { return num_samples / global_batch + (num_samples % global_batch != 0); }
  // Steps taken in this epoch (steps_per_epoch() once the epoch is finished).
  uint64_t step() const { return consumed / global_batch + (consumed % global_batch != 0); }
  friend bool operator==(const DatasetState&, const DatasetState&) = default;
};

// The JSON object of docs/dataset_format.md.
nlohmann::json EncodeDatasetState(const DatasetState& s);

// Decodes and validates; never throws. `label` starts every message.
// \error Corruption naming the field: not an object, a field missing or of the
//        wrong type, unknown format, empty source, a JSONL index path that is not
//        a safe relative path, the wrong number of files, a malformed checksum,
//        samples or global_batch 0, consumed past samples or off a batch
//        boundary, length buckets not strictly ascending and positive or given
//        for JSONL.
Result<DatasetState> DecodeDatasetState(std::string_view label, const nlohmann::json& j);
// Parses `text` as JSON first (the fuzzing entry point).
// \error Corruption when it is not JSON; else as DecodeDatasetState.
Result<DatasetState> DecodeDatasetStateText(std::string_view label, std::string_view text);

// The state in the store's current generation; nullopt when there is no
// generation or no extra["dataset"].
// \error Corruption as DecodeDatasetState (label: the generation's manifest).
Result<std::optional<DatasetState>> LoadDatasetState(const Store& store);

// The state at `step` of `epoch` (default: the state's epoch).
// \error InvalidArgument when step > steps_per_epoch(), naming the step, the epoch
//        and its size ("step 7 is beyond the end of epoch 0, which has 5 steps ...").
Result<DatasetState> StateAtStep(const DatasetState& s, uint64_t step, std::optional<uint64_t> epoch = std::nullopt);

// Commits a new generation that keeps every tensor and shard of the current one
// (files unchanged) and sets extra["dataset"] = s. On a store without a
// generation, the new generation has no tensors.
// \error FailedPrecondition when a writer is active; IOError from the Env.
Status CommitDatasetState(Store& store, const DatasetState& s);

struct DatasetImportOptions {
  DatasetFormat format = DatasetFormat::kMegatron;
  std::string source;  // Megatron prefix or .jsonl file
  uint64_t global_batch = 0;
  uint64_t seed = 0;
  std::vector<uint64_t> length_buckets;
};

struct DatasetImportResult {
  DatasetState state;
  bool committed = false;  // false: the same dataset with the same settings was already there
};

// Imports a dataset: validates the source, fingerprints it and commits a new
// generation with the state at epoch 0, step 0. JSONL sources get their line
// index written to STORE/dataset/. Importing the same dataset (same fingerprint)
// with the same settings again changes nothing. `progress` gets bytes scanned.
// \error InvalidArgument for a global batch of 0, bad length buckets, length
//        buckets on a JSONL source, or a dataset without samples.
// \error NotFound / Corruption from opening the source (ParseIdx, ScanJsonl).
// \error FailedPrecondition when the store already holds a dataset with another
//        fingerprint ("dataset fingerprint mismatch ..."), or the same dataset with
//        another global batch, seed or length buckets. Nothing changes in the store.
Result<DatasetImportResult> ImportDataset(Store& store, const DatasetImportOptions& options,
                                          const std::function<void(uint64_t)>& progress = {});

// Opens the state's source and checks it against the fingerprint (sizes, then
// the index checksum).
// \error NotFound when a file is gone; FailedPrecondition ("dataset fingerprint
//        mismatch ...") when it changed since import; Corruption from parsing.
Result<std::unique_ptr<DatasetSource>> OpenDatasetSource(Env* env, const Store& store, const DatasetState& s);

}  // namespace ptc
