// HDF5 shard files. Every HDF5 call is checked; a failure becomes a Status
// naming the path and HDF5's own description. Automatic error printing is off.
#include "ptc/store/h5shard.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "ptc/base/regular_file.h"

namespace ptc {
namespace {

// The thread-safe HDF5 keeps error stacks (and their printing) per thread.
//
// HDF5's own atexit handler (H5close) is turned off before the library first
// initialises: a file whose H5Fclose failed (ENOSPC while flushing its
// metadata) keeps its id, and H5close at exit retries the flush forever
// ("infinite loop closing library") or crashes. Every file we keep is closed
// explicitly; one whose close failed is removed by its caller, so there is
// nothing left for H5close to do that the kernel does not do at exit.
void DisableHdf5ErrorPrinting() {
  static std::once_flag no_atexit;
  std::call_once(no_atexit, [] { H5dont_atexit(); });
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

// One readable line for an HDF5 error record: a failed system call becomes
// its errno text ("No space left on device"), not the driver's long dump of
// addresses and sizes.
std::string DescribeError(const H5E_error2_t& err) {
  std::string desc = err.desc != nullptr ? err.desc : "";
  const std::string marker = "error message = '";
  if (size_t at = desc.find(marker); at != std::string::npos) {
    at += marker.size();
    const size_t end = desc.find('\'', at);
    return desc.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  if (size_t at = desc.find(", errno = "); at != std::string::npos) desc.resize(at);
  return std::string(err.func_name != nullptr ? err.func_name : "?") + ": " + desc;
}

herr_t TakeFirstDescription(unsigned n, const H5E_error2_t* err, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (text->empty() && err->desc != nullptr) *text = DescribeError(*err);
  return 0;
}

// The innermost HDF5 error of this thread, then clears the stack.
std::string Hdf5ErrorText() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, TakeFirstDescription, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "unknown HDF5 error" : text;
}

Status Hdf5Error(Code code, const std::string& path, std::string_view what) {
  return Status(code, path + ": HDF5 " + std::string(what) + " failed: " + Hdf5ErrorText());
}

// Owns one hid_t; closes it with the matching H5*close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      (void)Close();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Hid() { (void)Close(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns HDF5's result (negative on failure).
  herr_t Close() {
    if (id_ < 0) return 0;
    herr_t rc = closer_(std::exchange(id_, H5I_INVALID_HID));
    return rc;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Wraps a call that returns a new hid_t.
Result<Hid> Check(hid_t id, Hid::Closer closer, const std::string& path, std::string_view what,
                  Code code = Code::kIOError) {
  if (id < 0) return Hdf5Error(code, path, what);
  return Hid(id, closer);
}

Status Check(herr_t rc, const std::string& path, std::string_view what, Code code = Code::kIOError) {
  if (rc < 0) return Hdf5Error(code, path, what);
  return Status::OK();
}

hid_t NativeTypeFor(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return H5T_IEEE_F64LE;
    case DType::kF32:
      return H5T_IEEE_F32LE;
    case DType::kI64:
      return H5T_STD_I64LE;
    case DType::kI32:
      return H5T_STD_I32LE;
    case DType::kI16:
      return H5T_STD_I16LE;
    case DType::kI8:
      return H5T_STD_I8LE;
    case DType::kBF16:
      return H5T_STD_U16LE;
    case DType::kF16:  // built in FileTypeFor
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

// A copy of the HDF5 type that stores `dtype`; F16 becomes the 16-bit IEEE
// half layout that h5py reads as numpy.float16.
Result<Hid> FileTypeFor(DType dtype, const std::string& path) {
  if (dtype != DType::kF16) return Check(H5Tcopy(NativeTypeFor(dtype)), H5Tclose, path, "H5Tcopy");
  PTC_ASSIGN_OR_RETURN(Hid t, Check(H5Tcopy(H5T_IEEE_F32LE), H5Tclose, path, "H5Tcopy"));
  PTC_RETURN_IF_ERROR(Check(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), path, "H5Tset_fields"));
  PTC_RETURN_IF_ERROR(Check(H5Tset_size(t.get(), 2), path, "H5Tset_size"));
  PTC_RETURN_IF_ERROR(Check(H5Tset_ebias(t.get(), 15), path, "H5Tset_ebias"));
  return t;
}

Result<Hid> StringType(const std::string& path) {
  PTC_ASSIGN_OR_RETURN(Hid t, Check(H5Tcopy(H5T_C_S1), H5Tclose, path, "H5Tcopy"));
  PTC_RETURN_IF_ERROR(Check(H5Tset_size(t.get(), H5T_VARIABLE), path, "H5Tset_size"));
  PTC_RETURN_IF_ERROR(Check(H5Tset_cset(t.get(), H5T_CSET_UTF8), path, "H5Tset_cset"));
  return t;
}

Status WriteStringAttribute(hid_t obj, const char* name, const std::string& value, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(Hid type, StringType(path));
  PTC_ASSIGN_OR_RETURN(Hid space, Check(H5Screate(H5S_SCALAR), H5Sclose, path, "H5Screate"));
  PTC_ASSIGN_OR_RETURN(Hid attr, Check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                                       H5Aclose, path, "H5Acreate2"));
  const char* data = value.c_str();
  PTC_RETURN_IF_ERROR(Check(H5Awrite(attr.get(), type.get(), &data), path, "H5Awrite"));
  return Check(attr.Close(), path, "H5Aclose");
}

Result<std::string> ReadStringAttribute(hid_t obj, const char* name, const std::string& path) {
  const std::string what = std::string("read of attribute '") + name + "'";
  PTC_ASSIGN_OR_RETURN(Hid attr, Check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, path, what, Code::kCorruption));
  PTC_ASSIGN_OR_RETURN(Hid type, StringType(path));
  PTC_ASSIGN_OR_RETURN(Hid stored, Check(H5Aget_type(attr.get()), H5Tclose, path, what, Code::kCorruption));
  if (H5Tget_class(stored.get()) != H5T_STRING || H5Tis_variable_str(stored.get()) <= 0) {
    return CorruptionError(path + ": attribute '" + name + "' is not a variable-length string");
  }
  char* data = nullptr;
  PTC_RETURN_IF_ERROR(Check(H5Aread(attr.get(), type.get(), &data), path, what, Code::kCorruption));
  std::string out = data ? data : "";
  H5free_memory(data);
  return out;
}

Result<Hid> DataSpaceFor(const std::vector<Box>& boxes, const std::string& path) {
  if (boxes.size() == 1 && boxes[0].rank() == 0) return Check(H5Screate(H5S_SCALAR), H5Sclose, path, "H5Screate");
  std::vector<hsize_t> dims;
  if (boxes.size() == 1) {
    for (Index n : boxes[0].shape()) dims.push_back(static_cast<hsize_t>(n));
  } else {
    hsize_t total = 0;
    for (const Box& b : boxes) total += static_cast<hsize_t>(b.volume());
    dims.push_back(total);
  }
  return Check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, path,
               "H5Screate_simple");
}

Result<Hid> ContiguousEarlyNeverFill(const std::string& path) {
  PTC_ASSIGN_OR_RETURN(Hid dcpl, Check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, "H5Pcreate"));
  PTC_RETURN_IF_ERROR(Check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), path, "H5Pset_layout"));
  PTC_RETURN_IF_ERROR(Check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), path, "H5Pset_alloc_time"));
  PTC_RETURN_IF_ERROR(Check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), path, "H5Pset_fill_time"));
  return dcpl;
}

