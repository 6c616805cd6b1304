// An Env over one S3 bucket: a path is an object's key ("gen-000001/x.bin"),
// so that the durable tier (cluster/durable.h), written and read through an
// Env, lives in a bucket as it does in a directory.
//
//   OpenRead     HEAD for the size, then a ranged GET per Read (only the
//                bytes asked for; nothing cached)
//   OpenWrite    parts of `part_bytes` uploaded as they fill, up to
//                `parallel` at once (a multipart upload; memory at most
//                (parallel + 1) * part_bytes), completed by Close: the object
//                exists whole or not at all; a file destroyed unclosed aborts
//                its upload. A file under one part is one PUT.
//   ListDir      a listing with delimiter '/'; Rename is copy then delete (the
//                copy is atomic: a reader sees the old object or the new);
//                RemoveTree deletes every key under PATH/.
//   directories  implicit: CreateDirs, SyncDir and SyncFileSystem do nothing
//                (a completed PUT is durable).
// OpenExisting, PWrite and OpenOutputDir are Unimplemented.
//
// Thread safety: as Env.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cluster/s3/s3_client.h"
#include "ptc/base/env.h"

namespace ptc::cluster::s3 {

struct S3EnvOptions {
  uint64_t part_bytes = 16 << 20;  // at least 5 MiB (S3's least part but the last)
  int parallel = 4;                // parts of one file uploaded at once
};

// Bytes [offset, offset + n) of `file`, opened by an S3Env, given to `sink`
// as they arrive (S3Client::GetRangeTo: no buffer of the caller's, so one
// request can be long).
// \error Unimplemented for a file of another Env; as GetRangeTo.
Status StreamRange(const RandomAccessFile& file, uint64_t offset, uint64_t n,
                   const std::function<Status(uint64_t at, const char* data, size_t n)>& sink);

std::unique_ptr<Env> NewS3Env(std::shared_ptr<const S3Client> client, std::string bucket, S3EnvOptions options = {});

}  // namespace ptc::cluster::s3
