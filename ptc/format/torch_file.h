// torch.save files: a stored zip archive whose members all sit under one
// directory, the archive name ("archive", Megatron's "model_optim_rng"):
//
//   <archive>/data.pkl        the pickled object (pickle.h), tensors as
//                             references to storages by key
//   <archive>/byteorder       "little" (absent in files of torch < 2.0)
//   <archive>/data/<key>      the raw bytes of each storage, little-endian
//   <archive>/version         "3\n"
//
// Reading parses the directory and the pickle, checks every tensor against its
// storage, and leaves the tensor bytes in the file: ReadTensorData gathers one
// tensor (strided views included) when asked. Writing is planned first
// (PlanTorchFile: member names, sizes, the literal members' bytes) so that a
// lazy renderer can learn sizes, compute the storages' CRCs as it likes, and
// then take the zip layout (zip_writer.h) of the finished plan. Format notes:
// docs/torch_format.md.
//
// Every error message names the file (`what`) and, for a tensor, its path in
// the tree ("model.language_model.embedding.word_embeddings.weight").
//
// Thread safety: pure functions, or reads of `file` (safe concurrently).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/format/pickle.h"
#include "ptc/format/zip_reader.h"
#include "ptc/format/zip_writer.h"
#include "ptc/model/dtype.h"

namespace ptc {

// Largest data.pkl we read into memory.
inline constexpr uint64_t kMaxTorchPickleSize = 256ull << 20;

struct TorchStorage {
  std::string key;
  DType dtype = DType::kU8;
  uint64_t numel = 0;  // elements
  ZipEntry member;     // "<archive>/data/<key>": data offset and size in the file
};

struct TorchFile {
  std::string archive;
  pickle::Value root;
  std::vector<TorchStorage> storages;  // those the tensors reference, in file order
  // Index into `storages` by key, filled by ReadTorchFile; FindStorage scans
  // `storages` when the index does not cover them (a TorchFile built by hand).
  std::map<std::string, size_t, std::less<>> storage_index;
  ZipArchive zip;

  // nullptr when no tensor references `key`. O(log n) in a TorchFile that ReadTorchFile made.
  const TorchStorage* FindStorage(std::string_view key) const;
};

// Parses the zip directory and data.pkl of a torch.save file.
// \error InvalidArgument as ReadZipDirectory and pickle::Unpickle; when the
//        first member is not under a directory, "<archive>/data.pkl" is
//        missing or larger than kMaxTorchPickleSize; the byteorder is not
//        "little"; a tensor (named by its path) references a storage with no
//        member, or with a different dtype or size than another tensor does;
//        a storage member's size is not numel x dtype size; a tensor does not
//        fit its storage (offset + extent of shape and stride > numel) or has
//        more bytes than 64 bits count.
// \error as RandomAccessFile::Read.
Result<TorchFile> ReadTorchFile(const RandomAccessFile& file, const std::string& what);

// Elements and bytes of a tensor (product of the shape; x dtype size).
// REQUIRES: a tensor of a TorchFile that ReadTorchFile accepted, or one that
// PlanTorchFile accepted (so the products do not overflow).
uint64_t TensorNumElements(const pickle::Tensor& t);
uint64_t TensorNumBytes(const pickle::Tensor& t);
// True when the elements lie in row-major order without gaps (dims of size 1
// have any stride), so the tensor is one byte range of its storage.
bool IsContiguous(const pickle::Tensor& t);

// Reads the elements of `t` in row-major (C) order into `dst`
// (TensorNumBytes(t) bytes), gathering strided views from the storage: one
// read of the spanned range when it is at most 64 MiB, else one read per
// contiguous run.
// \error NotFound when `t` references a storage `tf` does not have.
// \error InvalidArgument when `t` disagrees with the storage's dtype or numel
//        or does not fit it (a tensor changed after ReadTorchFile).
// \error as RandomAccessFile::Read.
Status ReadTensorData(const RandomAccessFile& file, const TorchFile& tf, const pickle::Tensor& t, void* dst,
                      const std::string& what);
Result<std::string> ReadTensorBytes(const RandomAccessFile& file, const TorchFile& tf, const pickle::Tensor& t,
                                    const std::string& what);

// Checks the CRC-32 of every member of the file.
// \error Corruption "bad CRC-32 in member X of WHAT"; as RandomAccessFile::Read.
Status VerifyTorchFileCrcs(const RandomAccessFile& file, const TorchFile& tf, const std::string& what);

// A storage to write: its bytes are numel x dtype size, supplied by the caller.
struct TorchStorageSpec {
  std::string key;
  DType dtype = DType::kU8;
  uint64_t numel = 0;
  uint32_t crc32 = 0;  // of the bytes, when known (needed only for a layout)
};

// The members of a torch file to write, in torch's order: data.pkl,
// byteorder, data/<key> for each storage in the order given (torch.save sorts
// the keys as strings), version.
struct TorchFilePlan {
  std::string archive;
  // Names, sizes and CRCs. The CRCs of the literal members are computed; a
  // storage's is the one its spec gave. A caller that learns CRCs later sets
  // members[storage_members[i]].crc32 before calling LayoutTorchFile; sizes,
  // and so every offset of the layout, do not depend on CRCs.
  std::vector<ZipMember> members;
  std::vector<std::string> contents;    // per member: the bytes of a literal member, "" for a storage
  std::vector<int64_t> member_storage;  // per member: index into the specs, or -1
  std::vector<size_t> storage_members;  // per spec: index into members
};

// Plans a torch file holding `root` (pickled with pickle::Pickle) and `storages`.
// \error InvalidArgument for an archive name that is empty or contains '/';
//        a storage key that is empty, repeated or contains '/'; a storage whose
//        byte size overflows; a tensor (named by its path) whose storage is
//        not listed or disagrees with the spec's dtype or numel, or that does
//        not fit its storage.
Result<TorchFilePlan> PlanTorchFile(const std::string& archive, const pickle::Value& root,
                                    const std::vector<TorchStorageSpec>& storages);

// The zip layout of the plan with its current CRCs (zip_writer.h PlanZip).
Result<ZipLayout> LayoutTorchFile(const TorchFilePlan& plan);

// Supplies `n` bytes of storage `storage` (an index into the specs) from `offset` on.
using TorchStorageReader = std::function<Status(size_t storage, uint64_t offset, size_t n, void* dst)>;

// Member data for ReadZipRange / WriteZip: literal members from the plan,
// storages through `read`. The plan must outlive the returned function.
ZipDataReader TorchMemberReader(const TorchFilePlan& plan, TorchStorageReader read);

// Writes a whole torch file into `out` (empty, appended to), computing the
// CRCs while streaming (the specs' crc32 are ignored).
// \error as PlanTorchFile and WriteZip, labelled with `what`.
Status WriteTorchFile(WritableFile& out, const std::string& archive, const pickle::Value& root,
                      const std::vector<TorchStorageSpec>& storages, const TorchStorageReader& read,
                      const std::string& what);

}  // namespace ptc