uint64_t TotalBytes(DType dtype, const std::vector<Box>& boxes) {
  uint64_t n = 0;
  for (const Box& b : boxes) n += static_cast<uint64_t>(b.volume());
  return n * DTypeSize(dtype);
}

// The bytes of a dataset kept outside its HDF5 file: `name` (relative to the
// HDF5 file's directory) at `offset`.
struct External {
  std::string name;
  uint64_t offset = 0;
};

Result<Hid> ExternalNeverFill(const External& ext, uint64_t nbytes, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(Hid dcpl, Check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, "H5Pcreate"));
  PTC_RETURN_IF_ERROR(
      Check(H5Pset_external(dcpl.get(), ext.name.c_str(), static_cast<off_t>(ext.offset), static_cast<hsize_t>(nbytes)),
            path, "H5Pset_external"));
  PTC_RETURN_IF_ERROR(Check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), path, "H5Pset_fill_time"));
  return dcpl;
}

Result<uint64_t> CreateDataset(hid_t file, DType dtype, const std::vector<Box>& boxes, std::string_view tensor,
                               const std::string& path, const External* external = nullptr) {
  PTC_ASSIGN_OR_RETURN(Hid type, FileTypeFor(dtype, path));
  PTC_ASSIGN_OR_RETURN(Hid space, DataSpaceFor(boxes, path));
  PTC_ASSIGN_OR_RETURN(Hid dcpl, external ? ExternalNeverFill(*external, TotalBytes(dtype, boxes), path)
                                          : ContiguousEarlyNeverFill(path));
  PTC_ASSIGN_OR_RETURN(
      Hid dset, Check(H5Dcreate2(file, "data", type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose,
                      path, "H5Dcreate2"));
  PTC_RETURN_IF_ERROR(WriteStringAttribute(dset.get(), "tensor", std::string(tensor), path));
  PTC_RETURN_IF_ERROR(WriteStringAttribute(dset.get(), "dtype", std::string(DTypeName(dtype)), path));
  PTC_RETURN_IF_ERROR(WriteStringAttribute(dset.get(), "boxes", BoxesToJson(boxes).dump(), path));
  uint64_t offset = external ? external->offset : 0;
  if (!external && TotalBytes(dtype, boxes) > 0) {
    haddr_t addr = H5Dget_offset(dset.get());
    if (addr == HADDR_UNDEF) return Hdf5Error(Code::kIOError, path, "H5Dget_offset");
    offset = static_cast<uint64_t>(addr);
  }
  PTC_RETURN_IF_ERROR(Check(dset.Close(), path, "H5Dclose"));
  return offset;
}

}  // namespace

