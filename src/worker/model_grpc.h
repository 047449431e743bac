// The "cv" model (worker/model.h) in the KServe v2 gRPC form
// (proto/inference/grpc_predict_v2.proto): requests to the model's tensors
// and results to responses, for the worker's gRPC service; and the client
// side, for `gpuha load --protocol grpc` and the tests, which check every
// answer. Tensor data travels as raw_input_contents (Triton's fast path) or
// as contents.uint_contents, one element each; outputs go back as
// raw_output_contents, little-endian, as Triton sends them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "worker/model.h"

namespace gpuha::worker {

// The response parameter (string) naming the node that answered, set by a
// worker started with --node: the per-answer form of the x-gpuha-node
// header, since a stream's metadata comes once, from where it began.
inline constexpr std::string_view kNodeParameter = "gpuha_node";
// The node an answer names (kNodeParameter), or "".
std::string NodeOf(const inference::ModelInferResponse& r);

// The model's inputs; errors name the input and what is wrong.
[[nodiscard]] absl::StatusOr<InferRequest> FromGrpc(const inference::ModelInferRequest& r);
void ToGrpc(const std::string& id, const CvResult& result, inference::ModelInferResponse* out);
void ModelMetadataGrpc(inference::ModelMetadataResponse* out);

// For clients: an h x w x 3 image (and the previous frame) as raw contents.
inference::ModelInferRequest MakeGrpcInferRequest(const std::string& id,
                                                  const std::vector<uint8_t>& image,
                                                  const std::vector<uint8_t>* previous, int64_t h,
                                                  int64_t w);
// For clients: the result in a response; errors name what is missing.
[[nodiscard]] absl::StatusOr<CvResult> FromGrpc(const inference::ModelInferResponse& r);

}  // namespace gpuha::worker
