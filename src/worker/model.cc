#include "worker/model.h"

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpuha::worker {

using nlohmann::json;

namespace {

std::string ShapeStr(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ",") + "]"; }

// Appends the UINT8 elements of a flat or nested JSON array to `out`.
absl::Status FlattenUint8(const json& j, const std::string& input, std::vector<uint8_t>& out) {
  if (j.is_array()) {
    for (const json& e : j) {
      if (absl::Status s = FlattenUint8(e, input, out); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input, "': element ", out.size(),
                                                   " is ", j.dump(),
                                                   ", not a UINT8 (an integer 0..255)"));
  }
  out.push_back(static_cast<uint8_t>(j.get<int64_t>()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> TensorElements(const std::string& input, const std::vector<int64_t>& shape,
                                       const std::string& datatype) {
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxPixels) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input, "': shape dimension ", d, " is not valid"));
    }
    elements *= d;
    if (elements > 3 * kMaxPixels) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input, "': shape ", ShapeStr(shape), " is too large"));
    }
  }
  if (datatype != "UINT8") {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", input, "': datatype ", datatype, " is not supported (UINT8)"));
  }
  return elements;
}

absl::StatusOr<InferRequest> ParseInferRequest(std::string_view body,
                                               std::optional<size_t> json_length) {
  if (json_length && *json_length > body.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Inference-Header-Content-Length: ", *json_length, " is more than the body's ",
                     body.size(), " bytes"));
  }
  std::string_view head = json_length ? body.substr(0, *json_length) : body;
  std::string_view binary = json_length ? body.substr(*json_length) : std::string_view();
  json j = json::parse(head, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("body: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("body: not a JSON object");
  InferRequest r;
  if (j.contains("id")) {
    if (!j["id"].is_string()) return absl::InvalidArgumentError("id: must be a string");
    r.id = j["id"];
  }
  if (!j.contains("inputs") || !j["inputs"].is_array() || j["inputs"].empty()) {
    return absl::InvalidArgumentError("inputs: a non-empty array is required");
  }
  size_t offset = 0;
  for (size_t i = 0; i < j["inputs"].size(); ++i) {
    const json& in = j["inputs"][i];
    std::string where = absl::StrCat("inputs[", i, "]");
    if (!in.is_object()) return absl::InvalidArgumentError(where + ": not an object");
    Tensor t;
    if (!in.contains("name") || !in["name"].is_string()) {
      return absl::InvalidArgumentError(where + ".name: a string is required");
    }
    t.name = in["name"];
    if (!in.contains("datatype") || !in["datatype"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': datatype is required"));
    }
    t.datatype = in["datatype"];
    if (!in.contains("shape") || !in["shape"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': shape is required"));
    }
    for (const json& d : in["shape"]) {
      if (!d.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': shape dimension ", d.dump(), " is not valid"));
      }
      t.shape.push_back(d.get<int64_t>());
    }
    absl::StatusOr<int64_t> counted = TensorElements(t.name, t.shape, t.datatype);
    if (!counted.ok()) return counted.status();
    const int64_t elements = *counted;
    const json* params =
        in.contains("parameters") && in["parameters"].is_object() ? &in["parameters"] : nullptr;
    if (params != nullptr && params->contains("binary_data_size")) {
      const json& n = (*params)["binary_data_size"];
      if (!n.is_number_integer() || n.get<int64_t>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': binary_data_size must be a non-negative integer"));
      }
      size_t size = n.get<size_t>();
      if (!json_length) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", t.name,
            "': binary_data_size given without an Inference-Header-Content-Length header"));
      }
      if (offset + size > binary.size()) {
        return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': binary_data_size ",
                                                       size, " runs past the body's end"));
      }
      if (static_cast<int64_t>(size) != elements) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': unexpected byte size ", size, ", expecting ",
                         elements, " for shape ", ShapeStr(t.shape), " of ", t.datatype));
      }
      t.data.assign(binary.begin() + static_cast<ptrdiff_t>(offset),
                    binary.begin() + static_cast<ptrdiff_t>(offset + size));
      offset += size;
    } else {
      if (!in.contains("data")) {
        return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': data is required"));
      }
      t.data.reserve(static_cast<size_t>(elements));
      if (absl::Status s = FlattenUint8(in["data"], t.name, t.data); !s.ok()) return s;
      if (static_cast<int64_t>(t.data.size()) != elements) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", t.name, "': unexpected number of elements ", t.data.size(),
                         ", expecting ", elements, " for shape ", ShapeStr(t.shape)));
      }
    }
    r.inputs.push_back(std::move(t));
  }
  if (json_length && offset != binary.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("body: ", binary.size() - offset, " bytes of binary data belong to no input"));
  }
  return r;
}

CvResult ComputeCv(const uint8_t* image, const uint8_t* previous, int64_t h, int64_t w, int64_t c) {
  CvResult r;
  auto luma = [c](const uint8_t* p) -> uint32_t {
    return c == 3 ? (77u * p[0] + 150u * p[1] + 29u * p[2]) >> 8 : p[0];
  };
  uint64_t sum = 0, diff = 0;
  int64_t n = h * w;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t y = luma(image + i * c);
    r.histogram[y >> 4]++;
    sum += y;
    if (previous != nullptr) {
      uint32_t py = luma(previous + i * c);
      diff += y > py ? y - py : py - y;
    }
  }
  if (n > 0) {
    r.brightness = static_cast<float>(static_cast<double>(sum) / static_cast<double>(n));
    r.motion = static_cast<float>(static_cast<double>(diff) / (255.0 * static_cast<double>(n)));
  }
  return r;
}

