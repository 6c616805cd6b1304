// The peer data plane's HTTP server: the head gate accepts and collects
// request heads (head_gate.h), cpp-httplib parses and answers them on a pool
// of workers.
#include "cluster/peer_server.h"

#include <httplib.h>

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <thread>

#include "cluster/connection_stream.h"
#include "cluster/head_gate.h"
#include "cluster/served_files.h"
#include "cluster/token.h"
#include "ptc/base/mutex.h"

namespace ptc::cluster {
namespace {

// Bytes read from the file and written to the socket at a time.
constexpr size_t kStreamChunk = 1 << 20;
// Requests on one kept-alive connection: the last is answered with "Connection:
// close". A kept-alive connection holds no worker between requests (it waits in
// the gate), so the limit only bounds one connection's life: a client's
// connection pool (connection_pool.h) sweeps a shard's spans on one connection.
constexpr int kKeepAliveRequests = 100;
// A kept-alive connection's wait for its next request (as before the gate: cpp-httplib's).
constexpr std::chrono::seconds kKeepAliveTimeout{2};

// cpp-httplib's request handling without its accept loop, whose workers each
// wait on one connection's head (head_gate.h accepts instead).
// process_request is protected.
class HttpCore : public httplib::Server {
 public:
  // Reads one request from `strm`, routes it and writes the response; false
  // when the connection cannot carry another request.
  bool Process(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, nullptr);
  }
  // cpp-httplib cuts a response's body short once svr_sock_, its listening
  // socket (never opened here), is INVALID_SOCKET: its sign of shutting down.
  // Any other value reads as running; nothing here passes it to a system call
  // (stop(), which would, is never called).
  void SetRunning(bool running) { svr_sock_ = running ? 0 : INVALID_SOCKET; }
};

int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case Code::kNotFound:
      return 404;
    case Code::kInvalidArgument:
      return 416;
    default:
      return 500;
  }
}

// One response's source: a range of an open shard file.
// A response's bytes: sent from a read-only mapping of the range when the
// file has a descriptor (one copy, into the socket), else read in chunks into
// `buf` first. Shard files are immutable: a mapped file is never truncated.
struct RangeStream {
  std::unique_ptr<RandomAccessFile> file;
  uint64_t offset = 0;
  std::vector<char> buf;
  void* map = nullptr;
  size_t map_len = 0;
  const char* mapped = nullptr;  // the range's first byte in `map`
  ~RangeStream() {
    if (map != nullptr) ::munmap(map, map_len);
  }
  void Map(uint64_t length) {
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (file->fd() < 0) return;
    const uint64_t begin = offset / page * page;
    void* p = ::mmap(nullptr, offset + length - begin, PROT_READ, MAP_SHARED, file->fd(), static_cast<off_t>(begin));
    if (p == MAP_FAILED) return;
    ::madvise(p, offset + length - begin, MADV_SEQUENTIAL);
    map = p;
    map_len = offset + length - begin;
    mapped = static_cast<const char*>(p) + (offset - begin);
  }
};

}  // namespace

struct PeerServer::Impl {
  Impl(const Store* s, PeerServerOptions o) : store(s), options(std::move(o)) {}
  ~Impl() { Stop(); }

  void Install();
  Status Bind();
  void Stop() EXCLUDES(stop_mu);
  // Answers the request whose head `c` holds (on a worker), then returns the
  // connection to the gate or closes it.
  void Serve(ReadyConnection c);

  // Answers `status` with a one-line reason.
  void Refuse(httplib::Response& res, int status, const std::string& message) {
    refused.fetch_add(1, std::memory_order_relaxed);
    res.status = status;
    res.set_content("ptcfs peer: " + message + "\n", "text/plain");
  }
  httplib::Server::HandlerResponse Authorize(const httplib::Request& req, httplib::Response& res);
  void ServeShard(const httplib::Request& req, httplib::Response& res);
  void ServeManifest(const httplib::Request& req, httplib::Response& res) EXCLUDES(mu);
  void ServePublished(const httplib::Request& req, httplib::Response& res) EXCLUDES(mu);
  // The generations served now: the store's current one, then the kept ones, then
  // (with_part) this worker's part of a change past them.
  std::vector<std::shared_ptr<const GenerationManifest>> Generations(bool with_part = true) EXCLUDES(mu);
  // Their index.
  std::shared_ptr<const ServedFiles> Served() EXCLUDES(mu);

