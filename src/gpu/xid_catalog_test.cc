#include "gpu/xid_catalog.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpuha::gpu {
namespace {

// NVIDIA's XID catalog, bucket by bucket ("Resolution Bucket (Immediate
// Action)" of Xid-Catalog.xlsx, sha256 7f70ce96..., as NVIDIA/NVSentinel
// embeds it and docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
// shows it), written out here apart from the table it checks.
const std::map<std::string, std::string> kCatalogBuckets = {
    {"", "162-172"},
    {"CHECK_MECHANICALS", "54"},
    {"CHECK_UVM", "159"},
    {"CONTACT_SUPPORT",
     "1-7,9-10,12,15-24,26-30,33-36,42,47,49-53,55-59,61,65,73,81,87,90-91,111-118,122-125,138,"
     "142"},
    {"IGNORE", "14,37-38,43-44,63,66-67,92-93,106-108,121,137,141,152-153,157,160-161"},
    {"RESET_GPU", "46,62,64,95,109-110,119-120,136,140,143,155-156,158"},
    {"RESTART_APP", "8,11,13,25,31-32,39-41,60,68-72,75-77,80,82-86,88-89,94,96-105,126-135,139"},
    {"RESTART_BM", "79"},
    {"RESTART_VM", "151"},
    {"UPDATE_SWFW", "78"},
    {"WORKFLOW_NVLINK5_ERR", "144-150"},
    {"WORKFLOW_NVLINK_ERR", "74"},
    {"WORKFLOW_XID_45", "45"},
    {"WORKFLOW_XID_48", "48"},
    {"XID_154", "154"},
};

std::map<uint32_t, std::string> CatalogBuckets() {
  std::map<uint32_t, std::string> out;
  for (const auto& [bucket, list] : kCatalogBuckets) {
    for (absl::string_view part : absl::StrSplit(list, ',')) {
      std::pair<absl::string_view, absl::string_view> r = absl::StrSplit(part, '-');
      uint32_t from = 0, to = 0;
      EXPECT_TRUE(absl::SimpleAtoi(r.first, &from)) << part;
      if (r.second.empty()) {
        to = from;
      } else {
        EXPECT_TRUE(absl::SimpleAtoi(r.second, &to)) << part;
      }
      for (uint32_t x = from; x <= to; ++x) EXPECT_TRUE(out.emplace(x, bucket).second) << x;
    }
  }
  return out;
}

// Issue 39: the table covers the catalog's list, each XID with its bucket.
TEST(XidCatalogTest, TheTableCoversNvidiasCatalogWithItsBuckets) {
  const std::map<uint32_t, std::string> catalog = CatalogBuckets();
  ASSERT_EQ(catalog.size(), 172u);
  EXPECT_EQ(catalog.begin()->first, 1u);
  EXPECT_EQ(catalog.rbegin()->first, 172u);
  for (const auto& [xid, bucket] : catalog) {
    const XidInfo* info = FindXid(xid);
    ASSERT_NE(info, nullptr) << "XID " << xid << " is in NVIDIA's catalog, not in the table";
    EXPECT_EQ(info->nvidia_action, bucket) << "XID " << xid;
  }
  EXPECT_EQ(XidCatalog().size(), catalog.size());  // and nothing the catalog lacks
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
  for (const XidInfo& x : XidCatalog()) {
    auto it = listed.find(x.xid);
    ASSERT_NE(it, listed.end()) << "docs/xid-policy.md does not list XID " << x.xid;
    EXPECT_EQ(it->second.first, x.nvidia_action) << "XID " << x.xid;
    EXPECT_EQ(it->second.second, XidConsequenceName(x.consequence)) << "XID " << x.xid;
  }
  EXPECT_EQ(listed.size(), XidCatalog().size());
}

}  // namespace
}  // namespace gpuha::gpu
