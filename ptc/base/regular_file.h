// Inputs that must be regular files, opened without ever blocking.
//
// open(2) of a FIFO for reading waits for a writer, forever when there is
// none; a device may wait or have side effects. A shard, a rank file, a
// schema or a token file planted as one would hang the command (and, in the
// mount, every reader waiting behind it). So inputs are opened O_NONBLOCK
// (which returns at once for a FIFO), checked with fstat, and refused unless
// they are regular files; O_NONBLOCK is then cleared, so reads of a regular
// file behave as ever.
//
// Thread safety: plain functions of the path, safe from any thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc {

// What kind of file `mode` (st_mode) says: "a FIFO", "a directory",
// "a character device", "a block device", "a socket", "a symbolic link",
// "a regular file", or "an unknown file type".
std::string_view FileTypeName(mode_t mode);

// The error for an input at `path` of type `mode` that is not a regular
// file: IOError "PATH: not a regular file (a FIFO)".
Status NotRegularFileError(const std::string& path, mode_t mode);

// Opens `path` with `flags` (O_CLOEXEC is added; O_CREAT makes a file of
// mode 0644) without blocking, and returns the descriptor of a regular file,
// with O_NONBLOCK cleared. Symbolic links are followed unless flags say O_NOFOLLOW.
// \error NotFound when `path` does not exist; IOError "PATH: not a regular
//        file (a FIFO)" for any other type (the descriptor is closed);
//        IOError from the OS, "PATH: WHAT: strerror" ("PATH: strerror" when
//        `what` is empty).
Result<int> OpenRegularFile(const std::string& path, int flags, std::string_view what = "open for reading");

// The whole content of the regular file at `path`, read to its end (not to
// the size fstat reports, which is 0 for many kernel files). At most
// `max_bytes`; more is an error.
// \error as OpenRegularFile; IOError naming the path when a read fails or
//        the file holds more than `max_bytes`.
Result<std::string> ReadRegularFile(const std::string& path, size_t max_bytes = size_t{64} << 20);

// The bytes of the open descriptor `fd` from its position to its end (it
// stays open), at most `max_bytes`.
// \error IOError naming `path` when a read fails or there are more bytes.
Result<std::string> ReadToEnd(int fd, const std::string& path, size_t max_bytes);

// Checks, opening nothing, that `path` (links followed) is a regular file:
// for libraries that open a path themselves (HDF5's H5Fopen), so that a FIFO
// never reaches their open(2). A file replaced between this check and their
// open is not caught; the Env's own reads use OpenRegularFile.
// \error as OpenRegularFile (IOError from stat naming the path).
Status CheckRegularFile(const std::string& path);

}  // namespace ptc