  const Store* const store;
  const PeerServerOptions options;
  PeerAddress bound;
  HttpCore http;
  // Stop order: stopping, then the gate (no more connections handed on),
  // then the pool (joins the requests in progress).
  std::atomic<bool> stopping{false};
  std::unique_ptr<httplib::ThreadPool> pool;
  std::unique_ptr<HeadGate> gate;

  Mutex mu;
  std::vector<std::shared_ptr<const GenerationManifest>> kept GUARDED_BY(mu);
  std::shared_ptr<const GenerationManifest> part GUARDED_BY(mu);
  std::shared_ptr<const ServedFiles> served GUARDED_BY(mu);
  std::vector<std::shared_ptr<const GenerationManifest>> served_from GUARDED_BY(mu);  // what `served` indexes
  std::map<std::string, std::shared_ptr<const std::string>> published GUARDED_BY(mu);

  Mutex stop_mu;
  bool stopped GUARDED_BY(stop_mu) = false;

  std::atomic<uint64_t> served_count{0}, refused{0}, files_opened{0}, bytes_sent{0};
};

std::vector<std::shared_ptr<const GenerationManifest>> PeerServer::Impl::Generations(bool with_part) {
  std::vector<std::shared_ptr<const GenerationManifest>> all = {store->CurrentSnapshot()};
  MutexLock lock(&mu);
  all.insert(all.end(), kept.begin(), kept.end());
  if (with_part && part != nullptr && (all.front() == nullptr || part->generation > all.front()->generation)) {
    all.push_back(part);
  }
  return all;
}

std::shared_ptr<const ServedFiles> PeerServer::Impl::Served() {
  const std::vector<std::shared_ptr<const GenerationManifest>> all = Generations();
  MutexLock lock(&mu);
  // Keyed by the manifests themselves (held, so no address is reused): a generation's
  // number may name another manifest than before (a part, then the generation
  // committed; an aborted change's part, then the next's).
  if (served == nullptr || served_from != all) {
    served = std::make_shared<const ServedFiles>(all, options.worker);
    served_from = all;
  }
  return served;
}

httplib::Server::HandlerResponse PeerServer::Impl::Authorize(const httplib::Request& req, httplib::Response& res) {
  using R = httplib::Server::HandlerResponse;
  if (!req.has_header("Authorization")) {
    res.set_header("WWW-Authenticate", "Bearer");
    Refuse(res, 401, "missing 'Authorization: Bearer TOKEN'");
    return R::Handled;
  }
  const std::string header = req.get_header_value("Authorization");
  const std::optional<std::string_view> token = ParseBearer(header);
  if (!token) {
    res.set_header("WWW-Authenticate", "Bearer");
    Refuse(res, 401, "malformed Authorization header (expected 'Bearer TOKEN')");
    return R::Handled;
  }
  if (!TokenEquals(*token, options.token)) {
    Refuse(res, 403, "wrong token");
    return R::Handled;
  }
  if (req.has_header("Range")) {
    Refuse(res, 400, "Range headers are not supported: ask with offset and length");
    return R::Handled;
  }
  return R::Unhandled;
}

void PeerServer::Impl::ServeManifest(const httplib::Request& req, httplib::Response& res) {
  const std::string text = req.get_param_value("generation");
  uint64_t g = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), g);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || req.params.size() != 1) {
    return Refuse(res, 400, "expected ?generation=G (a decimal)");
  }
  // A committed generation's manifest only: a part (this worker's pieces of a change it
  // has not applied yet) carries the generation's number but not its tensors, and a
  // worker catching up must ask a worker that has applied it.
  const std::vector<std::shared_ptr<const GenerationManifest>> all = Generations(/*with_part=*/false);
  for (const auto& m : all) {
    if (m != nullptr && m->generation == g) {
      served_count.fetch_add(1, std::memory_order_relaxed);
      res.status = 200;
      res.set_content(EncodeManifest(*m), "application/json");
      return;
    }
  }
  Refuse(res, 404, "generation " + text + " is not served here (this worker is at generation " +
                       std::to_string(all.front() ? all.front()->generation : 0) + ")");
}

