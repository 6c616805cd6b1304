#include "cluster/s3/s3_config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ptc::cluster::s3 {
namespace {

std::string Var(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\r") - b + 1));
}

// The keys of `profile` in an AWS credentials file (INI).
Status ReadCredentialsFile(const std::string& path, const std::string& profile, Credentials* out) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": no credentials file");
  std::string line, section;
  while (std::getline(in, line)) {
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = Trim(std::string_view(t).substr(1, t.size() - 2));
      continue;
    }
    const size_t eq = t.find('=');
    if (section != profile || eq == std::string::npos) continue;
    const std::string key = Trim(std::string_view(t).substr(0, eq)), value = Trim(std::string_view(t).substr(eq + 1));
    if (key == "aws_access_key_id") out->access_key = value;
    if (key == "aws_secret_access_key") out->secret_key = value;
    if (key == "aws_session_token") out->session_token = value;
  }
  return Status::OK();
}

}  // namespace

bool IsS3Url(std::string_view text) { return text.starts_with("s3://"); }

Result<S3Url> ParseS3Url(std::string_view text) {
  if (!IsS3Url(text)) return InvalidArgumentError(std::string(text) + ": not an s3://BUCKET/PREFIX url");
  std::string_view rest = text.substr(5);
  const size_t slash = rest.find('/');
  S3Url url{std::string(rest.substr(0, slash)), slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1))};
  while (url.prefix.ends_with('/')) url.prefix.pop_back();
  const bool bad_bucket = url.bucket.size() < 3 || url.bucket.size() > 63 ||
                          url.bucket.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") != std::string::npos;
  if (bad_bucket) {
    return InvalidArgumentError(std::string(text) + ": '" + url.bucket +
                                "' is not a bucket name (3 to 63 of a-z, 0-9, '.', '-')");
  }
  if (url.prefix.find("//") != std::string::npos) {
    return InvalidArgumentError(std::string(text) + ": the prefix has an empty component");
  }
  return url;
}

Result<Endpoint> ParseEndpoint(std::string_view url) {
  Endpoint e;
  std::string_view rest;
  if (url.starts_with("http://")) {
    e.scheme = "http";
    e.port = 80;
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else {
    return InvalidArgumentError("AWS_ENDPOINT_URL " + std::string(url) + ": not an http:// or https:// url");
  }
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return InvalidArgumentError("AWS_ENDPOINT_URL " + std::string(url) + ": a path is not supported");
  }
  const size_t colon = rest.rfind(':');
  e.host = std::string(rest.substr(0, colon));
  if (colon != std::string_view::npos) {
    const std::string port(rest.substr(colon + 1));
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || p <= 0 || p > 65535) {
      return InvalidArgumentError("AWS_ENDPOINT_URL " + std::string(url) + ": bad port '" + port + "'");
    }
    e.port = static_cast<int>(p);
  }
  if (e.host.empty()) return InvalidArgumentError("AWS_ENDPOINT_URL " + std::string(url) + ": no host");
  return e;
}

Result<S3Config> LoadS3Config() {
  S3Config c;
  if (std::string r = Var("AWS_REGION"); !r.empty()) {
    c.region = r;
  } else if (std::string d = Var("AWS_DEFAULT_REGION"); !d.empty()) {
    c.region = d;
  }
  const std::string endpoint = Var("AWS_ENDPOINT_URL");
  PTC_ASSIGN_OR_RETURN(c.endpoint, ParseEndpoint(endpoint.empty() ? "https://s3." + c.region + ".amazonaws.com" : endpoint));
  c.credentials = {Var("AWS_ACCESS_KEY_ID"), Var("AWS_SECRET_ACCESS_KEY"), Var("AWS_SESSION_TOKEN")};
  std::string where = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";
  if (c.credentials.access_key.empty()) {
    std::string file = Var("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty()) file = Var("HOME") + "/.aws/credentials";
    std::string profile = Var("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    where += " or profile [" + profile + "] of " + file;
    if (Status s = ReadCredentialsFile(file, profile, &c.credentials); !s.ok() && s.code() != Code::kNotFound) return s;
  }
  if (c.credentials.access_key.empty() || c.credentials.secret_key.empty()) {
    return InvalidArgumentError("S3: no credentials (looked in " + where + ")");
  }
  return c;
}

}  // namespace ptc::cluster::s3
