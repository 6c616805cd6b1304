#include "cluster/s3/s3_env.h"

#include <algorithm>
#include <future>
#include <set>

namespace ptc::cluster::s3 {
namespace {

Status Unimplemented(const std::string& what) { return Status(Code::kUnimplemented, what + ": not on an S3 bucket"); }

class S3File final : public RandomAccessFile {
 public:
  S3File(std::shared_ptr<const S3Client> client, std::string bucket, std::string key, uint64_t size)
      : client_(std::move(client)), bucket_(std::move(bucket)), key_(std::move(key)), size_(size),
        path_("s3://" + bucket_ + "/" + key_) {}
  Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset + n > size_) {
      return CorruptionError(path_ + ": ends at byte " + std::to_string(size_) + ", before " + std::to_string(offset + n));
    }
    return client_->GetRange(bucket_, key_, offset, n, static_cast<char*>(dst));
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }
  Status Stream(uint64_t offset, uint64_t n, const std::function<Status(uint64_t, const char*, size_t)>& sink) const {
    if (offset + n > size_) {
      return CorruptionError(path_ + ": ends at byte " + std::to_string(size_) + ", before " + std::to_string(offset + n));
    }
    return client_->GetRangeTo(bucket_, key_, offset, n, sink);
  }

 private:
  const std::shared_ptr<const S3Client> client_;
  const std::string bucket_, key_;
  const uint64_t size_;
  const std::string path_;
};

class S3Writer final : public WritableFile {
 public:
  S3Writer(std::shared_ptr<const S3Client> client, std::string bucket, std::string key, S3EnvOptions options)
      : client_(std::move(client)), bucket_(std::move(bucket)), key_(std::move(key)), options_(options) {
    buffer_.reserve(options_.part_bytes);
  }
  ~S3Writer() override {
    if (closed_) return;
    for (auto& f : inflight_) (void)f.first.get();
    if (!upload_.empty()) (void)client_->AbortMultipart(bucket_, key_, upload_);
  }

  Status Append(const void* data, size_t n) override {
    if (!error_.ok()) return error_;
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t take = std::min<size_t>(n, options_.part_bytes - buffer_.size());
      buffer_.append(p, take);
      p += take;
      n -= take;
      if (buffer_.size() == options_.part_bytes) {
        if (Status s = SendPart(); !s.ok()) return error_ = s;
      }
    }
    return Status::OK();
  }
  Status PWrite(uint64_t, const void*, size_t) override { return Unimplemented("PWrite s3://" + bucket_ + "/" + key_); }
  Status Sync() override { return error_; }  // the object is durable once Close completes it
  Status Close() override {
    if (closed_) return error_;
    closed_ = true;
    if (error_.ok() && upload_.empty()) {
      error_ = client_->Put(bucket_, key_, buffer_);
    } else if (error_.ok()) {
      if (!buffer_.empty()) error_ = SendPart();
      error_ = Join(error_);
      if (error_.ok()) error_ = client_->CompleteMultipart(bucket_, key_, upload_, etags_);
    } else {
      (void)Join(error_);
    }
    if (!error_.ok() && !upload_.empty()) (void)client_->AbortMultipart(bucket_, key_, upload_);
    upload_.clear();
    buffer_ = std::string();
    free_.clear();
    return error_;
  }

 private:
  // Uploads the buffer as the next part, on a thread of its own once fewer
  // than `parallel` are in flight.
  Status SendPart() {
    if (upload_.empty()) {
      PTC_ASSIGN_OR_RETURN(upload_, client_->CreateMultipart(bucket_, key_));
    }
    while (static_cast<int>(inflight_.size()) >= options_.parallel) PTC_RETURN_IF_ERROR(Collect());
    const int number = static_cast<int>(etags_.size() + inflight_.size()) + 1;
    auto bytes = std::make_shared<std::string>(std::move(buffer_));
    // The next part fills a buffer a sent part left (its pages already
    // faulted in: a new one would cost the kernel a page fault per 4 KiB of
    // every part, CPU the server beside us needs).
    buffer_ = std::string();
    if (!free_.empty()) {
      buffer_ = std::move(free_.back());
      free_.pop_back();
    }
    buffer_.clear();
    buffer_.reserve(options_.part_bytes);
    inflight_.push_back({std::async(std::launch::async, [client = client_, bucket = bucket_, key = key_,
                                                         upload = upload_, number, bytes] {
                           return client->UploadPart(bucket, key, upload, number, *bytes);
                         }),
                         bytes});
    return Status::OK();
  }
  // The oldest part in flight, its ETag taken.
  Status Collect() {
    Result<std::string> etag = inflight_.front().first.get();
    free_.push_back(std::move(*inflight_.front().second));
    inflight_.erase(inflight_.begin());
    PTC_RETURN_IF_ERROR(etag.status());
    etags_.push_back(std::move(*etag));
    return Status::OK();
  }
  Status Join(Status s) {
    while (!inflight_.empty()) {
      Status c = Collect();
      if (s.ok()) s = c;
    }
    return s;
  }

  const std::shared_ptr<const S3Client> client_;
  const std::string bucket_, key_;
  const S3EnvOptions options_;
  std::string buffer_;
  std::string upload_;
  std::vector<std::string> etags_;
  // The parts in flight (their uploads, and their bytes), oldest first.
  std::vector<std::pair<std::future<Result<std::string>>, std::shared_ptr<std::string>>> inflight_;
  std::vector<std::string> free_;  // buffers of sent parts, for the next ones
  Status error_;
  bool closed_ = false;
};