namespace {

Result<uint64_t> CreateShardFile(const std::string& path, DType dtype, const std::vector<Box>& boxes,
                                 std::string_view tensor, const External* external) {
  DisableHdf5ErrorPrinting();
  for (const Box& b : boxes) {
    if (b.rank() != boxes[0].rank() || b.end.size() != b.begin.size()) {
      return InvalidArgumentError(path + ": boxes of tensor '" + std::string(tensor) + "' differ in rank");
    }
  }
  if (::access(path.c_str(), F_OK) == 0) return AlreadyExistsError(path + ": shard file already exists");
  PTC_ASSIGN_OR_RETURN(
      Hid file, Check(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, path, "H5Fcreate"));
  Result<uint64_t> offset = CreateDataset(file.get(), dtype, boxes, tensor, path, external);
  Status closed = Check(file.Close(), path, "H5Fclose");  // after the dataset's ids (closed in CreateDataset)
  if (offset.ok() && closed.ok()) return offset;
  ::unlink(path.c_str());  // a half-written shard file is no use to anyone
  return offset.ok() ? closed : offset.status();
}

}  // namespace

Result<uint64_t> CreateH5Shard(const std::string& path, DType dtype, const std::vector<Box>& boxes,
                               std::string_view tensor) {
  return CreateShardFile(path, dtype, boxes, tensor, nullptr);
}

Status CreateH5ExternalShard(const std::string& path, DType dtype, const std::vector<Box>& boxes,
                             std::string_view tensor, const std::string& data_name, uint64_t offset) {
  const External external{data_name, offset};
  return CreateShardFile(path, dtype, boxes, tensor, &external).status();
}