absl::StatusOr<CvResult> RunCv(const InferRequest& r) {
  const Tensor* image = nullptr;
  const Tensor* previous = nullptr;
  for (const Tensor& t : r.inputs) {
    if (t.name == "IMAGE") {
      image = &t;
    } else if (t.name == "PREVIOUS") {
      previous = &t;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", t.name, "': unexpected inference input for model 'cv' (IMAGE, PREVIOUS)"));
    }
  }
  if (image == nullptr) return absl::InvalidArgumentError("input 'IMAGE': missing");
  const std::vector<int64_t>& s = image->shape;
  if (s.size() != 2 && s.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("input 'IMAGE': unexpected shape ", ShapeStr(s),
                                                   ", expecting [H,W] or [H,W,C]"));
  }
  int64_t c = s.size() == 3 ? s[2] : 1;
  if (c != 1 && c != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("input 'IMAGE': ", c, " channels; expecting 1 or 3"));
  }
  if (s[0] * s[1] > kMaxPixels) {
    return absl::InvalidArgumentError(
        absl::StrCat("input 'IMAGE': ", s[0], "x", s[1], " is more than ", kMaxPixels, " pixels"));
  }
  if (previous != nullptr && previous->shape != s) {
    return absl::InvalidArgumentError(absl::StrCat("input 'PREVIOUS': shape ",
                                                   ShapeStr(previous->shape),
                                                   " differs from IMAGE's ", ShapeStr(s)));
  }
  return ComputeCv(image->data.data(), previous ? previous->data.data() : nullptr, s[0], s[1], c);
}

std::string InferResponseJson(const std::string& id, const CvResult& r) {
  json out = {
      {"model_name", kModelName},
      {"model_version", kModelVersion},
      {"outputs",
       {{{"name", "HISTOGRAM"}, {"datatype", "UINT32"}, {"shape", {16}}, {"data", r.histogram}},
        {{"name", "BRIGHTNESS"}, {"datatype", "FP32"}, {"shape", {1}}, {"data", {r.brightness}}},
        {{"name", "MOTION"}, {"datatype", "FP32"}, {"shape", {1}}, {"data", {r.motion}}}}}};
  if (!id.empty()) out["id"] = id;
  return out.dump();
}

std::string ModelMetadataJson() {
  json m = {{"name", kModelName},
            {"versions", {kModelVersion}},
            {"platform", "gpuha_cv"},
            {"inputs",
             {{{"name", "IMAGE"}, {"datatype", "UINT8"}, {"shape", {-1, -1, -1}}},
              {{"name", "PREVIOUS"},
               {"datatype", "UINT8"},
               {"shape", {-1, -1, -1}},
               {"optional", true}}}},
            {"outputs",
             {{{"name", "HISTOGRAM"}, {"datatype", "UINT32"}, {"shape", {16}}},
              {{"name", "BRIGHTNESS"}, {"datatype", "FP32"}, {"shape", {1}}},
              {{"name", "MOTION"}, {"datatype", "FP32"}, {"shape", {1}}}}}};
  return m.dump();
}

std::string MakeInferRequestJson(const std::string& id, const std::vector<uint8_t>& image,
                                 const std::vector<uint8_t>* previous, int64_t h, int64_t w) {
  json inputs = json::array();
  inputs.push_back(
      {{"name", "IMAGE"}, {"datatype", "UINT8"}, {"shape", {h, w, 3}}, {"data", image}});
  if (previous != nullptr) {
    inputs.push_back(
        {{"name", "PREVIOUS"}, {"datatype", "UINT8"}, {"shape", {h, w, 3}}, {"data", *previous}});
  }
  return json{{"id", id}, {"inputs", std::move(inputs)}}.dump();
}

absl::StatusOr<CvResult> ParseInferResponse(std::string_view body) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("outputs") || !j["outputs"].is_array()) {
    return absl::InvalidArgumentError("response: no outputs array");
  }
  CvResult r;
  int found = 0;
  for (const json& o : j["outputs"]) {
    if (!o.is_object() || !o.contains("name") || !o.contains("data") || !o["data"].is_array()) {
      return absl::InvalidArgumentError("response: an output without name or data");
    }
    const std::string name = o["name"].is_string() ? o["name"].get<std::string>() : "";
    const json& d = o["data"];
    if (name == "HISTOGRAM" && d.size() == 16) {
      for (size_t i = 0; i < 16; ++i) {
        if (!d[i].is_number_unsigned()) return absl::InvalidArgumentError("HISTOGRAM: not UINT32");
        r.histogram[i] = d[i].get<uint32_t>();
      }
      found |= 1;
    } else if (name == "BRIGHTNESS" && d.size() == 1 && d[0].is_number()) {
      r.brightness = d[0].get<float>();
      found |= 2;
    } else if (name == "MOTION" && d.size() == 1 && d[0].is_number()) {
      r.motion = d[0].get<float>();
      found |= 4;
    }
  }
  if (found != 7)
    return absl::InvalidArgumentError("response: HISTOGRAM, BRIGHTNESS or MOTION missing");
  return r;
}

}  // namespace gpuha::worker
