// What makes `deepio bench`'s device ceiling honest: the request a device takes in one piece
// and the buffers that keep a request in one piece.
//
// A direct request is one DMA segment per physically contiguous run of its buffer; a device
// whose queue takes fewer segments than a request has pages (this VM's virtio disk: 254; a
// 1 MiB request from 4 KiB pages needs 256) splits it, so a ceiling measured with ordinary
// buffers can sit far below what the device does with huge-page buffers. The ceiling is
// therefore measured with huge pages: fio's --mem=shmhuge from the hugetlb pool (its free pages,
// or pages reserved for the run and given back), or the raw loop on the same page-locked,
// transparent-huge-page buffers deepio uses (thp_bytes says how much of them really is).
//
// judge_against_ceiling, parse_hugepage_pool and fio_huge_pages_needed are pure; the rest read /proc and /sys and never
// throw. HugePageLoan writes vm.nr_hugepages only when it reserves, and undoes exactly its own
// change (also at exit and on SIGINT/SIGTERM/SIGHUP, through system.hpp's clean-up).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace deepio::cli {

/// Where a measured figure stands against the ceiling measured in the same run.
enum class CeilingStanding {
  None,       ///< no ceiling to compare with (not measured, or every sample zero: it failed)
  Below,      ///< under every ceiling sample: `percent` of the ceiling's median is the result
  AtCeiling,  ///< within the ceiling's own spread, or above its fastest sample by no more than the noise margin
  Above,      ///< beyond every ceiling sample by more than the noise margin: a measurement problem
};
[[nodiscard]] const char* to_string(CeilingStanding s) noexcept;  ///< "none", "below", "at_ceiling", "above"

/// The noise margin's floor, as a fraction of the fastest ceiling sample: what one device
/// drifts between runs even when the ceiling's samples happen to agree (one sample, or two
/// close ones). One rule for the whole table: deepio, the naive copy and the GPU disk rows
/// (compare.hpp's row_verdict).
inline constexpr double kCeilingNoise = 0.10;

struct CeilingVerdict {
  CeilingStanding standing = CeilingStanding::None;
  double percent = 0;     ///< 100 x figure / the ceiling's median (Below and AtCeiling; else 0)
  double lo = 0, hi = 0;  ///< the slowest and fastest ceiling samples (GiB/s)
  double limit = 0;       ///< hi + margin: a figure above it is flagged
  std::string reason;     ///< Above: one short sentence saying why; else empty
  /// Above, and the ceiling itself is known to be low (its 4 KiB-page buffers are split by the
  /// device): the figure stands, the comparison does not (set by compare.cpp's ceiling_verdict).
  bool ceiling_low = false;
  [[nodiscard]] bool flagged() const noexcept { return standing == CeilingStanding::Above; }
};

/// The ceiling rule of `deepio bench`. `samples` are the ceiling's GiB/s per run; samples of
/// zero or less (a failed run) are ignored, and none left means None. Of the rest, lo and hi
/// are the slowest and fastest; margin = max(hi - lo, kCeilingNoise x hi), the spread the
/// device showed in this very run, but never less than its usual drift. Then:
///   figure > hi + margin  -> Above, reason "above every ceiling sample (lo-hi GiB/s) by more
///                            than their noise margin (limit GiB/s)";
///   figure >= lo          -> AtCeiling (percent of the median kept for JSON);
///   otherwise             -> Below, percent = 100 x figure / median.
/// Medians of an even count are the mean of the middle two.
[[nodiscard]] CeilingVerdict judge_against_ceiling(double figure, std::span<const double> samples);

/// The block queue behind a path (the whole disk for a partition). 0 = unknown.
struct QueueLimits {
  std::string device;  ///< "vda", or empty when the path is not on a block device
  std::uint64_t max_segments = 0;
  std::uint64_t max_sectors_kb = 0;
};
[[nodiscard]] QueueLimits queue_limits_of(const std::string& path);

/// The default hugetlb pool (/proc/meminfo): page size and counts of pages.
struct HugePagePool {
  std::uint64_t page_bytes = 0;  ///< Hugepagesize; 0 when the kernel has no hugetlb
  std::uint64_t total = 0, free = 0, reserved = 0;
  /// Pages nobody has claimed yet (free and not reserved by a mapping).
  [[nodiscard]] std::uint64_t available() const noexcept { return free > reserved ? free - reserved : 0; }
};
[[nodiscard]] HugePagePool parse_hugepage_pool(std::string_view meminfo);
[[nodiscard]] HugePagePool read_hugepage_pool();

/// Huge pages fio needs for --mem=shmhuge: each of `numjobs` jobs maps iodepth x block_size
/// bytes (plus fio's alignment slack), rounded up to whole pages; one page spare per job.
[[nodiscard]] std::uint64_t fio_huge_pages_needed(std::size_t block_size, std::size_t iodepth, std::size_t numjobs,
                                                  std::uint64_t page_bytes);

/// `pages` hugetlb pages for the length of a run: the pool's free pages when there are enough,
/// else (when `may_reserve` and vm.nr_hugepages is writable) that many added to the pool and
/// taken away again by the destructor. Move-only.
class HugePageLoan {
 public:
  HugePageLoan() = default;
  static HugePageLoan obtain(std::uint64_t pages, bool may_reserve);
  ~HugePageLoan();
  HugePageLoan(HugePageLoan&& o) noexcept;
  HugePageLoan& operator=(HugePageLoan&& o) noexcept;
  HugePageLoan(const HugePageLoan&) = delete;
  HugePageLoan& operator=(const HugePageLoan&) = delete;

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::uint64_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] std::uint64_t added() const noexcept { return added_; }  ///< pages this loan reserved
  /// "18 free hugetlb pages of 2 MiB" / "18 hugetlb pages of 2 MiB reserved for this run
  /// (vm.nr_hugepages 0 -> 18) and given back"; when !ok(): why there are none.
  [[nodiscard]] const std::string& description() const noexcept { return what_; }
  void give_back() noexcept;  ///< the destructor's work, now

 private:
  bool ok_ = false;
  std::uint64_t page_bytes_ = 0, added_ = 0;
  std::string what_;
};

/// Bytes of [p, p + n) backed by transparent huge pages, from /proc/self/smaps (each mapping's
/// AnonHugePages spread over it in proportion to the overlap). 0 when smaps cannot be read.
[[nodiscard]] std::uint64_t thp_bytes(const void* p, std::size_t n);

}  // namespace deepio::cli
