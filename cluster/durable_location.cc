#include "cluster/durable_location.h"

#include <filesystem>

#include "cluster/s3/s3_env.h"

namespace ptc::cluster {

Result<DurableLocation> OpenDurableLocation(std::string_view spec, bool create) {
  DurableLocation l;
  if (s3::IsS3Url(spec)) {
    PTC_ASSIGN_OR_RETURN(s3::S3Url url, s3::ParseS3Url(spec));
    PTC_ASSIGN_OR_RETURN(std::shared_ptr<s3::S3Client> client, s3::S3Client::FromEnvironment(), std::string(spec));
    l.name = "s3://" + url.bucket + (url.prefix.empty() ? "" : "/" + url.prefix);
    l.env = s3::NewS3Env(std::move(client), url.bucket);
    l.dir = url.prefix;
    return l;
  }
  // A daemon changes its directory: the tier's path is kept whole.
  l.name = l.dir = std::filesystem::absolute(std::string(spec)).lexically_normal().string();
  if (create) PTC_RETURN_IF_ERROR(Env::Default()->CreateDirs(l.dir));
  return l;
}

}  // namespace ptc::cluster
