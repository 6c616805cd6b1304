// A rank's view of the dataset: the files the mount serves under
// data/rank-RRRRR/, rendered on demand from the source and the order, never
// copied. Every file's size is known before the first read (stat), and every
// read is random access: bytes [offset, offset + n) of the virtual file.
//
//   ids.txt        the global sample ids the rank reads next, one per line, in
//                  order, to the end of the epoch. Fixed width: each id is
//                  zero-padded to the digits of N-1 (IdWidth), so line j is
//                  bytes [j*(w+1), (j+1)*(w+1)) and a read costs O(1) per line.
//   samples.idx    Megatron .idx of those samples in that order (one document
//                  each; dtype of the source).
//   samples.bin    their tokens, back to back (Megatron sources).
//   samples.jsonl  their lines, each ended by "\n" (JSONL sources).
//
// Cost: ids.txt and the size of samples.idx need nothing up front. samples.bin,
// samples.jsonl and the offsets in samples.idx use a table of byte offsets, one
// entry per 1024 samples, built on the first use by one pass over the rank's
// samples (O(count) index lookups, O(count / 1024) memory); a read then costs
// O(log) plus at most 1024 length lookups to find its first sample.
//
// Thread safety: a RankDataView is safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/dataset/order.h"
#include "ptc/dataset/source.h"
#include "ptc/dataset/state.h"
#include "ptc/model/config.h"

namespace ptc {

enum class ViewFile { kIds, kIdx, kBin, kJsonl };

std::string_view ViewFileName(ViewFile f);  // "ids.txt", "samples.idx", ...
// \error InvalidArgument naming the text and the choices.
Result<ViewFile> ParseViewFile(std::string_view name);
// The files a view of a dataset of this format offers, in listing order.
std::vector<ViewFile> ViewFiles(DatasetFormat format);

// Digits of N-1, at least 1: the width of every id in ids.txt.
int IdWidth(uint64_t num_samples);

// The samples data-parallel rank `dp_rank` of `dp` reads next from `state`;
// with length buckets, those of group `group` (whose config has that dp).
// Grouped streams read every remaining sample's length once (dataset_order.h).
// \error InvalidArgument when dp_rank is outside [0, dp), when the dataset has
//        length buckets and no group is given (or the group is out of range), or
//        when a group is given and the dataset has no length buckets.
Result<std::shared_ptr<const SampleSequence>> RankSamplesFor(const DatasetState& state,
                                                             std::shared_ptr<const DatasetSource> source, int dp,
                                                             int dp_rank, std::optional<size_t> group);

class RankDataView {
 public:
  // `source` must be the one `samples` ids refer to, with N = state's samples.
  RankDataView(std::shared_ptr<const DatasetSource> source, std::shared_ptr<const SampleSequence> samples);

  uint64_t num_samples() const { return samples_->size(); }
  bool Offers(ViewFile f) const;
  // \error InvalidArgument when this view does not offer `f`.
  Result<uint64_t> FileSize(ViewFile f) const;
  // Reads up to n bytes at `offset` into dst, like pread: fewer at the end of the
  // file, 0 at or past it. Returns the count.
  // \error InvalidArgument when this view does not offer `f`; Corruption / IOError
  //        from reading the source.
  Result<size_t> Read(ViewFile f, uint64_t offset, size_t n, char* dst) const;

  // Byte offset of item j in samples.bin / samples.jsonl (j <= num_samples()).
  uint64_t DataOffset(uint64_t j) const;

 private:
  class IdxAdapter;
  void BuildTable() const;
  // The item holding data byte `offset`, and the offset inside it. REQUIRES: offset < total.
  std::pair<uint64_t, uint64_t> LocateData(uint64_t offset) const;
  Status ReadIds(uint64_t offset, size_t n, char* dst) const;
  Status ReadData(uint64_t offset, size_t n, char* dst) const;

  std::shared_ptr<const DatasetSource> source_;
  std::shared_ptr<const SampleSequence> samples_;
  int width_;
  mutable std::once_flag table_once_;
  mutable std::vector<uint64_t> table_;  // set once: data offset of items 0, 1024, 2048, ..., and the total
};

}  // namespace ptc
