// `deepio info`: what deepio can do on this machine (lib/info.hpp gathers and formats it).
#include <cstdio>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "info.hpp"
#include "system.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio info";

ArgParser make_parser() {
  ArgParser parser(kProg,
                   "Show what deepio can do on this machine: version, backends and why one is or is not\n"
                   "usable, the file system and direct-I/O alignment of a folder, the memlock limit, and\n"
                   "whether CUDA, cuFile, MPI and fio were found (ds_report's async_io/gds lines included).");
  parser.value("--folder", "FOLDER", "Folder to inspect (default: where `deepio bench` would write)");
  parser.flag("--json", "Print one JSON object instead of text");
  return parser;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  const ArgParser parser = make_parser();
  std::vector<std::string> errors;
  ParsedArgs a;
  if (parse_or_help(parser, argc, argv, a, errors)) return 0;
  std::string folder = a.get("--folder");
  if (a.has("--folder")) {
    // A read-only folder can still be inspected.
    if (auto problem = folder_problem(folder); !problem.empty() && problem.find("not writable") == std::string::npos) {
      errors.push_back(problem);
    }
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  if (folder.empty()) folder = pick_disk_folder(nullptr);
  // Not `folder = "."`: GCC 12 warns there (-Wrestrict, a false positive).
  const InfoReport r = gather_info(folder.empty() ? std::string(".") : folder);
  std::fputs((a.has("--json") ? info_json(r) : info_text(r)).c_str(), stdout);
  return 0;
}

}  // namespace deepio::cli
