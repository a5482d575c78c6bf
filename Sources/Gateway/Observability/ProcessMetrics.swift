import Foundation
import NIOConcurrencyHelpers
import Prometheus

#if canImport(Glibc)
import Glibc
#endif

/// The standard process metrics (Prometheus' names). `/proc/self/stat` (one small read) is
/// read at every scrape, so CPU time is current even on a scrape in the first second; the
/// descriptor count (a directory listing, costly with many connections) once a second, off
/// the event loops.
final class ProcessMetrics: Sendable {
    private let residentMemory: Prometheus.Gauge
    /// A counter, as Prometheus' convention has it: advanced by the CPU time read since the last
    /// read (`counted`), so `rate()` works on it.
    private let cpuSeconds: Prometheus.Counter
    private let counted = NIOLockedValueBox(0.0)
    private let openFDs: Prometheus.Gauge
    private let maxFDs: Prometheus.Gauge
    private let startTime: Prometheus.Gauge

    init(registry: PrometheusCollectorRegistry) {
        func name(_ n: String, _ help: String) -> MetricNameDescriptor { MetricNameDescriptor(namespace: "process", metricName: n, unitName: "", helpText: help) }
        residentMemory = registry.makeGauge(descriptor: name("resident_memory_bytes", "Resident memory size in bytes."))
        cpuSeconds = registry.makeCounter(descriptor: name("cpu_seconds_total", "Total user and system CPU time spent in seconds."))
        openFDs = registry.makeGauge(descriptor: name("open_fds", "Number of open file descriptors."))
        maxFDs = registry.makeGauge(descriptor: name("max_fds", "Maximum number of open file descriptors."))
        startTime = registry.makeGauge(descriptor: name("start_time_seconds", "Start time of the process since the Unix epoch in seconds."))
        collectStat()
        collectDescriptors()
        if let start = Self.statFields()?.field(22), let boot = Self.bootTime() { startTime.set(boot + start / Self.ticks) }
    }

    func collectStat() {
        guard let stat = Self.statFields() else { return }
        if let utime = stat.field(14), let stime = stat.field(15) {
            let total = (utime + stime) / Self.ticks
            let delta = counted.withLockedValue { counted -> Double in
                defer { counted = max(counted, total) }
                return max(0, total - counted)
            }
            if delta > 0 { cpuSeconds.increment(by: delta) }
        }
        if let rss = stat.field(24) { residentMemory.set(rss * Self.pageSize) }
    }

    private static let ticks = max(1, Double(sysconf(Int32(_SC_CLK_TCK))))
    private static let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))

    /// /proc/self/stat: the fields after the command's closing parenthesis; utime is field 14,
    /// stime 15, starttime 22, rss 24 (1-based, counting pid as 1).
    private struct StatFields {
        let fields: [Substring]
        func field(_ n: Int) -> Double? { fields.count > n - 3 ? Double(fields[n - 3]) : nil }
    }

    private static func statFields() -> StatFields? {
        guard let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return nil }
        return StatFields(fields: stat[stat.index(after: close)...].split(separator: " "))
    }

    func collectDescriptors() {
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") { openFDs.set(Double(entries.count)) }
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 { maxFDs.set(Double(limit.rlim_cur)) }
    }

    private static func bootTime() -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        return stat.split(separator: "\n").first { $0.hasPrefix("btime ") }.flatMap { Double($0.dropFirst(6).trimmingCharacters(in: .whitespaces)) }
    }
}
