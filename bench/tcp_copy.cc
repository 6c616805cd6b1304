// tcp_copy: the physical floor for moving shard bytes between workers: plain
// files over TCP connections, no protocol, no checksums, no page mapping.
// A transfer between ptcfs workers is measured against this.
//
//   tcp_copy serve --listen ADDR:PORT [--pread] [--connections K] [--chunk BYTES] FILE...
//       accepts K connections (1), sends the files over them cut in chunks of
//       BYTES (16 MiB, the pull's span; 0: whole files), each connection
//       taking the next chunk when it has sent one (sendfile, or with --pread
//       pread into one reused 1 MiB buffer per connection and send), then exits.
//   tcp_copy fetch --from ADDR:PORT --out DIR [--sync] [--connections K]
//       receives them over K connections (as many as the server takes) into
//       DIR/<basename> with pwrite() from one reused 1 MiB buffer per
//       connection; --sync fsyncs each file and DIR once everything is in.
//       Prints one JSON line: {"bytes":N,"seconds":S,"files":F,"connections":K}
//       (from the first connect to the last fsync). Retries each connect for
//       10 s, so it may start before serve.
//
// Wire format, per chunk: u32 name length, the name (a basename), u64 offset
// in the file, u64 size (all big-endian), then the bytes; a name length of 0
// ends a connection's stream.
// ADDR is an IPv4 address. Errors name the path at fault; exit code 1.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBuffer = 1 << 20;

[[noreturn]] void Fail(const std::string& what, int err = 0) {
  std::fprintf(stderr, "tcp_copy: %s%s%s\n", what.c_str(), err ? ": " : "", err ? std::strerror(err) : "");
  std::exit(1);
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: tcp_copy serve --listen ADDR:PORT [--pread] [--connections K] [--chunk BYTES] FILE...\n"
               "       tcp_copy fetch --from ADDR:PORT --out DIR [--sync] [--connections K]\n");
  std::exit(2);
}

