// YamlMap: strict, typed reading of one YAML mapping, for config files and
// planner inputs that operators write by hand.
//
// Every read names the field by its dotted path and the line it sits on, so a
// bad file gets one clear error ("plan.yaml:7:10: cluster.nodes: expected an
// integer, got 'three'"). The first error wins and later reads return
// std::nullopt. Keys that were never read are reported by Finish() as unknown,
// with a suggestion when one known key is close.
//
//   auto doc = YamlDocument::LoadFile("plan.yaml");
//   if (!doc.ok()) return doc.status();
//   YamlMap root = doc->Root();
//   YamlMap cluster = root.Map("cluster");
//   std::optional<int64_t> nodes = cluster.Int("nodes");
//   if (nodes && *nodes < 1) cluster.Fail("nodes", "must be at least 1");
//   if (absl::Status s = root.Finish(); !s.ok()) return s;
//
// A YamlMap is a cheap handle: copies share the same map and its record of
// which keys were read. Thread-safety: none; a document and its maps belong to
// one thread.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::common {

class YamlMap;

// Shared by a document and every map read from it: the file name and the first
// error met.
struct YamlErrorState {
  std::string source;
  absl::Status first_error;
};

class YamlDocument {
 public:
  // Parses text; a syntax error names the source, line and column.
  [[nodiscard]] static absl::StatusOr<YamlDocument> LoadString(absl::string_view text,
                                                               std::string source);
  [[nodiscard]] static absl::StatusOr<YamlDocument> LoadFile(const std::string& path);

  // The top-level mapping. An empty document is an empty mapping; any other
  // non-mapping top level records an error.
  YamlMap Root();

  const std::shared_ptr<YamlErrorState>& state() const { return state_; }

 private:
  YamlDocument(YAML::Node root, std::string source);
  YAML::Node root_;
  std::shared_ptr<YamlErrorState> state_;
};

class YamlMap {
 public:
  // Scalar reads: std::nullopt when the key is absent or an error was
  // recorded (check status() or Finish()).
  std::optional<bool> Bool(absl::string_view key);
  std::optional<int64_t> Int(absl::string_view key);
  std::optional<double> Number(absl::string_view key);
  std::optional<std::string> String(absl::string_view key);
  // A string that must be one of `allowed`; the error lists them.
  std::optional<std::string> Enum(absl::string_view key, const std::vector<std::string>& allowed);
  // A nested mapping; absent gives an empty map at this map's line.
  YamlMap Map(absl::string_view key);
  // A list of scalars read as strings.
  std::optional<std::vector<std::string>> StringList(absl::string_view key);
  // A list of nested mappings.
  std::vector<YamlMap> MapList(absl::string_view key);

  bool Has(absl::string_view key) const;
  // Records a required-field error when `key` is absent; returns whether present.
  bool Require(absl::string_view key);
  // Marks a key as known without reading it (kept for a later reader).
  void Allow(absl::string_view key);

  // Records an error about `key` (or about the map itself when key is empty),
  // located at the key's line. Only the first error of a document is kept.
  void Fail(absl::string_view key, absl::string_view message);

  // Reports the first unknown key of this map and of every map read from it,
  // then returns the document's first error (OK when none).
  [[nodiscard]] absl::Status Finish();
  [[nodiscard]] absl::Status status() const { return impl_->state->first_error; }
  bool ok() const { return impl_->state->first_error.ok(); }

  // "cluster.nodes" for key "nodes" of map "cluster".
  std::string FieldPath(absl::string_view key) const;
  int line() const { return impl_->line; }

 private:
  friend class YamlDocument;
  struct Entry {
    std::string key;
    YAML::Node value;
    int line;    // 1-based
    int column;  // 1-based
  };
  struct Impl {
    std::string path;
    int line = 1;
    int column = 1;
    std::vector<Entry> entries;
    std::set<std::string, std::less<>> read_keys;
    std::vector<std::shared_ptr<Impl>> children;
    std::shared_ptr<YamlErrorState> state;
  };
  YamlMap(const YAML::Node& node, std::string path, int line, int column,
          std::shared_ptr<YamlErrorState> state);
  explicit YamlMap(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  const Entry* Find(absl::string_view key);
  void FailAt(int line, int column, absl::string_view field, absl::string_view message);
  static void CheckUnknownKeys(Impl& impl, YamlMap& reporter);
  YamlMap Child(const YAML::Node& node, absl::string_view key, int line, int column);

  std::shared_ptr<Impl> impl_;
};

// Describes a YAML node for an error message: "'three'", "a list", "nothing".
std::string DescribeNode(const YAML::Node& node);

}  // namespace gpuha::common
