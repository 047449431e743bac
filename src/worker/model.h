// The reference worker's model and its KServe v2 (Open Inference Protocol)
// tensors. Pure functions, shared by the worker (to serve) and by `gpuha load`
// (to build requests and check every answer).
//
// The built-in model "cv" is a small deterministic camera workload:
//   inputs   IMAGE     UINT8 [H, W] or [H, W, C] with C = 1 or 3
//            PREVIOUS  UINT8, same shape (optional: the frame before)
//   outputs  HISTOGRAM UINT32 [16]  luma histogram, 16 bins of 16 levels
//            BRIGHTNESS FP32  [1]   mean luma, 0..255
//            MOTION     FP32  [1]   mean |luma - previous luma| / 255, 0..1
// Luma of an RGB pixel is (77 R + 150 G + 29 B) >> 8 (BT.601, integer).
//
// Requests are JSON, with tensor data as flat or nested arrays, or use the
// binary tensor data extension (Triton's): an Inference-Header-Content-Length
// header gives the JSON part's length, and each input with
// parameters.binary_data_size takes that many bytes of the rest, in order.
// Errors name the input and what is wrong, as Triton's do.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::worker {

inline constexpr const char* kModelName = "cv";
inline constexpr const char* kModelVersion = "1";
inline constexpr int64_t kMaxPixels = 4096 * 4096;

struct Tensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // UINT8 elements
};

struct InferRequest {
  std::string id;
  std::vector<Tensor> inputs;
};

struct CvResult {
  std::array<uint32_t, 16> histogram{};
  float brightness = 0;
  float motion = 0;
  bool operator==(const CvResult&) const = default;
};

// The element count of input `input`'s shape, checked (no negative or huge
// dimension) with its datatype (UINT8); errors name the input.
[[nodiscard]] absl::StatusOr<int64_t> TensorElements(const std::string& input,
                                                     const std::vector<int64_t>& shape,
                                                     const std::string& datatype);
// `json_length`: the Inference-Header-Content-Length value, when present.
[[nodiscard]] absl::StatusOr<InferRequest> ParseInferRequest(std::string_view body,
                                                             std::optional<size_t> json_length);
// Checks the inputs against the model (names, datatype, shape) and runs it.
[[nodiscard]] absl::StatusOr<CvResult> RunCv(const InferRequest& r);
// The computation alone: `image` is h*w*c bytes; `previous` is null or the same size.
CvResult ComputeCv(const uint8_t* image, const uint8_t* previous, int64_t h, int64_t w, int64_t c);

std::string InferResponseJson(const std::string& id, const CvResult& r);
// GET /v2/models/cv
std::string ModelMetadataJson();

// For clients: a JSON infer request for an h x w x 3 image (and previous frame).
std::string MakeInferRequestJson(const std::string& id, const std::vector<uint8_t>& image,
                                 const std::vector<uint8_t>* previous, int64_t h, int64_t w);
// For clients: the result in an infer response; errors name what is missing.
[[nodiscard]] absl::StatusOr<CvResult> ParseInferResponse(std::string_view body);

}  // namespace gpuha::worker
