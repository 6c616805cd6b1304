// Where an S3 bucket is and who may use it, taken from the environment the
// way the AWS tools take it, never from the command line:
//   AWS_ENDPOINT_URL (default https://s3.REGION.amazonaws.com), AWS_REGION
//   (or AWS_DEFAULT_REGION; default us-east-1), AWS_ACCESS_KEY_ID,
//   AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; without keys in the
//   environment, the profile AWS_PROFILE (default "default") of the
//   credentials file AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials).
// Requests are path-style (ENDPOINT/BUCKET/KEY), as radosgw and MinIO take them.
//
// Thread safety: pure functions of their arguments and the environment.
#pragma once

#include <string>
#include <string_view>

#include "cluster/s3/sigv4.h"
#include "ptc/base/status.h"

namespace ptc::cluster::s3 {

struct Endpoint {
  std::string scheme = "https";  // "http" or "https"
  std::string host;
  int port = 443;
  std::string ToString() const { return scheme + "://" + host + ":" + std::to_string(port); }
};

struct S3Config {
  Endpoint endpoint;
  std::string region = "us-east-1";
  Credentials credentials;
};

// "s3://BUCKET/PREFIX" (PREFIX may be empty; no trailing '/').
struct S3Url {
  std::string bucket;
  std::string prefix;
};

bool IsS3Url(std::string_view text);
// \error InvalidArgument naming `text` for a missing or malformed bucket.
Result<S3Url> ParseS3Url(std::string_view text);
// \error InvalidArgument naming the variable for a malformed endpoint.
Result<Endpoint> ParseEndpoint(std::string_view url);
// \error InvalidArgument when no keys are found (naming where it looked) or
//        the endpoint is malformed; IOError when the credentials file cannot be read.
Result<S3Config> LoadS3Config();

}  // namespace ptc::cluster::s3
