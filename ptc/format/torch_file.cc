#include "ptc/format/torch_file.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include "ptc/base/crc32.h"

namespace ptc {
namespace {

constexpr uint64_t kGatherSpanLimit = 64ull << 20;
constexpr std::string_view kVersion = "3\n";
constexpr std::string_view kByteOrder = "little";

std::string TensorWhere(const std::string& what, const std::string& path) {
  return what + ": tensor '" + (path.empty() ? std::string("<root>") : path) + "'";
}

std::string IntsText(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

// The checks shared by reading and planning: shape and stride agree, the
// byte count fits 64 bits, and the view lies inside a storage of `numel`.
Status CheckTensor(const pickle::Tensor& t, uint64_t numel, const std::string& where) {
  if (t.shape.size() != t.stride.size())
    return InvalidArgumentError(where + " has " + std::to_string(t.shape.size()) + " dimensions but " +
                                std::to_string(t.stride.size()) + " strides");
  if (t.storage_offset < 0) return InvalidArgumentError(where + " has a negative storage offset");
  uint64_t elems = 1, extent = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] < 0 || t.stride[d] < 0)
      return InvalidArgumentError(where + " has a negative size or stride in dimension " + std::to_string(d));
    const uint64_t n = static_cast<uint64_t>(t.shape[d]);
    uint64_t reach = 0;
    if (__builtin_mul_overflow(elems, n, &elems) ||
        (n > 0 && (__builtin_mul_overflow(n - 1, static_cast<uint64_t>(t.stride[d]), &reach) ||
                   __builtin_add_overflow(extent, reach, &extent))))
      return InvalidArgumentError(where + " has more elements than 64 bits count");
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(elems, DTypeSize(t.dtype), &bytes))
    return InvalidArgumentError(where + " has more bytes than 64 bits count");
  if (elems == 0) extent = 0;
  uint64_t end;
  if (__builtin_add_overflow(static_cast<uint64_t>(t.storage_offset), extent, &end) || end > numel)
    return InvalidArgumentError(where + " (offset " + std::to_string(t.storage_offset) + ", shape " +
                                IntsText(t.shape) + ", stride " + IntsText(t.stride) + ") needs " +
                                std::to_string(t.storage_offset) + " + " + std::to_string(extent) +
                                " elements of storage '" + t.storage_key + "', which has " + std::to_string(numel));
  return Status::OK();
}

Result<std::string> ReadMember(const RandomAccessFile& file, const ZipEntry& e, const std::string& what) {
  std::string s(e.size, '\0');
  PTC_RETURN_IF_ERROR(file.Read(e.data_offset, s.size(), s.data()), what + ": member '" + e.name + "'");
  return s;
}

