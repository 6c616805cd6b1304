// HDF5 shard files: one stored shard per file, so that h5py and every other
// HDF5 reader can open a store's shards without ptcfs.
//
// A shard file holds one dataset "data": contiguous layout, space allocated at
// creation, never filled, so the shard's bytes occupy [offset, offset+nbytes)
// of the file and are written and read with pwrite/pread at that offset,
// without the HDF5 library (whose calls all serialise behind one global lock).
// Dataset shape: the box shape for a single box, else 1-d of the total element
// count. Element type: IEEE LE floats for F64/F32, a 16-bit IEEE half for F16,
// STD LE integers for I*/U8, and unsigned integers of the same width for BOOL,
// BF16, F8_E4M3 and F8_E5M2 (bit-exact; the "dtype" attribute says what they are).
// Attributes of "data": "tensor" (the global name), "dtype" (the ptcfs dtype
// name), "boxes" (JSON [[[begin...],[end...]], ...]); all variable-length UTF-8 strings.
//
// These functions call HDF5, which opens files through the OS directly: they
// bypass the Env (no MemEnv, no fault injection). Only the tensor bytes of a
// shard go through the Env (Env::OpenExisting + PWrite at the returned offset).
//
// Thread safety: safe from any thread (HDF5 is built thread-safe and
// serialises the calls).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"
#include "ptc/store/manifest.h"

namespace ptc {

// Creates a new shard file at `path` (which must not exist) with its dataset
// allocated but unwritten, and returns the dataset's byte offset in the file.
// For a shard of zero bytes the offset is 0.
// \error AlreadyExists when `path` exists.
// \error InvalidArgument when a box has a different rank from the first.
// \error IOError when HDF5 fails (message names the path and the HDF5 error).
Result<uint64_t> CreateH5Shard(const std::string& path, DType dtype, const std::vector<Box>& boxes,
                               std::string_view tensor);

// Creates a new HDF5 file at `path` whose dataset "data" (as above) keeps its
// bytes outside: in `data_name` (a file name relative to the directory of
// `path`) at `offset`, as HDF5 external storage. Readers resolve the name
// against their working directory unless told the prefix "${ORIGIN}"
// (HDF5_EXTFILE_PREFIX, h5py's efile_prefix). Writes no data.
// \error as CreateH5Shard.
Status CreateH5ExternalShard(const std::string& path, DType dtype, const std::vector<Box>& boxes,
                             std::string_view tensor, const std::string& data_name, uint64_t offset);

// Checks that the shard file agrees with its record: contiguous dataset "data"
// at shard.offset of shard.nbytes bytes, element size of `dtype`, attributes
// naming the same tensor, dtype and boxes; for a record with `h5` (`path` is
// then that file), external storage in shard.file at shard.offset of
// shard.nbytes. Does not read the data.
// \error NotFound when the file does not exist.
// \error Corruption naming the path and the first disagreement (or the HDF5 error).
Status CheckH5Shard(const std::string& path, const ShardRecord& shard, DType dtype);

}  // namespace ptc
