// `deepio info`: what deepio can do on this machine (lib/info.hpp gathers and formats it).
#include <cstdio>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "info.hpp"
#include "kv_info.hpp"
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
  parser.list("--kv", "FOLDER",
              "Instead: a deepio.kv store's folders (layout, capacity, pages, free slots, last checkpoint, "
              "the process holding it), read-only and without its lock: safe while a server runs the store");
  parser.flag("--scan", "With --kv: read every slot header to count the pages put since the last checkpoint too");
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
  if (a.has("--scan") && !a.has("--kv")) errors.emplace_back("--scan goes with --kv");
  if (!errors.empty()) return print_errors(kProg, errors);
  if (a.has("--kv")) {
    std::vector<kv::FolderReport> folders;
    for (const std::string& f : a.list("--kv")) folders.push_back(kv::inspect_folder(f, a.has("--scan")));
    std::fputs((a.has("--json") ? kv_info_json(folders) : kv_info_text(folders)).c_str(), stdout);
    for (const kv::FolderReport& f : folders) {
      if (f.meta_format == 0) return 1;  // not a store's folder
    }
    return 0;
  }
  if (folder.empty()) folder = pick_disk_folder(nullptr);
  // Not `folder = "."`: GCC 12 warns there (-Wrestrict, a false positive).
  const InfoReport r = gather_info(folder.empty() ? std::string(".") : folder);
  std::fputs((a.has("--json") ? info_json(r) : info_text(r)).c_str(), stdout);
  return 0;
}

}  // namespace deepio::cli
