#include "common/yaml_reader.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"

namespace gpuha::common {
namespace {

// Levenshtein distance, for "did you mean" hints on unknown keys.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string DescribeNode(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
  }
  return "an unknown node";
}

YamlDocument::YamlDocument(YAML::Node root, std::string source)
    : root_(std::move(root)), state_(std::make_shared<YamlErrorState>()) {
  state_->source = std::move(source);
}

absl::StatusOr<YamlDocument> YamlDocument::LoadString(absl::string_view text, std::string source) {
  YAML::Node root;
  try {
    // Every document, so that a second one is an error instead of being
    // silently ignored (a stray "---" once hid half a config).
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(text));
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", docs[1].Mark().line + 1,
                                                     ": a second YAML document; a config is one "
                                                     "document (remove the '---')"));
    }
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    // yaml-cpp marks are 0-based; editors count from 1.
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid YAML: ", e.msg));
  }
  return YamlDocument(std::move(root), std::move(source));
}

absl::StatusOr<YamlDocument> YamlDocument::LoadFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return LoadString(*text, path);
}

YamlMap YamlDocument::Root() {
  int line = 1, column = 1;
  if (root_.IsDefined() && !root_.IsNull()) {
    line = root_.Mark().line + 1;
    column = root_.Mark().column + 1;
  }
  YamlMap map(root_, "", line, column, state_);
  if (root_.IsDefined() && !root_.IsNull() && !root_.IsMap()) {
    map.FailAt(line, column, "",
               absl::StrCat("expected a mapping at the top level, got ", DescribeNode(root_)));
  }
  return map;
}

YamlMap::YamlMap(const YAML::Node& node, std::string path, int line, int column,
                 std::shared_ptr<YamlErrorState> state)
    : impl_(std::make_shared<Impl>()) {
  impl_->path = std::move(path);
  impl_->line = line;
  impl_->column = column;
  impl_->state = std::move(state);
  if (!node.IsMap()) return;
  for (auto it = node.begin(); it != node.end(); ++it) {
    int key_line = it->first.Mark().line + 1;
    int key_column = it->first.Mark().column + 1;
    if (!it->first.IsScalar()) {
      FailAt(key_line, key_column, "", "keys must be plain words");
      continue;
    }
    std::string key = it->first.Scalar();
    bool duplicate = std::any_of(impl_->entries.begin(), impl_->entries.end(),
                                 [&](const Entry& e) { return e.key == key; });
    if (duplicate) {
      FailAt(key_line, key_column, FieldPath(key), "duplicate key");
      continue;
    }
    impl_->entries.push_back(Entry{key, it->second, key_line, key_column});
  }
}

std::string YamlMap::FieldPath(absl::string_view key) const {
  if (impl_->path.empty()) return std::string(key);
  if (key.empty()) return impl_->path;
  return absl::StrCat(impl_->path, ".", key);
}

const YamlMap::Entry* YamlMap::Find(absl::string_view key) {
  impl_->read_keys.emplace(key);
  for (const Entry& e : impl_->entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

bool YamlMap::Has(absl::string_view key) const {
  return std::any_of(impl_->entries.begin(), impl_->entries.end(),
                     [&](const Entry& e) { return e.key == key; });
}

void YamlMap::Allow(absl::string_view key) { impl_->read_keys.emplace(key); }

bool YamlMap::Require(absl::string_view key) {
  if (Find(key) != nullptr) return true;
  FailAt(impl_->line, impl_->column, FieldPath(key), "is required but missing");
  return false;
}

void YamlMap::FailAt(int line, int column, absl::string_view field, absl::string_view message) {
  if (!impl_->state->first_error.ok()) return;
  std::string where = absl::StrCat(impl_->state->source, ":", line, ":", column, ": ");
  impl_->state->first_error = absl::InvalidArgumentError(
      field.empty() ? absl::StrCat(where, message) : absl::StrCat(where, field, ": ", message));
}

void YamlMap::Fail(absl::string_view key, absl::string_view message) {
  for (const Entry& e : impl_->entries) {
    if (e.key == key) {
      int line = e.value.IsDefined() && !e.value.IsNull() ? e.value.Mark().line + 1 : e.line;
      int column = e.value.IsDefined() && !e.value.IsNull() ? e.value.Mark().column + 1 : e.column;
      FailAt(line, column, FieldPath(key), message);
      return;
    }
  }
  FailAt(impl_->line, impl_->column, FieldPath(key), message);
}

std::optional<bool> YamlMap::Bool(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr || !ok()) return std::nullopt;
  bool value = false;
  if (!e->value.IsScalar() || !YAML::convert<bool>::decode(e->value, value)) {
    Fail(key, absl::StrCat("expected true or false, got ", DescribeNode(e->value)));
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> YamlMap::Int(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr || !ok()) return std::nullopt;
  int64_t value = 0;
  if (!e->value.IsScalar() || !YAML::convert<int64_t>::decode(e->value, value)) {
    Fail(key, absl::StrCat("expected an integer, got ", DescribeNode(e->value)));
    return std::nullopt;
  }
  return value;
}

std::optional<double> YamlMap::Number(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr || !ok()) return std::nullopt;
  double value = 0;
  if (!e->value.IsScalar() || !YAML::convert<double>::decode(e->value, value) ||
      !std::isfinite(value)) {
    Fail(key, absl::StrCat("expected a number, got ", DescribeNode(e->value)));
    return std::nullopt;
  }
  return value;
}

std::optional<std::string> YamlMap::String(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr || !ok()) return std::nullopt;
  if (!e->value.IsScalar() || e->value.Scalar().empty()) {
    Fail(key, absl::StrCat("expected a string, got ", DescribeNode(e->value)));
    return std::nullopt;
  }
  return e->value.Scalar();
}

