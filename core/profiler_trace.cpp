// Profiler::write_trace: the records as a Chrome / Perfetto trace (JSON, one complete
// event per op, one track per stream or CPU thread).
#include "core/profiler.h"

#include <cstdio>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/json.h"

namespace tg {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string shapes_json(const std::vector<Shape>& shapes) {
  std::string s = "[";
  for (size_t i = 0; i < shapes.size(); ++i) {
    s += i ? ",[" : "[";
    for (size_t j = 0; j < shapes[i].dims().size(); ++j) {
      if (j) s += ',';
      s += std::to_string(shapes[i].dims()[j]);
    }
    s += "]";
  }
  return s + "]";
}

}  // namespace

void Profiler::write_trace(const std::string& path) {
  const std::vector<Record>& recs = records();
  // Tracks: GPU d is tid d + 1 (its tapegrad stream), CPU thread k is tid 1000 + k.
  auto tid = [](const Record& r) { return r.device.is_cuda() ? r.device.index + 1 : 1000 + r.thread; };
  std::map<int, std::string> tracks;
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  for (const Record& r : recs) {
    if (r.ms < 0) continue;
    const int t = tid(r);
    if (!tracks.count(t))
      tracks[t] = r.device.is_cuda() ? r.device.str() + " (tapegrad stream)" : "cpu thread " + std::to_string(r.thread);
    out += first ? "\n" : ",\n";
    first = false;
    // Op names come from user code (record(), an optimizer's name()): the trace must parse
    // whatever bytes they hold.
    out += "{\"name\":" + json::quote(json::with_replacement_characters(r.op)) + ",\"cat\":\"" +
           profile::phase_name(r.phase) + "\",\"ph\":\"X\",\"pid\":0,\"tid\":" + std::to_string(t) +
           ",\"ts\":" + fmt("%.3f", r.start_us) +
           ",\"dur\":" + fmt("%.3f", r.ms * 1e3) + ",\"args\":{\"phase\":\"" + profile::phase_name(r.phase) +
           "\",\"device\":\"" + r.device.str() + "\",\"shapes\":" + shapes_json(r.input_shapes) +
           ",\"flops\":" + fmt("%.17g", r.flops) + ",\"bytes\":" + fmt("%.17g", r.bytes) + "}}";
  }
  for (const auto& [t, name] : tracks) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(t) +
           ",\"args\":{\"name\":" + json::quote(name) + "}}";
  }
  out += "\n]}\n";
  std::ofstream f(path, std::ios::binary);
  TG_CHECK_AS(IOError, f.good(), "Profiler::write_trace: cannot open ", path, " for writing");
  f << out;
  f.close();
  TG_CHECK_AS(IOError, f.good(), "Profiler::write_trace: failed writing ", path);
}

}  // namespace tg