class S3Env final : public Env {
 public:
  S3Env(std::shared_ptr<const S3Client> client, std::string bucket, S3EnvOptions options)
      : client_(std::move(client)), bucket_(std::move(bucket)), options_(options) {}

  Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) override {
    PTC_ASSIGN_OR_RETURN(std::optional<uint64_t> size, client_->Head(bucket_, Key(path)));
    if (!size) return NotFoundError(Name(path) + ": no such object");
    return std::unique_ptr<RandomAccessFile>(std::make_unique<S3File>(client_, bucket_, Key(path), *size));
  }
  Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) override {
    return std::unique_ptr<WritableFile>(std::make_unique<S3Writer>(client_, bucket_, Key(path), options_));
  }
  Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) override {
    return Unimplemented("OpenExisting " + Name(path));
  }
  bool Exists(const std::string& path) override {
    auto size = client_->Head(bucket_, Key(path));
    return size.ok() && size->has_value();
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    PTC_ASSIGN_OR_RETURN(std::optional<uint64_t> size, client_->Head(bucket_, Key(path)));
    if (!size) return NotFoundError(Name(path) + ": no such object");
    return *size;
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    const std::string prefix = Dir(path);
    PTC_ASSIGN_OR_RETURN(S3Client::Listing l, client_->List(bucket_, prefix, "/"));
    std::set<std::string> names;
    for (const std::string& k : l.keys) names.insert(k.substr(prefix.size()));
    for (const std::string& p : l.prefixes) names.insert(p.substr(prefix.size(), p.size() - prefix.size() - 1));
    names.erase("");
    return std::vector<std::string>(names.begin(), names.end());
  }
  Status CreateDirs(const std::string&) override { return Status::OK(); }
  Status Rename(const std::string& from, const std::string& to) override {
    PTC_RETURN_IF_ERROR(client_->Copy(bucket_, Key(from), Key(to)));
    return client_->Delete(bucket_, Key(from));
  }
  Status Link(const std::string& from, const std::string& to) override {
    return client_->Copy(bucket_, Key(from), Key(to));
  }
  Status Remove(const std::string& path) override { return client_->Delete(bucket_, Key(path)); }
  Status RemoveTree(const std::string& path) override {
    PTC_ASSIGN_OR_RETURN(S3Client::Listing l, client_->List(bucket_, Dir(path), ""));
    for (const std::string& k : l.keys) PTC_RETURN_IF_ERROR(client_->Delete(bucket_, k));
    return client_->Delete(bucket_, Key(path));
  }
  Status SyncDir(const std::string&) override { return Status::OK(); }
  Status SyncFileSystem(const std::string&) override { return Status::OK(); }
  bool IsDirectory(const std::string& path) override {
    auto l = client_->List(bucket_, Dir(path), "/");
    return l.ok() && (!l->keys.empty() || !l->prefixes.empty());
  }
  Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) override {
    return Unimplemented("OpenOutputDir " + Name(path));
  }

 private:
  // Keys have no leading '/'.
  static std::string Key(const std::string& path) {
    size_t b = 0;
    while (b < path.size() && path[b] == '/') ++b;
    return path.substr(b);
  }
  static std::string Dir(const std::string& path) {
    std::string k = Key(path);
    if (!k.empty() && !k.ends_with('/')) k += '/';
    return k;
  }
  std::string Name(const std::string& path) const { return "s3://" + bucket_ + "/" + Key(path); }

  const std::shared_ptr<const S3Client> client_;
  const std::string bucket_;
  const S3EnvOptions options_;
};

}  // namespace

Status StreamRange(const RandomAccessFile& file, uint64_t offset, uint64_t n,
                   const std::function<Status(uint64_t, const char*, size_t)>& sink) {
  const auto* s3 = dynamic_cast<const S3File*>(&file);
  if (s3 == nullptr) return Unimplemented("streaming " + file.path());
  return s3->Stream(offset, n, sink);
}

std::unique_ptr<Env> NewS3Env(std::shared_ptr<const S3Client> client, std::string bucket, S3EnvOptions options) {
  return std::make_unique<S3Env>(std::move(client), std::move(bucket), options);
}

}  // namespace ptc::cluster::s3