sockaddr_in ParseAddr(const std::string& s) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const size_t colon = s.rfind(':');
  const int port = colon == std::string::npos ? -1 : std::atoi(s.c_str() + colon + 1);
  if (port <= 0 || port > 65535 || inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    Fail("bad address " + s + " (want IPV4:PORT)");
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

void SendAll(int sock, const void* data, size_t n, const std::string& what) {
  for (const char* p = static_cast<const char*>(data); n > 0;) {
    const ssize_t w = send(sock, p, n, 0);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) Fail("send " + what, errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Fills data[0, n) from the socket; false on a clean end of stream before the first byte.
bool RecvAll(int sock, void* data, size_t n, const std::string& what) {
  for (size_t got = 0; got < n;) {
    const ssize_t r = recv(sock, static_cast<char*>(data) + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fail("receive " + what, errno);
    if (r == 0) {
      if (got == 0) return false;
      Fail("connection closed in the middle of " + what);
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

struct Source {
  std::string path, name;
  int fd;
  uint64_t size;
};

struct Chunk {
  const Source* file;
  uint64_t offset, size;
};

// Sends chunks of `chunks` taken in turn (`next`) over `sock`, then the end mark.
void SendChunks(int sock, const std::vector<Chunk>& chunks, std::atomic<size_t>* next, bool use_pread) {
  std::vector<char> buffer(use_pread ? kBuffer : 0);
  for (size_t i; (i = next->fetch_add(1)) < chunks.size();) {
    const Chunk& c = chunks[i];
    const Source& f = *c.file;
    const uint32_t name_len = htobe32(static_cast<uint32_t>(f.name.size()));
    const uint64_t offset = htobe64(c.offset), size = htobe64(c.size);
    SendAll(sock, &name_len, sizeof(name_len), "header of " + f.path);
    SendAll(sock, f.name.data(), f.name.size(), "header of " + f.path);
    SendAll(sock, &offset, sizeof(offset), "header of " + f.path);
    SendAll(sock, &size, sizeof(size), "header of " + f.path);
    for (off_t off = static_cast<off_t>(c.offset); static_cast<uint64_t>(off) < c.offset + c.size;) {
      const size_t want = static_cast<size_t>(c.offset + c.size - static_cast<uint64_t>(off));
      ssize_t n;
      if (use_pread) {
        n = pread(f.fd, buffer.data(), std::min(want, kBuffer), off);
        if (n > 0) SendAll(sock, buffer.data(), static_cast<size_t>(n), f.path);
        if (n > 0) off += n;
      } else {
        n = sendfile(sock, f.fd, &off, std::min<size_t>(want, size_t{1} << 30));
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) Fail((use_pread ? "read " : "sendfile ") + f.path, errno);
      if (n == 0) Fail(f.path + ": shrank while being sent");
    }
  }
  const uint32_t end = 0;
  SendAll(sock, &end, sizeof(end), "end of stream");
  shutdown(sock, SHUT_WR);
  char c;
  while (recv(sock, &c, 1, 0) > 0) {  // until the receiver has closed: it has everything
  }
  close(sock);
}

int Serve(const std::string& listen_at, const std::vector<std::string>& paths, bool use_pread, int connections,
          uint64_t chunk) {
  std::vector<Source> files;
  std::set<std::string> names;
  for (const std::string& path : paths) {  // all opened first: a bad path fails before anyone connects
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) Fail(path, errno);
    if (!S_ISREG(st.st_mode)) Fail(path + ": not a regular file");
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.empty() || !names.insert(name).second) Fail(path + ": empty or duplicate file name");
    files.push_back({path, name, fd, static_cast<uint64_t>(st.st_size)});
  }
  std::vector<Chunk> chunks;
  for (const Source& f : files) {
    const uint64_t step = chunk == 0 ? std::max<uint64_t>(f.size, 1) : chunk;
    uint64_t at = 0;
    do {
      chunks.push_back({&f, at, std::min(step, f.size - at)});
      at += step;
    } while (at < f.size);
  }
  const sockaddr_in addr = ParseAddr(listen_at);
  const int lsock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lsock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) Fail("bind " + listen_at, errno);
  if (listen(lsock, connections) != 0) Fail("listen " + listen_at, errno);
  std::vector<int> socks;
  for (int k = 0; k < connections; ++k) {
    const int sock = accept4(lsock, nullptr, nullptr, SOCK_CLOEXEC);
    if (sock < 0) Fail("accept on " + listen_at, errno);
    socks.push_back(sock);
  }
  close(lsock);
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int sock : socks) threads.emplace_back(SendChunks, sock, std::cref(chunks), &next, use_pread);
  for (std::thread& t : threads) t.join();
  for (const Source& f : files) close(f.fd);
  return 0;
}

// The files being received, shared by the connections.
class Outputs {
 public:
  Outputs(int dir, std::string out) : dir_(dir), out_(std::move(out)) {}
  int Open(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fds_.find(name);
    if (it != fds_.end()) return it->second;
    const int fd = openat(dir_, name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Fail(out_ + "/" + name, errno);
    fds_[name] = fd;
    return fd;
  }
  // Closes every file (fsync'd first with `sync`); the number of files.
  uint64_t Close(bool sync) {
    for (const auto& [name, fd] : fds_) {
      if (sync && fsync(fd) != 0) Fail("fsync " + out_ + "/" + name, errno);
      if (close(fd) != 0) Fail("close " + out_ + "/" + name, errno);
    }
    if (sync && fsync(dir_) != 0) Fail("fsync " + out_, errno);
    return fds_.size();
  }

 private:
  const int dir_;
  const std::string out_;
  std::mutex mu_;
  std::map<std::string, int> fds_;
};

int Connect(const sockaddr_in& addr, const std::string& from) {
  for (int attempt = 0;; ++attempt) {
    const int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return sock;
    const int err = errno;
    close(sock);
    if ((err != ECONNREFUSED && err != EINTR) || attempt >= 200) Fail("connect " + from, err);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Receives one connection's chunks into `outputs`; the bytes received.
uint64_t ReceiveChunks(int sock, const std::string& from, const std::string& out, Outputs* outputs) {
  std::vector<char> buffer(kBuffer);
  uint64_t total = 0;
  for (;;) {
    uint32_t name_len = 0;
    if (!RecvAll(sock, &name_len, sizeof(name_len), "a header")) Fail("connection closed before the end mark");
    name_len = be32toh(name_len);
    if (name_len == 0) break;
    if (name_len > 4096) Fail("bad header from " + from + ": name of " + std::to_string(name_len) + " bytes");
    std::string name(name_len, '\0');
    uint64_t offset = 0, size = 0;
    RecvAll(sock, name.data(), name.size(), "a header");
    RecvAll(sock, &offset, sizeof(offset), "the header of " + name);
    RecvAll(sock, &size, sizeof(size), "the header of " + name);
    offset = be64toh(offset);
    size = be64toh(size);
    if (name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
      Fail("refusing file name from " + from + ": " + name);
    }
    const std::string path = out + "/" + name;
    const int fd = outputs->Open(name);
    for (uint64_t left = size; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kBuffer));
      RecvAll(sock, buffer.data(), n, path);
      for (size_t done = 0; done < n;) {
        const ssize_t w = pwrite(fd, buffer.data() + done, n - done, static_cast<off_t>(offset + size - left + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) Fail("write " + path, errno);
        done += static_cast<size_t>(w);
      }
      left -= n;
    }
    total += size;
  }
  close(sock);
  return total;
}

int Fetch(const std::string& from, const std::string& out, bool sync, int connections) {
  const sockaddr_in addr = ParseAddr(from);
  const int dir = open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) Fail(out, errno);
  std::vector<int> socks = {Connect(addr, from)};
  const auto start = std::chrono::steady_clock::now();
  for (int k = 1; k < connections; ++k) socks.push_back(Connect(addr, from));
  Outputs outputs(dir, out);
  std::vector<uint64_t> bytes(socks.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < socks.size(); ++k) {
    threads.emplace_back([&, k] { bytes[k] = ReceiveChunks(socks[k], from, out, &outputs); });
  }
  for (std::thread& t : threads) t.join();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  const uint64_t count = outputs.Close(sync);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(dir);
  std::printf("{\"bytes\":%llu,\"seconds\":%.6f,\"files\":%llu,\"connections\":%d}\n",
              static_cast<unsigned long long>(total), seconds, static_cast<unsigned long long>(count), connections);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a closed peer is an error from send(), not a silent death
  if (argc < 2) Usage();
  const std::string mode = argv[1];
  std::string addr, out;
  std::vector<std::string> files;
  bool sync = false, use_pread = false;
  int connections = 1;
  uint64_t chunk = 16 << 20;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if ((a == "--listen" && mode == "serve") || (a == "--from" && mode == "fetch")) {
      if (!has_value) Usage();
      addr = argv[++i];
    } else if (a == "--out" && mode == "fetch" && has_value) {
      out = argv[++i];
    } else if (a == "--sync" && mode == "fetch") {
      sync = true;
    } else if (a == "--pread" && mode == "serve") {
      use_pread = true;
    } else if (a == "--connections" && has_value) {
      connections = std::atoi(argv[++i]);
      if (connections < 1 || connections > 64) Usage();
    } else if (a == "--chunk" && mode == "serve" && has_value) {
      chunk = std::strtoull(argv[++i], nullptr, 10);
    } else if (mode == "serve" && !a.starts_with("--")) {
      files.push_back(a);
    } else {
      Usage();
    }
  }
  if (mode == "serve" && !addr.empty() && !files.empty()) return Serve(addr, files, use_pread, connections, chunk);
  if (mode == "fetch" && !addr.empty() && !out.empty()) return Fetch(addr, out, sync, connections);
  Usage();
}
