#include "worker/model.h"

#include <gtest/gtest.h>

#include <string>

namespace gpuha::worker {
namespace {

TEST(ModelTest, HistogramBrightnessAndMotionOfAKnownImage) {
  // 2x2 gray image: luma 0, 16, 255, 255; previous all 0.
  auto r = ParseInferRequest(R"({"id":"a","inputs":[
      {"name":"IMAGE","datatype":"UINT8","shape":[2,2],"data":[[0,16],[255,255]]},
      {"name":"PREVIOUS","datatype":"UINT8","shape":[2,2],"data":[0,0,0,0]}]})",
                             std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->id, "a");
  auto out = RunCv(*r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->histogram[0], 1u);
  EXPECT_EQ(out->histogram[1], 1u);
  EXPECT_EQ(out->histogram[15], 2u);
  EXPECT_FLOAT_EQ(out->brightness, (0 + 16 + 255 + 255) / 4.0f);
  EXPECT_FLOAT_EQ(out->motion, (16 + 255 + 255) / (255.0f * 4));
}

TEST(ModelTest, RgbLumaAndNoPreviousMeansNoMotion) {
  CvResult r = ComputeCv(std::vector<uint8_t>{255, 0, 0, 0, 255, 0}.data(), nullptr, 1, 2, 3);
  EXPECT_EQ(r.histogram[(77 * 255 >> 8) >> 4], 1u);   // red: luma 76
  EXPECT_EQ(r.histogram[(150 * 255 >> 8) >> 4], 1u);  // green: luma 149
  EXPECT_EQ(r.motion, 0);
}

TEST(ModelTest, BinaryTensorDataMatchesJson) {
  std::string head =
      R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,3],"parameters":{"binary_data_size":3}}]})";
  std::string body = head + std::string("\x01\x80\xff", 3);
  auto r = ParseInferRequest(body, head.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->inputs[0].data, (std::vector<uint8_t>{1, 128, 255}));
  // Wrong byte size, Triton's wording.
  std::string short_body = head + std::string("\x01\x80", 2);
  auto bad = ParseInferRequest(short_body, head.size());
  EXPECT_NE(bad.status().message().find("runs past the body's end"), std::string::npos)
      << bad.status();
  std::string big =
      R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,3],"parameters":{"binary_data_size":4}}]})";
  bad = ParseInferRequest(big + "abcd", big.size());
  EXPECT_NE(bad.status().message().find("unexpected byte size 4, expecting 3"), std::string::npos)
      << bad.status();
  bad = ParseInferRequest(head + "abcdef", head.size());
  EXPECT_NE(bad.status().message().find("3 bytes of binary data belong to no input"),
            std::string::npos)
      << bad.status();
  bad = ParseInferRequest(body, body.size() + 1);
  EXPECT_NE(bad.status().message().find("Inference-Header-Content-Length"), std::string::npos);
}

TEST(ModelTest, BadTensorsAreNamed) {
  struct Case {
    const char* body;
    const char* want;
  } cases[] = {
      {"not json", "body: not valid JSON"},
      {"[1]", "body: not a JSON object"},
      {R"({"inputs":[]})", "inputs: a non-empty array"},
      {R"({"inputs":[{"datatype":"UINT8","shape":[1],"data":[1]}]})", "inputs[0].name"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"FP32","shape":[1,1],"data":[1]}]})",
       "input 'IMAGE': datatype FP32 is not supported"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[2,2],"data":[1,2,3]}]})",
       "input 'IMAGE': unexpected number of elements 3, expecting 4 for shape [2,2]"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,2],"data":[1,256]}]})",
       "input 'IMAGE': element 1 is 256, not a UINT8"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,-2],"data":[]}]})",
       "shape dimension -2 is not valid"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1],"data":[1]}]})",
       "input 'IMAGE': unexpected shape [1], expecting [H,W] or [H,W,C]"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,1,2],"data":[1,2]}]})",
       "2 channels"},
      {R"({"inputs":[{"name":"FRAME","datatype":"UINT8","shape":[1,1],"data":[1]}]})",
       "input 'FRAME': unexpected inference input"},
      {R"({"inputs":[{"name":"PREVIOUS","datatype":"UINT8","shape":[1,1],"data":[1]}]})",
       "input 'IMAGE': missing"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,2],"data":[1,2]},
                     {"name":"PREVIOUS","datatype":"UINT8","shape":[2,1],"data":[1,2]}]})",
       "input 'PREVIOUS': shape [2,1] differs from IMAGE's [1,2]"},
      {R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,1],"parameters":{"binary_data_size":1}}]})",
       "without an Inference-Header-Content-Length"},
  };
  for (const Case& c : cases) {
    auto r = ParseInferRequest(c.body, std::nullopt);
    absl::Status s = r.ok() ? RunCv(*r).status() : r.status();
    EXPECT_FALSE(s.ok()) << c.body;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << c.body << " -> " << s.message();
  }
}

TEST(ModelTest, ClientRequestAndResponseRoundTrip) {
  std::vector<uint8_t> img(4 * 5 * 3), prev(4 * 5 * 3);
  for (size_t i = 0; i < img.size(); ++i) {
    img[i] = static_cast<uint8_t>(i * 7);
    prev[i] = static_cast<uint8_t>(i * 3);
  }
  std::string body = MakeInferRequestJson("r-1", img, &prev, 4, 5);
  auto req = ParseInferRequest(body, std::nullopt);
  ASSERT_TRUE(req.ok()) << req.status();
  auto out = RunCv(*req);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, ComputeCv(img.data(), prev.data(), 4, 5, 3));
  auto back = ParseInferResponse(InferResponseJson("r-1", *out));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *out);
  EXPECT_FALSE(ParseInferResponse(R"({"outputs":[]})").ok());
  EXPECT_FALSE(ParseInferResponse("garbage").ok());
}

}  // namespace
}  // namespace gpuha::worker
