// AWS Signature Version 4 (cluster/s3/sigv4.h) against AWS's published
// vectors: the "get-vanilla" case of the SigV4 test suite
// (aws-sig-v4-test-suite, service "service") and the four S3 examples of
// "Signature Calculations for the Authorization Header" (Amazon S3 API
// reference, sigv4-header-based-auth), each with its documented signature.
#include <gtest/gtest.h>

#include "cluster/s3/sigv4.h"

namespace ptc::cluster::s3 {
namespace {

const Credentials kSuite{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
const Credentials kS3Docs{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr char kEmptyHash[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

SignInput S3Example(std::string method, std::string path) {
  SignInput in;
  in.method = std::move(method);
  in.path = std::move(path);
  in.amz_date = "20130524T000000Z";
  in.region = "us-east-1";
  in.service = "s3";
  in.payload_hash = kEmptyHash;
  in.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                {"x-amz-date", "20130524T000000Z"},
                {"x-amz-content-sha256", kEmptyHash}};
  return in;
}

TEST(SigV4, GetVanilla) {
  SignInput in;
  in.method = "GET";
  in.path = "/";
  in.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
  in.payload_hash = Sha256Hex("");
  in.amz_date = "20150830T123600Z";
  in.region = "us-east-1";
  in.service = "service";
  EXPECT_EQ(CanonicalRequest(in),
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(StringToSign(in),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  EXPECT_EQ(Authorization(in, kSuite),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

// GET Object with a Range header.
TEST(SigV4, S3GetObject) {
  SignInput in = S3Example("GET", "/test.txt");
  in.headers.emplace_back("Range", "bytes=0-9");
  EXPECT_EQ(StringToSign(in),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(Authorization(in, kS3Docs),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

// PUT Object: a key with '$' (encoded), a Date and a storage class signed too.
TEST(SigV4, S3PutObject) {
  SignInput in = S3Example("PUT", "/test$file.text");
  const std::string body = "Welcome to Amazon S3.";
  in.payload_hash = Sha256Hex(body);
  EXPECT_EQ(in.payload_hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  in.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                {"x-amz-date", "20130524T000000Z"},
                {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                {"x-amz-content-sha256", in.payload_hash}};
  EXPECT_EQ(Authorization(in, kS3Docs),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
            "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

// GET Bucket Lifecycle: a query flag with no value.
TEST(SigV4, S3GetBucketLifecycle) {
  SignInput in = S3Example("GET", "/");
  in.query = {{"lifecycle", ""}};
  EXPECT_EQ(Authorization(in, kS3Docs),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
            "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

// List Objects: the query sorted by name.
TEST(SigV4, S3ListObjects) {
  SignInput in = S3Example("GET", "/");
  in.query = {{"prefix", "J"}, {"max-keys", "2"}};
  EXPECT_EQ(CanonicalQuery(in.query), "max-keys=2&prefix=J");
  EXPECT_EQ(Authorization(in, kS3Docs),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4, UriEncoding) {
  EXPECT_EQ(UriEncode("a b/c~d_e.f-g$+=", true), "a%20b/c~d_e.f-g%24%2B%3D");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
}

}  // namespace
}  // namespace ptc::cluster::s3
