#include "device/cpu_load.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "device/cpu_threads.h"

namespace diffuse::device {
namespace {

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double own_cpu_s() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// The CPUs of this process's affinity mask when it is narrower than the machine, else none.
std::vector<int> pinned_cpus() {
  std::vector<int> ids;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return ids;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) ids.push_back(i);
  const long online = ::sysconf(_SC_NPROCESSORS_CONF);
  if (online > 0 && static_cast<long>(ids.size()) >= online) ids.clear();
#endif
  return ids;
}

std::string cpus_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

std::optional<CpuTimes> parse_proc_stat(const std::string& text, double ticks_per_s,
                                        const std::vector<int>& only) {
  if (!(ticks_per_s > 0)) return std::nullopt;
  CpuTimes t;
  size_t found = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string label;
    if (!(in >> label) || label.compare(0, 3, "cpu") != 0) continue;
    if (only.empty() ? label != "cpu" : label == "cpu") continue;
    if (!only.empty()) {  // "cpuN": wanted when N is one of ours
      const std::string id = label.substr(3);
      if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos || id.size() > 6)
        return std::nullopt;
      if (std::find(only.begin(), only.end(), std::stoi(id)) == only.end()) continue;
    }
    // user nice system idle iowait irq softirq steal: older kernels stop before steal.
    double f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int n = 0;
    for (; n < 8; ++n) {
      if (!(in >> f[n])) break;
      if (!(f[n] >= 0) || !std::isfinite(f[n])) return std::nullopt;
    }
    if (n < 4) return std::nullopt;
    t.busy_s += (f[0] + f[1] + f[2] + f[5] + f[6]) / ticks_per_s;
    t.steal_s += f[7] / ticks_per_s;
    ++found;
    if (only.empty()) break;
  }
  if (found == 0 || (!only.empty() && found != only.size())) return std::nullopt;
  return t;
}

std::optional<CpuTimes> sample_cpu_times() {
  std::ifstream in("/proc/stat");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  const long ticks = ::sysconf(_SC_CLK_TCK);
  auto t =
      parse_proc_stat(text.str(), ticks > 0 ? static_cast<double>(ticks) : 100.0, pinned_cpus());
  if (!t) return std::nullopt;
  t->wall_s = steady_now_s();
  t->self_s = own_cpu_s();
  t->cpus = available_cpus();
  return t;
}

}  // namespace diffuse::device

namespace diffuse {

double CpuShare::free() const {
  if (others < 0) return cpus;
  return std::max(0.0, cpus - others - std::max(0.0, steal));
}

bool CpuShare::crowded() const {
  return others >= 0 && threads > 1 && threads >= free() + 0.5;
}

}  // namespace diffuse

namespace diffuse::device {

CpuShare cpu_share_between(const CpuTimes& from, const CpuTimes& to, int threads) {
  CpuShare s;
  s.threads = threads;
  s.cpus = to.cpus;
  const double wall = to.wall_s - from.wall_s;
  if (!(wall > 0)) return s;
  // /proc/stat counts in ticks and getrusage does not, so over a short interval the difference
  // can be slightly negative; it also cannot exceed what the CPUs can hold.
  const double cap = static_cast<double>(std::max(to.cpus, 1));
  s.self = std::clamp((to.self_s - from.self_s) / wall, 0.0, cap);
  s.others = std::clamp((to.busy_s - from.busy_s) / wall - s.self, 0.0, cap);
  s.steal = std::clamp((to.steal_s - from.steal_s) / wall, 0.0, cap);
  return s;
}

nlohmann::json cpu_share_json(const CpuShare& share) {
  auto load_or_null = [](double cpus) -> nlohmann::json {
    if (cpus < 0) return nullptr;
    return std::round(cpus * 100) / 100;
  };
  return {{"threads", share.threads},
          {"cpus", share.cpus},
          {"other_processes", load_or_null(share.others)},
          {"hypervisor", load_or_null(share.steal)},
          {"crowded", share.crowded()}};
}

std::string describe_cpu_share(const CpuShare& s) {
  if (s.others < 0) return "CPU load of other processes unknown";
  std::string text =
      "other processes used " + cpus_text(s.others) + " of " + std::to_string(s.cpus) + " CPUs";
  if (s.steal >= 0.05) text += ", the hypervisor " + cpus_text(s.steal);
  return text;
}

CpuShareMeter::CpuShareMeter(int threads) : threads_(threads), start_(sample_cpu_times()) {}

CpuShare CpuShareMeter::share() const {
  auto end = sample_cpu_times();
  if (!start_ || !end) {
    CpuShare s;
    s.threads = threads_;
    s.cpus = available_cpus();
    return s;
  }
  return cpu_share_between(*start_, *end, threads_);
}

}  // namespace diffuse::device
