#include "gpu/xid_catalog.h"

#include <iterator>

#include "absl/strings/match.h"

namespace gpuha::gpu {
namespace {

using C = XidConsequence;

// Meanings and buckets follow NVIDIA's XID catalog ("Resolution Bucket
// (Immediate Action)", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
// its workbook as NVIDIA/NVSentinel embeds it). Buckets become consequences so:
//   IGNORE, WORKFLOW_XID_45 (follow the other XID)   ignore
//   RESTART_APP, CONTACT_SUPPORT, UPDATE_SWFW        alert: the GPU serves on
//     (an application's XID also restarts the node's own server when its
//     process faulted, and repeats on one GPU drain it: health.cc)
//   WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR,       drain: the GPU serves while
//     XID_154, CHECK_MECHANICALS, CHECK_UVM            its work moves (144-150
//     and 154: what the kernel log line says, when there is one)
//   RESET_GPU, WORKFLOW_XID_48                       fail-and-fence: the GPU is not
//                                                    to be trusted before a reset
//   RESTART_BM, RESTART_VM                           fail-and-fence, the node's
// The codes NVIDIA marks unused since Ampere keep CONTACT_SUPPORT (an alert):
// older boards (T4, V100) still log them. Where an entry departs from its
// bucket, or the catalog gives none (162-172), its note says what and why.
constexpr XidInfo kCatalog[] = {
    {1, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {2, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {3, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {4, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY)", C::kAlert,
     "CONTACT_SUPPORT"},
    {5, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW)", C::kAlert,
     "CONTACT_SUPPORT"},
    {6, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {7, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {8, "GPU stopped processing (idle timeout)", C::kAlert, "RESTART_APP"},
    {9, "Unused on Ampere+ (legacy ROBUST_CHANNEL_GR_ERROR_INSTANCE)", C::kAlert,
     "CONTACT_SUPPORT"},
    {10, "Unused on Ampere+ (legacy ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP)", C::kAlert,
     "CONTACT_SUPPORT"},
    {11, "Invalid/corrupted push buffer stream (missing HW)", C::kAlert, "RESTART_APP"},
    {12, "Unused on Ampere+ (legacy ROBUST_CHANNEL_GR_ERROR_SW_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {13, "Graphics engine exception (usually an application error)", C::kAlert, "RESTART_APP"},
    {14, "Fake/injected error from userspace", C::kIgnore, "IGNORE"},
    {15, "Unused on Ampere+ (legacy ROBUST_CHANNEL_SCANLINE_TIMEOUT)", C::kAlert,
     "CONTACT_SUPPORT"},
    {16, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT)", C::kAlert,
     "CONTACT_SUPPORT"},
    {17, "Unused on Ampere+ (legacy ROBUST_CHANNEL_PARAMETER_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {18, "Unused on Ampere+ (legacy ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {19, "Unused on Ampere+ (legacy ROBUST_CHANNEL_DISP_MISSED_NOTIFIER)", C::kAlert,
     "CONTACT_SUPPORT"},
    {20, "Unused on Ampere+ (legacy ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {21, "Unused on Ampere+ (legacy ROBUST_CHANNEL_ME_ERROR_SW_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {22, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VP_ERROR_SW_METHOD)", C::kAlert,
     "CONTACT_SUPPORT"},
    {23, "Unused on Ampere+ (legacy ROBUST_CHANNEL_RC_LOGGING_ENABLED)", C::kAlert,
     "CONTACT_SUPPORT"},
    {24, "Unused on Ampere+ (legacy ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT)", C::kAlert,
     "CONTACT_SUPPORT"},
    {25, "Invalid or illegal push buffer stream (GR illegal notify)", C::kAlert, "RESTART_APP"},
    {26, "Unused on Ampere+ (legacy ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT)", C::kAlert,
     "CONTACT_SUPPORT"},
    {27, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VP_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {28, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VP2_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {29, "Unused on Ampere+ (legacy ROBUST_CHANNEL_BSP_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {30, "Unused on Ampere+ (legacy ROBUST_CHANNEL_BAD_ADDR_ACCESS)", C::kAlert, "CONTACT_SUPPORT"},
    {31, "GPU memory page fault (usually an application error)", C::kAlert, "RESTART_APP"},
    {32, "Invalid or corrupted push buffer stream", C::kAlert, "RESTART_APP"},
    {33, "Unused on Ampere+ (legacy ROBUST_CHANNEL_SEC_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {34, "Unused on Ampere+ (legacy ROBUST_CHANNEL_MSVLD_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {35, "Unused on Ampere+ (legacy ROBUST_CHANNEL_MSPDEC_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {36, "Unused on Ampere+ (legacy ROBUST_CHANNEL_MSPPP_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {37, "Driver firmware error (FECS unimplemented firmware method)", C::kIgnore, "IGNORE"},
    {38, "Driver firmware (FECS) watchdog timeout", C::kIgnore, "IGNORE"},
    {39, "Copy engine CE0 exception", C::kAlert, "RESTART_APP"},
    {40, "Copy engine CE1 exception", C::kAlert, "RESTART_APP"},
    {41, "Copy engine CE2 exception", C::kAlert, "RESTART_APP"},
    {42, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VIC_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {43, "GPU stopped processing (user application fault)", C::kIgnore, "IGNORE"},
    {44, "Graphics engine fault during context switch", C::kIgnore, "IGNORE"},
    {45, "Preemptive cleanup after a previous error", C::kIgnore, "WORKFLOW_XID_45",
     "follows the XID beside it; alone, where Fabric Manager runs, an alert to restart it "
     "(health.cc)"},
    {46, "GPU timeout error", C::kFailAndFence, "RESET_GPU"},
    {47, "Unused on Ampere+ (legacy ROBUST_CHANNEL_NVENC0_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {48, "Double-bit ECC error (DBE); the GPU needs a reset", C::kFailAndFence, "WORKFLOW_XID_48"},
    {49, "Unused on Ampere+ (legacy SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY)", C::kAlert,
     "CONTACT_SUPPORT"},
    {50, "Unused on Ampere+ (legacy SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {51, "Unused on Ampere+ (legacy SILENT_RUNNING_STRESS_TEST_FAILURE)", C::kAlert,
     "CONTACT_SUPPORT"},
    {52, "Unused on Ampere+ (legacy SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE)", C::kAlert,
     "CONTACT_SUPPORT"},
    {53, "Unused on Ampere+ (legacy SILENT_RUNNING_TEMP_REDUCED_CLOCKING)", C::kAlert,
     "CONTACT_SUPPORT"},
    {54, "Auxiliary power not connected to the GPU board", C::kDrain, "CHECK_MECHANICALS",
     "CHECK_MECHANICALS: the board lacks power; drain while a person looks"},
    {55, "Unused on Ampere+ (legacy SILENT_RUNNING_TEMPERATURE_READ_ERROR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {56, "Unused on Ampere+ (legacy DISPLAY_CHANNEL_EXCEPTION)", C::kAlert, "CONTACT_SUPPORT"},
    {57, "Unused on Ampere+ (legacy FB_LINK_TRAINING_FAILURE_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {58, "Unused on Ampere+ (legacy FB_MEMORY_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {59, "Unused on Ampere+ (legacy PMU_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {60, "SEC2 / video processor exception", C::kAlert, "RESTART_APP"},
    {61, "Internal micro-controller breakpoint (unused since Ampere)", C::kAlert,
     "CONTACT_SUPPORT"},
    {62, "Internal micro-controller halt; the GPU needs a reset", C::kFailAndFence, "RESET_GPU"},
    {63, "ECC row remapping or page retirement recorded (common on healthy fleets)", C::kIgnore,
     "IGNORE"},
    {64, "ECC row remapping or page retirement failed", C::kFailAndFence, "RESET_GPU"},
    {65, "Unused on Ampere+ (legacy ROBUST_CHANNEL_NVENC1_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {66, "Illegal register access by driver (FECS reg access violation)", C::kIgnore, "IGNORE"},
    {67, "Illegal access by driver (FECS verif violation)", C::kIgnore, "IGNORE"},
    {68, "Video processor (NVDEC) exception", C::kAlert, "RESTART_APP"},
    {69, "Graphics engine class error", C::kAlert, "RESTART_APP"},
    {70, "Copy engine CE3 error", C::kAlert, "RESTART_APP"},
    {71, "Copy engine CE4 error", C::kAlert, "RESTART_APP"},
    {72, "Copy engine CE5 error", C::kAlert, "RESTART_APP"},
    {73, "Unused on Ampere+ (legacy ROBUST_CHANNEL_NVENC2_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {74, "NVLink error", C::kDrain, "WORKFLOW_NVLINK_ERR"},
    {75, "Copy engine CE6 error", C::kAlert, "RESTART_APP"},
    {76, "Copy engine CE7 error", C::kAlert, "RESTART_APP"},
    {77, "Copy engine CE8 error", C::kAlert, "RESTART_APP"},
    {78, "vGPU start error (guest/host mismatch, unsupported vGPU type)", C::kAlert, "UPDATE_SWFW",
     "UPDATE_SWFW: a vGPU guest could not start; the host serves on"},
    {79, "GPU has fallen off the bus", C::kFailAndFence, "RESTART_BM"},
    {80, "Corrupted data sent to GPU (pushbuffer CRC mismatch)", C::kAlert, "RESTART_APP"},
    {81, "Unused on Ampere+ (legacy ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR)", C::kAlert,
     "CONTACT_SUPPORT"},
    {82, "NVJPG0 error", C::kAlert, "RESTART_APP"},
    {83, "NVDEC1 error", C::kAlert, "RESTART_APP"},
    {84, "NVDEC2 error", C::kAlert, "RESTART_APP"},
    {85, "Copy engine CE9 error", C::kAlert, "RESTART_APP"},
    {86, "OFA (optical flow) engine exception", C::kAlert, "RESTART_APP"},
    {87, "Unused on Ampere+ (legacy NVTELEMETRY_DRIVER_REPORT)", C::kAlert, "CONTACT_SUPPORT"},
    {88, "NVDEC3 error", C::kAlert, "RESTART_APP"},
    {89, "NVDEC4 error", C::kAlert, "RESTART_APP"},
    {90, "Unused on Ampere+ (legacy LTC_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {91, "Unused on Ampere+ (legacy RESERVED_XID)", C::kAlert, "CONTACT_SUPPORT"},
    {92, "High single-bit ECC error rate", C::kIgnore, "IGNORE"},
    {93, "InfoROM provisioned wear/erase limit exceeded (non-fatal)", C::kIgnore, "IGNORE"},
    {94, "Contained ECC error; affected applications restart, reset when convenient", C::kAlert,
     "RESTART_APP"},
    {95, "Uncontained ECC error; every application on the GPU is affected", C::kFailAndFence,
     "RESET_GPU"},
    {96, "NVDEC5 error", C::kAlert, "RESTART_APP"},
    {97, "NVDEC6 error", C::kAlert, "RESTART_APP"},
    {98, "NVDEC7 error", C::kAlert, "RESTART_APP"},
    {99, "NVJPG1 error", C::kAlert, "RESTART_APP"},
    {100, "NVJPG2 error", C::kAlert, "RESTART_APP"},
    {101, "NVJPG3 error", C::kAlert, "RESTART_APP"},
    {102, "NVJPG4 error", C::kAlert, "RESTART_APP"},
    {103, "NVJPG5 error", C::kAlert, "RESTART_APP"},
    {104, "NVJPG6 error", C::kAlert, "RESTART_APP"},
    {105, "NVJPG7 error", C::kAlert, "RESTART_APP"},
    {106, "SMBPBI test message", C::kIgnore, "IGNORE"},
    {107, "SMBPBI test message (silent)", C::kIgnore, "IGNORE"},
    {108, "NVLink remote translation error (catalog: unused)", C::kIgnore, "IGNORE"},
    {109, "Context switch timeout", C::kFailAndFence, "RESET_GPU"},
    {110, "Security fault", C::kFailAndFence, "RESET_GPU"},
    {111, "Unused on Ampere+ (legacy BUNDLE_ERROR_EVENT)", C::kAlert, "CONTACT_SUPPORT"},
    {112, "Unused on Ampere+ (legacy DISP_SUPERVISOR_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {113, "Unused on Ampere+ (legacy DP_LT_FAILURE)", C::kAlert, "CONTACT_SUPPORT"},
    {114, "Unused on Ampere+ (legacy HEAD_RG_UNDERFLOW)", C::kAlert, "CONTACT_SUPPORT"},
    {115, "Unused on Ampere+ (legacy CORE_CHANNEL_REGS)", C::kAlert, "CONTACT_SUPPORT"},
    {116, "Unused on Ampere+ (legacy WINDOW_CHANNEL_REGS)", C::kAlert, "CONTACT_SUPPORT"},
    {117, "Unused on Ampere+ (legacy CURSOR_CHANNEL_REGS)", C::kAlert, "CONTACT_SUPPORT"},
    {118, "Unused on Ampere+ (legacy HEAD_REGS)", C::kAlert, "CONTACT_SUPPORT"},
    {119, "GSP RPC timeout; the GPU needs a reset", C::kFailAndFence, "RESET_GPU"},
    {120, "GSP error; the GPU needs a reset", C::kFailAndFence, "RESET_GPU"},
    {121, "C2C link corrected error", C::kIgnore, "IGNORE"},
    {122, "Unused on Ampere+ (legacy SPI_PMU_RPC_READ_FAIL)", C::kAlert, "CONTACT_SUPPORT"},
    {123, "Unused on Ampere+ (legacy SPI_PMU_RPC_WRITE_FAIL)", C::kAlert, "CONTACT_SUPPORT"},
    {124, "Unused on Ampere+ (legacy SPI_PMU_RPC_ERASE_FAIL)", C::kAlert, "CONTACT_SUPPORT"},
    {125, "Unused on Ampere+ (legacy INFOROM_FS_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {126, "Copy engine CE10 error", C::kAlert, "RESTART_APP"},
    {127, "Copy engine CE11 error", C::kAlert, "RESTART_APP"},
    {128, "Copy engine CE12 error", C::kAlert, "RESTART_APP"},
    {129, "Copy engine CE13 error", C::kAlert, "RESTART_APP"},
    {130, "Copy engine CE14 error", C::kAlert, "RESTART_APP"},
    {131, "Copy engine CE15 error", C::kAlert, "RESTART_APP"},
    {132, "Copy engine CE16 error", C::kAlert, "RESTART_APP"},
    {133, "Copy engine CE17 error", C::kAlert, "RESTART_APP"},
    {134, "Copy engine CE18 error", C::kAlert, "RESTART_APP"},
    {135, "Copy engine CE19 error", C::kAlert, "RESTART_APP"},
    {136, "Link training failed", C::kFailAndFence, "RESET_GPU"},
    {137, "NVLink privilege error (illegal P2P access seen by remote MMU)", C::kIgnore, "IGNORE"},
    {138, "Unused on Ampere+ (legacy ROBUST_CHANNEL_DLA_ERROR)", C::kAlert, "CONTACT_SUPPORT"},
    {139, "OFA1 engine error", C::kAlert, "RESTART_APP"},
    {140, "Unrecovered ECC error", C::kFailAndFence, "RESET_GPU"},
    {141, "CUDA fast-path error", C::kIgnore, "IGNORE"},
    {142, "NVENC3 error", C::kAlert, "CONTACT_SUPPORT"},
    {143, "GPU initialisation error", C::kFailAndFence, "RESET_GPU"},
    {144, "NVLink5 SAW error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {145, "NVLink5 RLW error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {146, "NVLink5 TLW error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {147, "NVLink5 TREX error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {148, "NVLink5 NVLPW_CTRL error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {149, "NVLink5 NETIR error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {150, "NVLink5 MSE error", C::kDrain, "WORKFLOW_NVLINK5_ERR",
     "the kernel log line is decoded (DecodeNvlink5); without it NVML's recovery action, else a "
     "drain"},
    {151, "Key rotation error (confidential computing)", C::kFailAndFence, "RESTART_VM",
     "RESTART_VM: the node (a VM) restarts"},
    {152, "DLA SMMU error", C::kIgnore, "IGNORE"},
    {153, "DLA timeout", C::kIgnore, "IGNORE"},
    {154, "GPU recovery action changed (reset or reboot required)", C::kDrain, "XID_154",
     "the action its kernel log line or NVML's recovery-action field names (Xid154Action); without "
     "either a drain"},
    {155, "NVLink software-defined error (link taken down)", C::kFailAndFence, "RESET_GPU"},
    {156, "Resource retirement event", C::kFailAndFence, "RESET_GPU"},
    {157, "Resource retirement failure (no spare resources)", C::kIgnore, "IGNORE"},
    {158, "GPU fatal timeout", C::kFailAndFence, "RESET_GPU"},
    {159, "CHI non-data error (C2C-linked GPU)", C::kDrain, "CHECK_UVM",
     "CHECK_UVM: RESET_GPU where UVM or vGPU is used (nvidia_uvm or nvidia_vgpu_vfio loaded), else "
     "IGNORE; not known: drain"},
    {160, "Channel retirement event", C::kAlert, "IGNORE",
     "the catalog says IGNORE; NVSentinel once rebooted for it: an alert, nothing moves on a "
     "disputed entry"},
    {161, "Channel retirement failure", C::kIgnore, "IGNORE"},
    {162, "Power-smoothing circuitry re-engaged (PSHC_REENGAGED)", C::kAlert, "",
     "no bucket in the catalog: a power-smoothing state change, not a fault"},
    {163, "Power-smoothing HW circuitry disengaged", C::kAlert, "",
     "no bucket: power smoothing off (reload the driver or reset the GPU if by timeout)"},
    {164, "Power-smoothing HW circuitry low lifetime", C::kAlert, "",
     "no bucket: power-smoothing circuitry wearing out"},
    {165, "Power-smoothing HW circuitry lifetime exhausted", C::kAlert, "",
     "no bucket: power-smoothing circuitry worn out"},
    {166, "NVLink encrypted (CC) traffic before link configured", C::kAlert, "",
     "no bucket: confidential-computing mode only"},
    {167, "PCIe fatal timeout", C::kDrain, "",
     "no bucket: a fatal PCIe timeout; drain, as an XID not in the table"},
    {168, "Reduced GPU memory capacity (errors in WPR; ECC off)", C::kAlert, "",
     "no bucket: less memory than the board has (ECC off); serves on"},
    {169, "SEC2 micro-controller halt", C::kFailAndFence, "",
     "no bucket: a micro-controller halt, as XID 62 (RESET_GPU)"},
    {170, "NVLink secure/CC-mode interrupt", C::kAlert, "",
     "no bucket: confidential-computing mode only"},
    {171, "Uncorrectable DRAM error (detail for XID 48)", C::kIgnore, "",
     "no bucket: the detail of an XID 48, which carries the verdict"},
    {172, "Uncorrectable SRAM error (detail for XID 48)", C::kIgnore, "",
     "no bucket: the detail of an XID 48, which carries the verdict"},
};

// XIDs newer drivers report that the catalog (1-172) does not list yet,
// each with what gpuha does and why; any other XID past the catalog drains.
constexpr XidInfo kAfterCatalog[] = {
    {185, "Memory sparing event (R620 drivers)", C::kAlert, "",
     "not in the catalog: spare memory took a failing row's place, as a row remap does (XID 63, "
     "IGNORE); an alert, the GPU serves on"},
};

// The catalog lists XIDs 1-172 in order, one each: an XID is its index + 1.
constexpr bool InOrderFromOne() {
  for (size_t i = 0; i < std::size(kCatalog); ++i) {
    if (kCatalog[i].xid != i + 1) return false;
  }
  return true;
}
static_assert(InOrderFromOne(), "kCatalog must list XIDs 1, 2, 3, ... in order");

}  // namespace

absl::string_view XidConsequenceName(XidConsequence c) {
  switch (c) {
    case C::kIgnore:
      return "ignore";
    case C::kAlert:
      return "alert";
    case C::kDrain:
      return "drain";
    case C::kFailAndFence:
      return "fail-and-fence";
  }
  return "alert";
}

std::span<const XidInfo> XidCatalog() { return kCatalog; }

std::span<const XidInfo> XidsAfterCatalog() { return kAfterCatalog; }

const XidInfo* FindXid(uint32_t xid) {
  if (xid >= 1 && xid <= std::size(kCatalog)) return &kCatalog[xid - 1];
  for (const XidInfo& x : kAfterCatalog) {
    if (x.xid == xid) return &x;
  }
  return nullptr;
}

XidConsequence ConsequenceOf(uint32_t xid) {
  const XidInfo* info = FindXid(xid);
  // An XID this table does not know (a newer driver's) drains: the work
  // moves without a request lost, and the reason names it for an operator.
  return info != nullptr ? info->consequence : C::kDrain;
}

bool IsApplicationXid(uint32_t xid) {
  const XidInfo* info = FindXid(xid);
  return info != nullptr && info->nvidia_action == "RESTART_APP";
}

bool IsNodeXid(uint32_t xid) {
  const XidInfo* info = FindXid(xid);
  return info != nullptr &&
         (info->nvidia_action == "RESTART_BM" || info->nvidia_action == "RESTART_VM");
}

bool XidNeedsKernelLine(uint32_t xid) {
  return IsApplicationXid(xid) || xid == 154 || xid == 45 || (xid >= 144 && xid <= 150);
}

namespace {

struct KnownAction {
  int value;
  absl::string_view names[2];  // R565-R595's words; R610's where they differ
  RecoveryAction action;
};
// What each value asks, by NVIDIA's GPU memory error recovery guide
// (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt) and NVML's
// nvmlGpuRecoveryAction_t.
constexpr KnownAction kRecoveryActions[] = {
    {0, {"None"}, {"None", C::kIgnore}},
    {1, {"GPU Reset Required", "PF FLR"}, {"GPU Reset Required", C::kFailAndFence}},
    {2, {"Node Reboot Required", "OS Reboot"}, {"Node Reboot Required", C::kFailAndFence, true}},
    {3, {"Drain P2P"}, {"Drain P2P", C::kDrain}},
    {4, {"Drain and Reset"}, {"Drain and Reset", C::kDrain, false, true}},
    {5, {"Recover IMEX Domain"}, {"Recover IMEX Domain", C::kDrain}},
    {6, {"Bus Reset"}, {"Bus Reset", C::kFailAndFence}},
    {7, {"System Reboot"}, {"System Reboot", C::kFailAndFence, true}},
};

}  // namespace

std::optional<RecoveryAction> Xid154Action(int value) {
  for (const KnownAction& k : kRecoveryActions) {
    if (k.value == value) return k.action;
  }
  return std::nullopt;
}

int Xid154ActionValue(absl::string_view name) {
  for (const KnownAction& k : kRecoveryActions) {
    for (absl::string_view n : k.names) {
      if (!n.empty() && absl::EqualsIgnoreCase(n, name)) return k.value;
    }
  }
  return -1;
}

}  // namespace gpuha::gpu