void PeerServer::Impl::ServePublished(const httplib::Request& req, httplib::Response& res) {
  if (req.params.size() != 1 || !req.has_param("name")) return Refuse(res, 400, "expected ?name=NAME");
  const std::string name = req.get_param_value("name");
  std::shared_ptr<const std::string> bytes;
  {
    MutexLock lock(&mu);
    if (auto it = published.find(name); it != published.end()) bytes = it->second;
  }
  if (bytes == nullptr) return Refuse(res, 404, "nothing is published as '" + name.substr(0, 256) + "' here");
  served_count.fetch_add(1, std::memory_order_relaxed);
  res.status = 200;
  res.set_content_provider(bytes->size(), "application/octet-stream",
                           [bytes](size_t offset, size_t length, httplib::DataSink& sink) {
                             return sink.write(bytes->data() + offset, std::min(length, kStreamChunk));
                           });
}

void PeerServer::Impl::ServeShard(const httplib::Request& req, httplib::Response& res) {
  Result<ShardRequest> r = ParseShardRequest(req.params);
  if (!r.ok()) return Refuse(res, 400, r.status().message());
  if (r->length > options.max_request_bytes) {
    return Refuse(res, 413,
                  std::to_string(r->length) + " bytes asked, at most " + std::to_string(options.max_request_bytes));
  }
  // The manifests decide before the file system is touched.
  if (Status s = Served()->Check(r->file, r->offset, r->length); !s.ok()) {
    return Refuse(res, HttpStatusOf(s), s.message());
  }
  auto stream = std::make_shared<RangeStream>();
  files_opened.fetch_add(1, std::memory_order_relaxed);
  Result<std::unique_ptr<RandomAccessFile>> file = store->env()->OpenRead(store->AbsPath(r->file));
  if (!file.ok()) {
    return Refuse(res, file.status().code() == Code::kNotFound ? 404 : 500,
                  r->file + ": " + std::string(CodeName(file.status().code())));
  }
  if ((*file)->Size() < r->offset + r->length) {
    return Refuse(res, 500, r->file + ": shorter than its shard record");
  }
  stream->file = std::move(*file);
  stream->offset = r->offset;
  stream->Map(r->length);
  if (stream->mapped == nullptr) stream->buf.resize(static_cast<size_t>(std::min<uint64_t>(r->length, kStreamChunk)));
  served_count.fetch_add(1, std::memory_order_relaxed);
  res.status = 200;
  res.set_content_provider(static_cast<size_t>(r->length), "application/octet-stream",
                           [this, stream](size_t offset, size_t length, httplib::DataSink& sink) {
                             const size_t n = std::min(length, kStreamChunk);
                             // A failed read or write ends the connection: the client sees a short body.
                             const char* p = stream->mapped != nullptr ? stream->mapped + offset : stream->buf.data();
                             if (stream->mapped == nullptr &&
                                 !stream->file->Read(stream->offset + offset, n, stream->buf.data()).ok()) {
                               return false;
                             }
                             if (!sink.write(p, n)) return false;
                             bytes_sent.fetch_add(n, std::memory_order_relaxed);
                             return true;
                           });
}

void PeerServer::Impl::Install() {
  http.set_payload_max_length(4096);
  http.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return Authorize(req, res); });
  http.Get(kShardPath, [this](const httplib::Request& req, httplib::Response& res) { ServeShard(req, res); });
  http.Get(kManifestPath, [this](const httplib::Request& req, httplib::Response& res) { ServeManifest(req, res); });
  http.Get(kPublishedPath, [this](const httplib::Request& req, httplib::Response& res) { ServePublished(req, res); });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) Refuse(res, res.status, "no such endpoint or method (GET " + std::string(kShardPath) + ", " +
                                                  std::string(kManifestPath) + " or " +
                                                  std::string(kPublishedPath) + ")");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    Refuse(res, 500, "internal error");
  });
}