std::optional<std::string> YamlMap::Enum(absl::string_view key,
                                         const std::vector<std::string>& allowed) {
  std::optional<std::string> value = String(key);
  if (!value) return std::nullopt;
  if (std::find(allowed.begin(), allowed.end(), *value) == allowed.end()) {
    Fail(key, absl::StrCat("'", *value, "' is not one of: ", absl::StrJoin(allowed, ", ")));
    return std::nullopt;
  }
  return value;
}

std::optional<std::vector<std::string>> YamlMap::StringList(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr || !ok()) return std::nullopt;
  if (!e->value.IsSequence()) {
    Fail(key, absl::StrCat("expected a list, got ", DescribeNode(e->value)));
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < e->value.size(); ++i) {
    const YAML::Node& item = e->value[i];
    if (!item.IsScalar()) {
      FailAt(item.Mark().line + 1, item.Mark().column + 1,
             absl::StrCat(FieldPath(key), "[", i, "]"),
             absl::StrCat("expected a string, got ", DescribeNode(item)));
      return std::nullopt;
    }
    out.push_back(item.Scalar());
  }
  return out;
}

YamlMap YamlMap::Child(const YAML::Node& node, absl::string_view key, int line, int column) {
  YamlMap child(node, FieldPath(key), line, column, impl_->state);
  impl_->children.push_back(child.impl_);
  return child;
}

YamlMap YamlMap::Map(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr) return Child(YAML::Node(), key, impl_->line, impl_->column);
  if (!e->value.IsMap()) {
    // An empty value ("cluster:") reads as an empty mapping.
    if (!e->value.IsNull()) {
      Fail(key, absl::StrCat("expected a mapping, got ", DescribeNode(e->value)));
    }
    return Child(YAML::Node(), key, e->line, e->column);
  }
  return Child(e->value, key, e->value.Mark().line + 1, e->value.Mark().column + 1);
}

std::vector<YamlMap> YamlMap::MapList(absl::string_view key) {
  std::vector<YamlMap> out;
  const Entry* e = Find(key);
  if (e == nullptr || e->value.IsNull()) return out;
  if (!e->value.IsSequence()) {
    Fail(key, absl::StrCat("expected a list, got ", DescribeNode(e->value)));
    return out;
  }
  for (size_t i = 0; i < e->value.size(); ++i) {
    const YAML::Node& item = e->value[i];
    std::string item_key = absl::StrCat(key, "[", i, "]");
    int line = item.Mark().line + 1, column = item.Mark().column + 1;
    if (!item.IsMap()) {
      FailAt(line, column, FieldPath(item_key),
             absl::StrCat("expected a mapping, got ", DescribeNode(item)));
      return out;
    }
    out.push_back(Child(item, item_key, line, column));
  }
  return out;
}

void YamlMap::CheckUnknownKeys(Impl& impl, YamlMap& reporter) {
  for (const Entry& e : impl.entries) {
    if (impl.read_keys.count(e.key) != 0) continue;
    std::string hint;
    size_t best = 3;  // suggest only close matches
    for (const std::string& known : impl.read_keys) {
      size_t d = EditDistance(e.key, known);
      if (d < best) {
        best = d;
        hint = absl::StrCat(" (did you mean '", known, "'?)");
      }
    }
    std::string known_list = absl::StrJoin(impl.read_keys, ", ");
    reporter.FailAt(e.line, e.column, reporter.FieldPath(e.key),
                    hint.empty() ? absl::StrCat("unknown key; known keys here: ", known_list)
                                 : absl::StrCat("unknown key", hint));
    return;
  }
  for (const std::shared_ptr<Impl>& child : impl.children) {
    YamlMap child_reporter(child);
    CheckUnknownKeys(*child, child_reporter);
  }
}

absl::Status YamlMap::Finish() {
  if (ok()) CheckUnknownKeys(*impl_, *this);
  return status();
}

}  // namespace gpuha::common
