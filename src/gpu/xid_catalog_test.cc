#include "gpu/xid_catalog.h"

#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpuha::gpu {
namespace {

// NVIDIA's XID catalog, one row per XID: the XID and "Resolution Bucket
// (Immediate Action)" columns of its workbook Xid-Catalog.xlsx (sha256
// 7f70ce96..., as NVIDIA/NVSentinel embeds it;
// docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html shows it),
// kept in the tree apart from the table it checks. A newer catalog
// replaces the file and this hash together (docs/xid-policy.md names it);
// the test then holds the table to every row, however many.
constexpr char kCatalogFile[] = "/src/gpu/testdata/xid_catalog.csv";
constexpr char kCatalogSha256[] =
    "dc820bfe2ee6afdd7c8ba5ad4adfa3702c4da5e0eaec7b435761b3bf7173feb3";

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string hex;
  for (unsigned char c : digest) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return hex;
}

std::map<uint32_t, std::string> CatalogBuckets() {
  std::ifstream in(std::string(GPUHA_SOURCE_DIR) + kCatalogFile);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(Sha256Hex(text.str()), kCatalogSha256)
      << kCatalogFile << " changed: a newer catalog updates kCatalogSha256 and docs/xid-policy.md";
  std::map<uint32_t, std::string> out;
  int line = 0;
  for (absl::string_view row : absl::StrSplit(text.str(), '\n', absl::SkipEmpty())) {
    if (++line == 1) continue;  // xid,immediate_action
    std::pair<absl::string_view, absl::string_view> cells = absl::StrSplit(row, ',');
    uint32_t xid = 0;
    EXPECT_TRUE(absl::SimpleAtoi(cells.first, &xid)) << kCatalogFile << " line " << line;
    EXPECT_TRUE(out.emplace(xid, std::string(cells.second)).second) << "XID " << xid << " twice";
  }
  return out;
}

// Issue 39: the table covers the catalog's rows, each XID with its bucket.
// Issue 52: the rows come from the file, not a count pinned here.
TEST(XidCatalogTest, TheTableCoversNvidiasCatalogWithItsBuckets) {
  const std::map<uint32_t, std::string> catalog = CatalogBuckets();
  ASSERT_FALSE(catalog.empty());
  EXPECT_EQ(catalog.begin()->first, 1u);
  for (const auto& [xid, bucket] : catalog) {
    const XidInfo* info = FindXid(xid);
    ASSERT_NE(info, nullptr) << "XID " << xid << " is in NVIDIA's catalog, not in the table";
    EXPECT_EQ(info->nvidia_action, bucket) << "XID " << xid;
  }
  EXPECT_EQ(XidCatalog().size(), catalog.size());  // and nothing the catalog lacks
  // The XIDs known past it: not in it, each with its reason.
  for (const XidInfo& x : XidsAfterCatalog()) {
    EXPECT_EQ(catalog.count(x.xid), 0u) << "XID " << x.xid << " is in the catalog now";
    EXPECT_GT(x.xid, catalog.rbegin()->first);
    EXPECT_FALSE(x.note.empty()) << "XID " << x.xid;
  }
}

// Each bucket's consequence; a departure, or a choice where the catalog
// has no bucket, says why in the entry's note.
TEST(XidCatalogTest, ConsequencesFollowTheBucketsOrSayWhyNot) {
  const std::map<absl::string_view, XidConsequence> by_bucket = {
      {"IGNORE", XidConsequence::kIgnore},
      {"WORKFLOW_XID_45", XidConsequence::kIgnore},
      {"RESTART_APP", XidConsequence::kAlert},
      {"CONTACT_SUPPORT", XidConsequence::kAlert},
      {"UPDATE_SWFW", XidConsequence::kAlert},
      {"WORKFLOW_NVLINK_ERR", XidConsequence::kDrain},
      {"WORKFLOW_NVLINK5_ERR", XidConsequence::kDrain},
      {"XID_154", XidConsequence::kDrain},
      {"CHECK_MECHANICALS", XidConsequence::kDrain},
      {"CHECK_UVM", XidConsequence::kDrain},
      {"RESET_GPU", XidConsequence::kFailAndFence},
      {"WORKFLOW_XID_48", XidConsequence::kFailAndFence},
      {"RESTART_BM", XidConsequence::kFailAndFence},
      {"RESTART_VM", XidConsequence::kFailAndFence},
  };
  std::set<uint32_t> departs;
  for (const XidInfo& x : XidCatalog()) {
    EXPECT_FALSE(x.meaning.empty()) << x.xid;
    if (x.nvidia_action.empty()) {
      EXPECT_FALSE(x.note.empty()) << "XID " << x.xid << ": no bucket, and no reason for its own";
      continue;
    }
    auto it = by_bucket.find(x.nvidia_action);
    ASSERT_NE(it, by_bucket.end()) << x.nvidia_action;
    if (x.consequence != it->second) {
      departs.insert(x.xid);
      EXPECT_FALSE(x.note.empty()) << "XID " << x.xid << " departs from its bucket without a note";
    }
  }
  EXPECT_EQ(departs, std::set<uint32_t>{160});  // IGNORE in the catalog, an alert here
}