void PeerServer::Impl::Serve(ReadyConnection c) {
  bool keep = false;
  if (!stopping) {
    // The request's body, if any, must follow its head as promptly.
    ConnectionStream strm(c.fd, std::move(c.bytes), std::chrono::steady_clock::now() + options.head_timeout,
                          options.io_timeout);
    const bool last = c.requests + 1 >= kKeepAliveRequests;
    bool closed = false;
    keep = http.Process(strm, last, closed) && !closed && !last && !stopping;
    if (keep) gate->Return(ReadyConnection{c.fd, strm.TakeUnread(), c.requests + 1});
  }
  if (!keep) {
    ::shutdown(c.fd, SHUT_RDWR);
    ::close(c.fd);
  }
}

Status PeerServer::Impl::Bind() {
  http.SetRunning(true);
  pool = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(options.threads));
  HeadGateOptions g;
  g.head_timeout = options.head_timeout;
  g.keep_alive_timeout = kKeepAliveTimeout;
  g.max_waiting = options.max_waiting;
  auto listening = HeadGate::Listen(options.address, options.port, g);
  if (!listening.ok()) return listening.status().WithContext("peer server");
  gate = std::move(*listening);
  bound = PeerAddress{options.address, gate->port()};
  gate->Start([this](ReadyConnection c) { pool->enqueue([this, c] { Serve(c); }); });
  return Status::OK();
}

void PeerServer::Impl::Stop() {
  MutexLock lock(&stop_mu);
  if (stopped) return;
  stopped = true;
  stopping = true;
  if (gate != nullptr) gate->Stop();
  http.SetRunning(false);  // responses in progress end at their next chunk
  if (pool != nullptr) pool->shutdown();
}

PeerServer::PeerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerServer::~PeerServer() { Stop(); }

Result<std::unique_ptr<PeerServer>> PeerServer::Start(const Store* store, PeerServerOptions options) {
  PTC_RETURN_IF_ERROR(ValidateToken(options.token), "peer server");
  if (options.max_request_bytes == 0) return InvalidArgumentError("peer server: max_request_bytes is 0");
  if (options.threads < 1) return InvalidArgumentError("peer server: threads < 1");
  if (options.head_timeout.count() <= 0) return InvalidArgumentError("peer server: head_timeout is not positive");
  if (options.max_waiting < 1) return InvalidArgumentError("peer server: max_waiting < 1");
  auto impl = std::make_unique<Impl>(store, std::move(options));
  impl->Install();
  PTC_RETURN_IF_ERROR(impl->Bind());
  return std::unique_ptr<PeerServer>(new PeerServer(std::move(impl)));
}

PeerAddress PeerServer::address() const { return impl_->bound; }

void PeerServer::SetKeptGenerations(std::vector<std::shared_ptr<const GenerationManifest>> kept) {
  MutexLock lock(&impl_->mu);
  impl_->kept = std::move(kept);
}

void PeerServer::ServePart(std::shared_ptr<const GenerationManifest> part) {
  MutexLock lock(&impl_->mu);
  impl_->part = std::move(part);
}

void PeerServer::Publish(const std::string& name, std::shared_ptr<const std::string> bytes) {
  MutexLock lock(&impl_->mu);
  impl_->published[name] = std::move(bytes);
}

void PeerServer::Withdraw(const std::string& name) {
  MutexLock lock(&impl_->mu);
  impl_->published.erase(name);
}

std::shared_ptr<const std::string> PeerServer::Published(const std::string& name) const {
  MutexLock lock(&impl_->mu);
  auto it = impl_->published.find(name);
  return it == impl_->published.end() ? nullptr : it->second;
}

PeerServerStats PeerServer::stats() const {
  const HeadGateStats gate = impl_->gate->stats();
  return PeerServerStats{impl_->served_count.load(), impl_->refused.load(), impl_->files_opened.load(),
                         impl_->bytes_sent.load(), gate.head_timeouts, gate.evicted};
}

void PeerServer::Stop() { impl_->Stop(); }

}  // namespace ptc::cluster