namespace {

// A record with `h5`: the dataset's one external file must be `file` (named
// relative to the HDF5 file's directory) at the record's offset and size.
Status CheckExternal(hid_t dcpl, const ShardRecord& shard, const std::string& path) {
  if (H5Pget_external_count(dcpl) != 1) return CorruptionError(path + ": dataset 'data' has no single external file");
  char name[4096] = {};
  off_t offset = 0;
  hsize_t size = 0;
  PTC_RETURN_IF_ERROR(
      Check(H5Pget_external(dcpl, 0, sizeof(name), name, &offset, &size), path, "H5Pget_external", Code::kCorruption));
  const std::string h5_dir = shard.h5.substr(0, shard.h5.rfind('/') + 1);
  if (h5_dir + name != shard.file || static_cast<uint64_t>(offset) != shard.offset || size != shard.nbytes) {
    return CorruptionError(path + ": external storage " + name + " at " + std::to_string(offset) + " (" +
                           std::to_string(size) + " bytes), manifest says " + shard.file + " at " +
                           std::to_string(shard.offset) + " (" + std::to_string(shard.nbytes) + " bytes)");
  }
  return Status::OK();
}

Status CheckLayout(hid_t dset, const ShardRecord& shard, DType dtype, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(Hid dcpl,
                       Check(H5Dget_create_plist(dset), H5Pclose, path, "H5Dget_create_plist", Code::kCorruption));
  if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS) return CorruptionError(path + ": dataset 'data' is not contiguous");
  if (!shard.h5.empty()) {
    PTC_ASSIGN_OR_RETURN(Hid type, Check(H5Dget_type(dset), H5Tclose, path, "H5Dget_type", Code::kCorruption));
    if (H5Tget_size(type.get()) != DTypeSize(dtype)) return CorruptionError(path + ": element size differs");
    return CheckExternal(dcpl.get(), shard, path);
  }
  PTC_ASSIGN_OR_RETURN(Hid type, Check(H5Dget_type(dset), H5Tclose, path, "H5Dget_type", Code::kCorruption));
  if (H5Tget_size(type.get()) != DTypeSize(dtype)) {
    return CorruptionError(path + ": element size " + std::to_string(H5Tget_size(type.get())) +
                           " != " + std::to_string(DTypeSize(dtype)) + " of " + std::string(DTypeName(dtype)));
  }
  const uint64_t size = H5Dget_storage_size(dset);
  if (size != shard.nbytes) {
    return CorruptionError(path + ": dataset holds " + std::to_string(size) + " bytes, manifest says " +
                           std::to_string(shard.nbytes));
  }
  if (shard.nbytes > 0) {
    haddr_t addr = H5Dget_offset(dset);
    if (addr == HADDR_UNDEF || addr != shard.offset) {
      return CorruptionError(path + ": dataset offset " + (addr == HADDR_UNDEF ? "undefined" : std::to_string(addr)) +
                             ", manifest says " + std::to_string(shard.offset));
    }
  }
  return Status::OK();
}

Status CheckAttribute(hid_t dset, const char* name, const std::string& expect, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::string got, ReadStringAttribute(dset, name, path));
  if (got != expect) {
    return CorruptionError(path + ": attribute '" + name + "' is '" + got + "', manifest says '" + expect + "'");
  }
  return Status::OK();
}

}  // namespace

Status CheckH5Shard(const std::string& path, const ShardRecord& shard, DType dtype) {
  DisableHdf5ErrorPrinting();
  // HDF5 opens the path itself, blocking on a FIFO: a regular file only.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(path + ": shard file of tensor '" + shard.tensor + "'", errno);
  if (!S_ISREG(st.st_mode)) return NotRegularFileError(path, st.st_mode);
  PTC_ASSIGN_OR_RETURN(Hid file, Check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, path, "H5Fopen",
                                       Code::kCorruption));
  PTC_ASSIGN_OR_RETURN(Hid dset, Check(H5Dopen2(file.get(), "data", H5P_DEFAULT), H5Dclose, path,
                                       "open of dataset 'data'", Code::kCorruption));
  PTC_RETURN_IF_ERROR(CheckLayout(dset.get(), shard, dtype, path));
  PTC_RETURN_IF_ERROR(CheckAttribute(dset.get(), "tensor", shard.tensor, path));
  PTC_RETURN_IF_ERROR(CheckAttribute(dset.get(), "dtype", std::string(DTypeName(dtype)), path));
  return CheckAttribute(dset.get(), "boxes", BoxesToJson(shard.boxes).dump(), path);
}

}  // namespace ptc
