#include "kv_info.hpp"

#include <cstdio>

#include "format.hpp"
#include "json.hpp"

namespace deepio::cli {

namespace {

std::string held_text(const kv::FolderReport& f) {
  return f.held_by_pid ? "open in process " + std::to_string(*f.held_by_pid) : "not open (no process holds its lock)";
}

}  // namespace

std::string kv_info_text(const std::vector<kv::FolderReport>& folders) {
  std::string out;
  char line[512];
  for (const kv::FolderReport& f : folders) {
    out += "deepio.kv folder " + f.folder + "\n";
    if (!f.problem.empty() && f.meta_format == 0) {
      out += "  problem:     " + f.problem + "\n  in use:      " + held_text(f) + "\n";
      continue;
    }
    std::snprintf(
        line, sizeof line, "  layout:      %llu slots of %s pages (%s a slot), %llu slab file%s, kv.meta format %u\n",
        static_cast<unsigned long long>(f.slots), human_bytes(f.page_bytes).c_str(), human_bytes(f.slot_bytes).c_str(),
        static_cast<unsigned long long>(f.slabs), f.slabs == 1 ? "" : "s", f.meta_format);
    out += line;
    out += "  capacity:    " + human_bytes(f.capacity_bytes) + " of pages, " + human_bytes(f.disk_bytes) + " on disk\n";
    out += "  fingerprint: " + (f.fingerprint.empty() ? std::string("(none)") : "\"" + f.fingerprint + "\"") + "\n";
    std::snprintf(line, sizeof line, "  pages:       %llu live, %llu free slots (%s)\n",
                  static_cast<unsigned long long>(f.pages), static_cast<unsigned long long>(f.free_slots),
                  f.scanned ? "every slot header read" : "as of the last checkpoint; --scan reads every header");
    out += line;
    if (f.checkpoint) {
      std::snprintf(line, sizeof line, "  checkpoint:  %.0f s ago, %llu pages listed, generation bound %llu\n",
                    f.checkpoint_age_seconds, static_cast<unsigned long long>(f.checkpoint_pages),
                    static_cast<unsigned long long>(f.checkpoint_bound));
      out += line;
    } else {
      out += "  checkpoint:  " + f.checkpoint_problem + "\n";
    }
    if (f.scanned) {
      out += "  headers:     " + std::to_string(f.unreadable_headers) + " not whole (never written or torn)\n";
    }
    if (!f.problem.empty()) out += "  problem:     " + f.problem + "\n";
    out += "  in use:      " + held_text(f) + "\n";
  }
  return out;
}

std::string kv_info_json(const std::vector<kv::FolderReport>& folders) {
  Json j;
  j.begin_object();
  j.value("schema", "deepio.info.kv/1");
  j.begin_array("folders");
  for (const kv::FolderReport& f : folders) {
    j.begin_object();
    j.value("folder", f.folder);
    if (f.problem.empty()) {
      j.null("problem");
    } else {
      j.value("problem", f.problem);
    }
    j.value("meta_format", static_cast<std::uint64_t>(f.meta_format));
    j.value("page_bytes", f.page_bytes);
    j.value("slot_bytes", f.slot_bytes);
    j.value("slots", f.slots);
    j.value("slabs", f.slabs);
    j.value("capacity_bytes", f.capacity_bytes);
    j.value("disk_bytes", f.disk_bytes);
    j.value("fingerprint", f.fingerprint);
    j.value("generation_floor", f.generation_floor);
    j.value("checkpoint", f.checkpoint);
    j.value_or_null("checkpoint_age_seconds", f.checkpoint_age_seconds, f.checkpoint);
    j.value("checkpoint_pages", f.checkpoint_pages);
    j.value("checkpoint_bound", f.checkpoint_bound);
    j.value("scanned", f.scanned);
    j.value("pages", f.pages);
    j.value("free_slots", f.free_slots);
    j.value("unreadable_headers", f.unreadable_headers);
    if (f.held_by_pid) {
      j.value("held_by_pid", *f.held_by_pid);
    } else {
      j.null("held_by_pid");
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace deepio::cli
