// The generation manifest: everything a committed generation of a store is
// (the tensors, where each shard's bytes live, their checksums, and the opaque
// schema / dims / config / extra the layers above keep with it).
// docs/store_format.md describes the JSON field by field.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"

namespace ptc {

struct TensorRecord {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  friend bool operator==(const TensorRecord&, const TensorRecord&) = default;
};

// One stored copy of part of a tensor. The shard's data is each box densely in
// row-major order, boxes one after another, at `offset` in `file`.
struct ShardRecord {
  std::string tensor;  // global tensor name
  std::vector<Box> boxes;
  int worker = 0;                         // the worker holding this copy; replicas are separate records
  std::string file{};                     // relative to the store root; may point into an older generation
  uint64_t offset = 0;                    // byte offset of the data in the file (HDF5 contiguous dataset)
  uint64_t nbytes = 0;                    // sum of box volumes * dtype size
  uint64_t checksum = 0;                  // ptc/base/checksum.h: of the bytes, or of the block checksums
  std::vector<uint64_t> block_checksums{};  // per kChecksumBlockBytes block; empty: one block
  // Empty: `file` is the HDF5 shard file. Otherwise `file` is a plain file
  // holding the bytes among others' (a rank's safetensors file, written whole
  // by a compaction, docs/store_format.md "Rank files") and `h5` the HDF5 file
  // describing them as external storage at `offset` of `file`.
  std::string h5{};
  // The CRC-32 (zip's) of each checksum block (BlockCount of them), recorded
  // as the bytes were written, so that a torch file's zip records are
  // composed (Crc32Combine) instead of read (view/megatron_file.h). Empty:
  // not recorded (manifests before them, pieces copied from such records).
  std::vector<uint32_t> block_crc32s{};
  friend bool operator==(const ShardRecord&, const ShardRecord&) = default;
};

// A shard's checksum blocks: kChecksumBlockBytes each (the last shorter) when
// it has block checksums, else one block of all its bytes.
size_t BlockCount(const ShardRecord& s);
// The block holding byte `offset_in_shard` (< nbytes).
size_t BlockOf(const ShardRecord& s, uint64_t offset_in_shard);
// Bytes [BlockBegin, BlockEnd) of the shard are block i.
uint64_t BlockBegin(const ShardRecord& s, size_t i);
uint64_t BlockEnd(const ShardRecord& s, size_t i);
uint64_t BlockChecksum(const ShardRecord& s, size_t i);

// Copies of stored pieces inside rank files (docs/store_format.md, "Rank
// files"): a rank file that holds a piece another file of the same worker
// stores (a tensor-parallel replicated norm, a data-parallel replica) holds a
// copy of its bytes, so that the file exists whole. A copy is not a stored
// piece (the store keeps one ShardRecord per piece per worker): its bytes
// equal those of the piece with the same (worker, tensor, boxes), whose
// checksums verify them.
struct CopyRecord {
  std::string tensor;
  std::vector<Box> boxes;  // the stored piece's, in its order
  uint64_t offset = 0;     // of the copy's bytes in the rank file
  friend bool operator==(const CopyRecord&, const CopyRecord&) = default;
};
struct RankFileCopies {
  std::string file;  // the rank file, relative to the store root
  int worker = 0;    // its worker: each copy is of that worker's piece
  std::vector<CopyRecord> copies;
  friend bool operator==(const RankFileCopies&, const RankFileCopies&) = default;
};

struct GenerationManifest {
  uint64_t generation = 0;
  std::optional<uint64_t> parent;
  nlohmann::json schema;  // embedded verbatim; opaque to the store
  std::string dims;       // canonical model dims string; opaque here
  std::string config;     // canonical parallel config string; opaque here
  std::vector<TensorRecord> tensors;
  std::vector<ShardRecord> shards;
  nlohmann::json extra = nlohmann::json::object();  // dataset state etc.; opaque
  // Last, so that brace initialisers of the fields above stay valid.
  std::vector<RankFileCopies> rank_file_copies;  // empty in manifests without rank files (and older ones)
  friend bool operator==(const GenerationManifest&, const GenerationManifest&) = default;
};

// One worker's part of a generation that several write together (a change
// or a save of a cluster job, docs/cluster.md): the pieces it wrote and what
// else the others need of it (a save: its rank files' entries besides the tensors).
struct Part {
  std::vector<ShardRecord> shards;
  nlohmann::json extra = nlohmann::json::object();
};

// The tensor named `name`, or nullptr. A linear search: for a look-up per
// shard use TensorsByName.
const TensorRecord* FindTensor(const GenerationManifest& m, std::string_view name);

// The tensors of `m` by name (the first of a repeated name); `m` must outlive it.
std::unordered_map<std::string_view, const TensorRecord*> TensorsByName(const GenerationManifest& m);

// Pretty JSON with a fixed key order. Strings that are not valid UTF-8 are
// written with U+FFFD replacements (DecodeManifest then sees other names).
std::string EncodeManifest(const GenerationManifest& m);

// Parses and validates a manifest. `label` (normally the file path) starts
// every error message.
// \error Corruption when the text is not JSON, a field is missing or of the wrong type,
//        the format or version is not ours, a dtype name is unknown, a tensor name
//        fails ValidateTensorName (ptc/model/tensor_name.h) or repeats, a shard names no tensor, a box has the wrong
//        rank or leaves the tensor shape, nbytes != sum of box volumes * dtype size, a file path is absolute, empty or
//        contains "..", a checksum is malformed, or the block checksums do not fit nbytes or the shard checksum; a
//        rank_file_copies entry has an unsafe or repeated file, a copy names no piece its worker stores (tensor and
//        boxes), or copies in one file overlap or overflow. The message names the tensor, shard or copy (by file and
//        index) at fault.
Result<GenerationManifest> DecodeManifest(std::string_view label, std::string_view json);

// Checks one shard record against its tensor (the same rules as DecodeManifest).
// \error InvalidArgument naming the tensor and the rule broken.
Status ValidateShard(const ShardRecord& shard, const TensorRecord& tensor);

// True for a non-empty relative path with no "", "." or ".." component.
bool IsSafeRelativePath(std::string_view path);

// "[[0,0],[4,64]]" per box, as a JSON array: [[[b...],[e...]], ...].
nlohmann::json BoxesToJson(const std::vector<Box>& boxes);

}  // namespace ptc