// The storages the tensors of `root` reference, checked against the members.
Result<std::vector<TorchStorage>> CollectStorages(const pickle::Value& root, const ZipArchive& zip,
                                                  const std::string& archive, const std::string& what) {
  std::map<std::string, TorchStorage> by_key;
  std::unordered_map<std::string_view, const ZipEntry*> members;  // by name: a file may hold 100,000 storages
  for (const ZipEntry& e : zip.members) members.emplace(e.name, &e);
  Status status;
  pickle::ForEachTensor(root, [&](const std::string& path, const pickle::Tensor& t) {
    if (!status.ok()) return;
    const std::string where = TensorWhere(what, path);
    auto it = by_key.find(t.storage_key);
    if (it == by_key.end()) {
      const std::string name = archive + "/data/" + t.storage_key;
      const auto found = members.find(name);
      const ZipEntry* e = found == members.end() ? nullptr : found->second;
      if (!e) {
        status = InvalidArgumentError(where + " references storage '" + t.storage_key + "' but there is no member '" +
                                      name + "'");
        return;
      }
      uint64_t bytes;
      if (__builtin_mul_overflow(t.storage_numel, DTypeSize(t.dtype), &bytes) || bytes != e->size) {
        status = InvalidArgumentError(what + ": storage '" + t.storage_key + "' (" + std::string(DTypeName(t.dtype)) +
                                      " x " + std::to_string(t.storage_numel) + " elements, referenced by tensor '" +
                                      path + "') needs " + std::to_string(t.storage_numel) + " x " +
                                      std::to_string(DTypeSize(t.dtype)) + " bytes but member '" + name + "' has " +
                                      std::to_string(e->size));
        return;
      }
      it = by_key.emplace(t.storage_key, TorchStorage{t.storage_key, t.dtype, t.storage_numel, *e}).first;
    } else if (it->second.dtype != t.dtype || it->second.numel != t.storage_numel) {
      status =
          InvalidArgumentError(where + " views storage '" + t.storage_key + "' as " + std::string(DTypeName(t.dtype)) +
                               " x " + std::to_string(t.storage_numel) + ", another tensor as " +
                               std::string(DTypeName(it->second.dtype)) + " x " + std::to_string(it->second.numel));
      return;
    }
    status = CheckTensor(t, it->second.numel, where);
  });
  PTC_RETURN_IF_ERROR(status);
  std::vector<TorchStorage> out;
  for (auto& [key, s] : by_key) out.push_back(std::move(s));
  std::sort(out.begin(), out.end(),
            [](const TorchStorage& a, const TorchStorage& b) { return a.member.data_offset < b.member.data_offset; });
  return out;
}

}  // namespace

const TorchStorage* TorchFile::FindStorage(std::string_view key) const {
  if (storage_index.size() == storages.size()) {
    const auto found = storage_index.find(key);
    return found == storage_index.end() ? nullptr : &storages[found->second];
  }
  for (const TorchStorage& s : storages) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

Result<TorchFile> ReadTorchFile(const RandomAccessFile& file, const std::string& what) {
  TorchFile tf;
  PTC_ASSIGN_OR_RETURN(tf.zip, ReadZipDirectory(file, what));
  if (tf.zip.members.empty()) return InvalidArgumentError(what + ": not a torch file: the zip archive is empty");
  const std::string& first = tf.zip.members.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0)
    return InvalidArgumentError(what + ": not a torch file: member '" + first + "' is not under an archive directory");
  tf.archive = first.substr(0, slash);
  const std::string pkl_name = tf.archive + "/data.pkl";
  const ZipEntry* pkl = tf.zip.Find(pkl_name);
  if (!pkl) return InvalidArgumentError(what + ": not a torch file: no member '" + pkl_name + "'");
  if (pkl->size > kMaxTorchPickleSize)
    return InvalidArgumentError(what + ": member '" + pkl_name + "' of " + std::to_string(pkl->size) +
                                " bytes exceeds the limit of " + std::to_string(kMaxTorchPickleSize));
  if (const ZipEntry* bo = tf.zip.Find(tf.archive + "/byteorder")) {
    if (bo->size > 16) return InvalidArgumentError(what + ": member '" + bo->name + "' is not 'little' or 'big'");
    PTC_ASSIGN_OR_RETURN(std::string order, ReadMember(file, *bo, what));
    if (order != kByteOrder)
      return InvalidArgumentError(what + ": byte order '" + order + "' (member '" + bo->name +
                                  "'); ptcfs reads little-endian torch files only");
  }
  PTC_ASSIGN_OR_RETURN(std::string data, ReadMember(file, *pkl, what));
  PTC_ASSIGN_OR_RETURN(tf.root, pickle::Unpickle(data, what + ": " + pkl_name));
  PTC_ASSIGN_OR_RETURN(tf.storages, CollectStorages(tf.root, tf.zip, tf.archive, what));
  for (size_t i = 0; i < tf.storages.size(); ++i) tf.storage_index.emplace(tf.storages[i].key, i);
  return tf;
}