// The changed actions of issue 39: the engines' and copy engines' faults
// (RESTART_APP) and NVIDIA's IGNOREs that an unknown XID drained before;
// NVDEC1-7 as NVDEC0 (68).
TEST(XidCatalogTest, EngineFaultsAlertAndIgnoresAreIgnoredInsteadOfDraining) {
  for (uint32_t x : {11u,  25u,  39u,  40u,  41u,  60u,  70u,  71u,  72u,  75u,  76u, 77u,
                     80u,  82u,  83u,  84u,  85u,  86u,  88u,  89u,  96u,  97u,  98u, 99u,
                     100u, 101u, 102u, 103u, 104u, 105u, 126u, 130u, 135u, 139u, 68u}) {
    EXPECT_EQ(ConsequenceOf(x), XidConsequence::kAlert) << x;
    EXPECT_TRUE(IsApplicationXid(x)) << x;
  }
  for (uint32_t x :
       {14u, 37u, 44u, 66u, 67u, 93u, 106u, 107u, 108u, 137u, 141u, 152u, 153u, 157u, 161u}) {
    EXPECT_EQ(ConsequenceOf(x), XidConsequence::kIgnore) << x;
  }
  EXPECT_EQ(ConsequenceOf(151), XidConsequence::kFailAndFence);  // RESTART_VM: the node's
  EXPECT_TRUE(IsNodeXid(151));
  EXPECT_TRUE(IsNodeXid(79));
  EXPECT_FALSE(IsNodeXid(95));
  EXPECT_EQ(ConsequenceOf(169), XidConsequence::kFailAndFence);  // a halt, as 62
  EXPECT_EQ(ConsequenceOf(171), XidConsequence::kIgnore);        // XID 48's detail
  EXPECT_EQ(ConsequenceOf(4242), XidConsequence::kDrain);        // a newer driver's
  EXPECT_EQ(FindXid(4242), nullptr);
  EXPECT_EQ(FindXid(173), nullptr);
  // Issue 52: R620's memory sparing is known past the catalog: an alert.
  ASSERT_NE(FindXid(185), nullptr);
  EXPECT_EQ(ConsequenceOf(185), XidConsequence::kAlert);
}

// Issue 39: XID 154's actions as the drivers print them, by value; R610's
// words for 1 and 2; NVML's 6 and 7.
TEST(XidCatalogTest, Xid154ActionsByValue) {
  ASSERT_TRUE(Xid154Action(0).has_value());
  EXPECT_EQ(Xid154Action(0)->consequence, XidConsequence::kIgnore);
  EXPECT_EQ(Xid154Action(1)->consequence, XidConsequence::kFailAndFence);
  EXPECT_FALSE(Xid154Action(1)->node);
  EXPECT_EQ(Xid154Action(2)->consequence, XidConsequence::kFailAndFence);
  EXPECT_TRUE(Xid154Action(2)->node);
  EXPECT_EQ(Xid154Action(3)->consequence, XidConsequence::kDrain);
  EXPECT_FALSE(Xid154Action(3)->reset_after);
  EXPECT_EQ(Xid154Action(4)->consequence, XidConsequence::kDrain);  // drain, then reset
  EXPECT_TRUE(Xid154Action(4)->reset_after);
  EXPECT_EQ(Xid154Action(6)->consequence, XidConsequence::kFailAndFence);  // bus reset
  EXPECT_TRUE(Xid154Action(7)->node);                                      // system reboot
  EXPECT_FALSE(Xid154Action(8).has_value());
  EXPECT_EQ(Xid154ActionValue("Drain and Reset"), 4);
  EXPECT_EQ(Xid154ActionValue("PF FLR"), 1);
  EXPECT_EQ(Xid154ActionValue("OS Reboot"), 2);
  EXPECT_EQ(Xid154ActionValue("node reboot required"), 2);
  EXPECT_EQ(Xid154ActionValue("Reboot Twice"), -1);
}

// docs/xid-policy.md lists every XID with its bucket and gpuha's action,
// as the table has them.
TEST(XidCatalogTest, TheDocListsEveryXidAsTheTableHasIt) {
  std::ifstream in(std::string(GPUHA_SOURCE_DIR) + "/docs/xid-policy.md");
  ASSERT_TRUE(in.good());
  std::map<uint32_t, std::pair<std::string, std::string>> listed;  // bucket, action
  std::string line;
  while (std::getline(in, line)) {
    // "| 31 | GPU memory page fault ... | RESTART_APP | alert | ... |"
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    uint32_t xid = 0;
    if (cells.size() < 6 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(cells[1]), &xid)) {
      continue;
    }
    std::string bucket(absl::StripAsciiWhitespace(cells[3]));
    if (bucket == "-") bucket.clear();
    listed[xid] = {bucket, std::string(absl::StripAsciiWhitespace(cells[4]))};
  }
  std::vector<XidInfo> all(XidCatalog().begin(), XidCatalog().end());
  all.insert(all.end(), XidsAfterCatalog().begin(), XidsAfterCatalog().end());
  for (const XidInfo& x : all) {
    auto it = listed.find(x.xid);
    ASSERT_NE(it, listed.end()) << "docs/xid-policy.md does not list XID " << x.xid;
    EXPECT_EQ(it->second.first, x.nvidia_action) << "XID " << x.xid;
    EXPECT_EQ(it->second.second, XidConsequenceName(x.consequence)) << "XID " << x.xid;
  }
  EXPECT_EQ(listed.size(), all.size());
}

}  // namespace
}  // namespace gpuha::gpu
