#include "worker/model_grpc.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpuha::worker {
namespace {

void AddOutput(inference::ModelInferResponse* out, const char* name, const char* datatype,
               int64_t n, const void* data, size_t bytes) {
  auto* t = out->add_outputs();
  t->set_name(name);
  t->set_datatype(datatype);
  t->add_shape(n);
  out->add_raw_output_contents()->assign(static_cast<const char*>(data), bytes);
}

}  // namespace

absl::StatusOr<InferRequest> FromGrpc(const inference::ModelInferRequest& r) {
  if (r.inputs().empty()) return absl::InvalidArgumentError("inputs: at least one is required");
  const bool raw = !r.raw_input_contents().empty();
  if (raw && r.raw_input_contents_size() != r.inputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: ", r.raw_input_contents_size(), " entries for ",
                     r.inputs_size(), " inputs; give one per input, or use contents"));
  }
  InferRequest out;
  out.id = r.id();
  for (int i = 0; i < r.inputs_size(); ++i) {
    const auto& in = r.inputs(i);
    Tensor t;
    t.name = in.name();
    t.datatype = in.datatype();
    if (t.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("inputs[", i, "].name: required"));
    t.shape.assign(in.shape().begin(), in.shape().end());
    absl::StatusOr<int64_t> elements = TensorElements(t.name, t.shape, t.datatype);
    if (!elements.ok()) return elements.status();
    if (raw) {
      const std::string& bytes = r.raw_input_contents(i);
      if (static_cast<int64_t>(bytes.size()) != *elements) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': unexpected byte size ", bytes.size(),
                         " in raw_input_contents, expecting ", *elements, " for UINT8"));
      }
      t.data.assign(bytes.begin(), bytes.end());
    } else {
      const auto& u = in.contents().uint_contents();
      if (static_cast<int64_t>(u.size()) != *elements) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': unexpected number of elements ", u.size(),
                         " in contents.uint_contents, expecting ", *elements));
      }
      t.data.reserve(u.size());
      for (uint32_t v : u) {
        if (v > 255) {
          return absl::InvalidArgumentError(
              absl::StrCat("input '", t.name, "': element ", v, " is not a UINT8"));
        }
        t.data.push_back(static_cast<uint8_t>(v));
      }
    }
    out.inputs.push_back(std::move(t));
  }
  return out;
}

void ToGrpc(const std::string& id, const CvResult& result, inference::ModelInferResponse* out) {
  out->set_model_name(kModelName);
  out->set_model_version(kModelVersion);
  out->set_id(id);
  // x86 and arm64 are little-endian, as the protocol's raw contents are.
  AddOutput(out, "HISTOGRAM", "UINT32", 16, result.histogram.data(), sizeof(result.histogram));
  AddOutput(out, "BRIGHTNESS", "FP32", 1, &result.brightness, sizeof(float));
  AddOutput(out, "MOTION", "FP32", 1, &result.motion, sizeof(float));
}

std::string NodeOf(const inference::ModelInferResponse& r) {
  auto it = r.parameters().find(std::string(kNodeParameter));
  return it == r.parameters().end() ? std::string() : it->second.string_param();
}

void ModelMetadataGrpc(inference::ModelMetadataResponse* out) {
  out->set_name(kModelName);
  out->add_versions(kModelVersion);
  out->set_platform("gpuha");
  for (const char* name : {"IMAGE", "PREVIOUS"}) {
    auto* t = out->add_inputs();
    t->set_name(name);
    t->set_datatype("UINT8");
    for (int64_t d : {-1, -1, 3}) t->add_shape(d);
  }
  struct Out {
    const char* name;
    const char* datatype;
    int64_t n;
  };
  for (Out o :
       {Out{"HISTOGRAM", "UINT32", 16}, Out{"BRIGHTNESS", "FP32", 1}, Out{"MOTION", "FP32", 1}}) {
    auto* t = out->add_outputs();
    t->set_name(o.name);
    t->set_datatype(o.datatype);
    t->add_shape(o.n);
  }
}

inference::ModelInferRequest MakeGrpcInferRequest(const std::string& id,
                                                  const std::vector<uint8_t>& image,
                                                  const std::vector<uint8_t>* previous, int64_t h,
                                                  int64_t w) {
  inference::ModelInferRequest r;
  r.set_model_name(kModelName);
  r.set_id(id);
  auto add = [&](const char* name, const std::vector<uint8_t>& data) {
    auto* t = r.add_inputs();
    t->set_name(name);
    t->set_datatype("UINT8");
    for (int64_t d : {h, w, int64_t{3}}) t->add_shape(d);
    r.add_raw_input_contents()->assign(data.begin(), data.end());
  };
  add("IMAGE", image);
  if (previous != nullptr) add("PREVIOUS", *previous);
  return r;
}

absl::StatusOr<CvResult> FromGrpc(const inference::ModelInferResponse& r) {
  if (r.raw_output_contents_size() != r.outputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_output_contents: ", r.raw_output_contents_size(), " entries for ",
                     r.outputs_size(), " outputs"));
  }
  CvResult out;
  bool histogram = false, brightness = false, motion = false;
  for (int i = 0; i < r.outputs_size(); ++i) {
    const std::string& name = r.outputs(i).name();
    const std::string& raw = r.raw_output_contents(i);
    auto take = [&](void* to, size_t bytes, bool* seen) -> absl::Status {
      if (raw.size() != bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("output '", name, "': ", raw.size(), " bytes, expecting ", bytes));
      }
      std::memcpy(to, raw.data(), bytes);
      *seen = true;
      return absl::OkStatus();
    };
    absl::Status s = name == "HISTOGRAM"
                         ? take(out.histogram.data(), sizeof(out.histogram), &histogram)
                     : name == "BRIGHTNESS" ? take(&out.brightness, sizeof(float), &brightness)
                     : name == "MOTION"     ? take(&out.motion, sizeof(float), &motion)
                                            : absl::OkStatus();
    if (!s.ok()) return s;
  }
  for (auto [seen, name] : {std::pair{histogram, "HISTOGRAM"}, std::pair{brightness, "BRIGHTNESS"},
                            std::pair{motion, "MOTION"}}) {
    if (!seen) return absl::InvalidArgumentError(absl::StrCat("output '", name, "': missing"));
  }
  return out;
}

}  // namespace gpuha::worker