uint64_t TensorNumElements(const pickle::Tensor& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorNumBytes(const pickle::Tensor& t) { return TensorNumElements(t) * DTypeSize(t.dtype); }

bool IsContiguous(const pickle::Tensor& t) {
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] == 0) return true;
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

Status ReadTensorData(const RandomAccessFile& file, const TorchFile& tf, const pickle::Tensor& t, void* dst,
                      const std::string& what) {
  const TorchStorage* s = tf.FindStorage(t.storage_key);
  if (!s) return NotFoundError(what + ": no storage '" + t.storage_key + "'");
  if (s->dtype != t.dtype || s->numel != t.storage_numel)
    return InvalidArgumentError(what + ": a tensor views storage '" + t.storage_key + "' as " +
                                std::string(DTypeName(t.dtype)) + " x " + std::to_string(t.storage_numel) +
                                ", the file has " + std::string(DTypeName(s->dtype)) + " x " +
                                std::to_string(s->numel));
  PTC_RETURN_IF_ERROR(CheckTensor(t, s->numel, what + ": a tensor"));
  const uint64_t es = DTypeSize(t.dtype);
  const uint64_t nbytes = TensorNumBytes(t);
  if (nbytes == 0) return Status::OK();
  const uint64_t base = s->member.data_offset + static_cast<uint64_t>(t.storage_offset) * es;
  const std::string context = what + ": storage '" + t.storage_key + "'";
  if (IsContiguous(t)) return file.Read(base, nbytes, dst).WithContext(context);

  // The innermost dims that are contiguous form runs of `run` elements.
  size_t k = t.shape.size();
  uint64_t run = 1;
  while (k > 0 && (t.shape[k - 1] == 1 || static_cast<uint64_t>(t.stride[k - 1]) == run)) {
    run *= static_cast<uint64_t>(t.shape[k - 1]);
    --k;
  }
  uint64_t span = 1;  // elements from the first to the last one of the view
  for (size_t d = 0; d < t.shape.size(); ++d) span += static_cast<uint64_t>(t.shape[d] - 1) * t.stride[d];
  std::string buf;
  if (span * es <= kGatherSpanLimit) {
    buf.resize(span * es);
    PTC_RETURN_IF_ERROR(file.Read(base, buf.size(), buf.data()), context);
  }
  const uint64_t run_bytes = run * es;
  std::vector<int64_t> index(k, 0);
  char* out = static_cast<char*>(dst);
  for (uint64_t done = 0; done < nbytes; done += run_bytes) {
    uint64_t off = 0;  // elements from the view's first element
    for (size_t d = 0; d < k; ++d) off += static_cast<uint64_t>(index[d]) * t.stride[d];
    if (!buf.empty()) {
      std::memcpy(out, buf.data() + off * es, run_bytes);
    } else {
      PTC_RETURN_IF_ERROR(file.Read(base + off * es, run_bytes, out), context);
    }
    out += run_bytes;
    for (size_t d = k; d-- > 0;) {  // odometer over the outer dims
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return Status::OK();
}

Result<std::string> ReadTensorBytes(const RandomAccessFile& file, const TorchFile& tf, const pickle::Tensor& t,
                                    const std::string& what) {
  std::string out(TensorNumBytes(t), '\0');
  PTC_RETURN_IF_ERROR(ReadTensorData(file, tf, t, out.data(), what));
  return out;
}

Status VerifyTorchFileCrcs(const RandomAccessFile& file, const TorchFile& tf, const std::string& what) {
  const std::unique_ptr<char[]> buf(new char[kCrcChunk]);  // one for every member
  for (const ZipEntry& e : tf.zip.members) PTC_RETURN_IF_ERROR(VerifyMemberCrc(file, e, what, buf.get()));
  return Status::OK();
}

Result<TorchFilePlan> PlanTorchFile(const std::string& archive, const pickle::Value& root,
                                    const std::vector<TorchStorageSpec>& storages) {
  if (archive.empty() || archive.find('/') != std::string::npos)
    return InvalidArgumentError("torch archive name '" + archive + "' is empty or contains '/'");
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < storages.size(); ++i) {
    const TorchStorageSpec& s = storages[i];
    if (s.key.empty() || s.key.find('/') != std::string::npos)
      return InvalidArgumentError(archive + ": storage key '" + s.key + "' is empty or contains '/'");
    if (!by_key.emplace(s.key, i).second)
      return InvalidArgumentError(archive + ": storage key '" + s.key + "' repeats");
    uint64_t bytes;
    if (__builtin_mul_overflow(s.numel, DTypeSize(s.dtype), &bytes))
      return InvalidArgumentError(archive + ": storage '" + s.key + "' has more bytes than 64 bits count");
  }
  Status status;
  pickle::ForEachTensor(root, [&](const std::string& path, const pickle::Tensor& t) {
    if (!status.ok()) return;
    const std::string where = TensorWhere(archive, path);
    auto it = by_key.find(t.storage_key);
    if (it == by_key.end()) {
      status = InvalidArgumentError(where + " references storage '" + t.storage_key + "', which is not listed");
      return;
    }
    const TorchStorageSpec& s = storages[it->second];
    if (s.dtype != t.dtype || s.numel != t.storage_numel) {
      status =
          InvalidArgumentError(where + " views storage '" + t.storage_key + "' as " + std::string(DTypeName(t.dtype)) +
                               " x " + std::to_string(t.storage_numel) + " but it is listed as " +
                               std::string(DTypeName(s.dtype)) + " x " + std::to_string(s.numel));
      return;
    }
    status = CheckTensor(t, s.numel, where);
  });
  PTC_RETURN_IF_ERROR(status);

  TorchFilePlan plan;
  plan.archive = archive;
  auto literal = [&](const std::string& name, std::string bytes) {
    plan.members.push_back(ZipMember{archive + "/" + name, bytes.size(), Crc32(0, bytes.data(), bytes.size())});
    plan.contents.push_back(std::move(bytes));
    plan.member_storage.push_back(-1);
  };
  literal("data.pkl", pickle::Pickle(root));
  literal("byteorder", std::string(kByteOrder));
  for (size_t i = 0; i < storages.size(); ++i) {
    const TorchStorageSpec& s = storages[i];
    plan.storage_members.push_back(plan.members.size());
    plan.members.push_back(ZipMember{archive + "/data/" + s.key, s.numel * DTypeSize(s.dtype), s.crc32});
    plan.contents.emplace_back();
    plan.member_storage.push_back(static_cast<int64_t>(i));
  }
  literal("version", std::string(kVersion));
  return plan;
}

Result<ZipLayout> LayoutTorchFile(const TorchFilePlan& plan) { return PlanZip(plan.members); }

ZipDataReader TorchMemberReader(const TorchFilePlan& plan, TorchStorageReader read) {
  return [&plan, read = std::move(read)](size_t member, uint64_t offset, size_t n, void* dst) -> Status {
    if (member >= plan.members.size() || offset > plan.members[member].size || n > plan.members[member].size - offset)
      return InvalidArgumentError("torch file range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                  ") is outside member " + std::to_string(member));
    const int64_t storage = plan.member_storage[member];
    if (storage >= 0) return read(static_cast<size_t>(storage), offset, n, dst);
    std::memcpy(dst, plan.contents[member].data() + offset, n);
    return Status::OK();
  };
}

Status WriteTorchFile(WritableFile& out, const std::string& archive, const pickle::Value& root,
                      const std::vector<TorchStorageSpec>& storages, const TorchStorageReader& read,
                      const std::string& what) {
  PTC_ASSIGN_OR_RETURN(TorchFilePlan plan, PlanTorchFile(archive, root, storages), what);
  return WriteZip(out, plan.members, TorchMemberReader(plan, read), what).status();
}

}  // namespace ptc
