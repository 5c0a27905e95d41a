// What `deepio bench --io_size ...` (ds_io mode) prints: ds_io's header lines (the argparse
// Namespace, the process-to-folder mapping), the result lines in Python's float repr, and the
// --json document (schema deepio.bench.ds_io/1). Pure string builders.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsio.hpp"
#include "group.hpp"
#include "json.hpp"

namespace deepio::cli {

/// A ds_io run as the user asked for it.
struct DsIoRequest {
  DsIoPlan plan;
  /// One entry per local process: folder, device label (from --folder x --multi_process, or
  /// --folder_to_device_mapping).
  std::vector<std::pair<std::string, std::string>> mapping;
  std::optional<std::string> folder;       ///< --folder
  std::vector<std::string> mapping_args;   ///< --folder_to_device_mapping, as given
  std::string multi_process = "1";         ///< as given
  std::optional<std::string> io_parallel;  ///< as given (None when absent)
};

/// block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism as members
/// of the open JSON object (every report's "config").
void handle_json_members(Json& j, const HandleOptions& h);

/// "args = Namespace(...)", "Successful validation ...", "Configuring <n> process to folder
/// mapping", "[i]: process <d> <----> <folder>" (d = the rank under MPI) and the "tid 0:"
/// settings line.
[[nodiscard]] std::string ds_io_header(const DsIoRequest& r, int processes, bool mpi);
/// deepio's "tid 0: backend ..." line, then ds_io's four Task/E2E Latency/Speed lines.
[[nodiscard]] std::string ds_io_result_text(const DsIoRequest& r, const DsIoTotals& t, const std::string& mpi_library);
/// With --gpu, how the device memory moved: "GPU memory staged through page-locked slots
/// (aio_handle)", or "gds_handle <mode>[: reason]; cuFile X%, staged Y%, files cuFile refused N".
/// "" without --gpu. Printed as a second "tid 0:" line.
[[nodiscard]] std::string gpu_summary(const DsIoPlan& p, const DsIoTotals& t);
/// The --json document.
[[nodiscard]] std::string ds_io_json(const DsIoRequest& r, const DsIoTotals& t, const std::vector<ProcReport>& reports,
                                     int processes, bool mpi, const std::string& version);

}  // namespace deepio::cli
