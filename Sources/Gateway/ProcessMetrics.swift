import Foundation
import Prometheus

#if canImport(Glibc)
import Glibc
#endif

/// The standard process metrics (Prometheus' names), read from /proc once a second.
final class ProcessMetrics: Sendable {
    private let residentMemory: Prometheus.Gauge
    private let cpuSeconds: Prometheus.Gauge
    private let openFDs: Prometheus.Gauge
    private let maxFDs: Prometheus.Gauge
    private let startTime: Prometheus.Gauge

    init(registry: PrometheusCollectorRegistry) {
        func name(_ n: String, _ help: String) -> MetricNameDescriptor { MetricNameDescriptor(namespace: "process", metricName: n, unitName: "", helpText: help) }
        residentMemory = registry.makeGauge(descriptor: name("resident_memory_bytes", "Resident memory size in bytes."))
        // A counter in Prometheus' convention; kept as a gauge here because it is read, not counted.
        cpuSeconds = registry.makeGauge(descriptor: name("cpu_seconds_total", "Total user and system CPU time spent in seconds."))
        openFDs = registry.makeGauge(descriptor: name("open_fds", "Number of open file descriptors."))
        maxFDs = registry.makeGauge(descriptor: name("max_fds", "Maximum number of open file descriptors."))
        startTime = registry.makeGauge(descriptor: name("start_time_seconds", "Start time of the process since the Unix epoch in seconds."))
        collect()
    }

    func collect() {
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))
        // /proc/self/stat: fields after the command's closing parenthesis; utime is field 14,
        // stime 15, starttime 22, rss 24 (1-based, counting pid as 1).
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            func field(_ n: Int) -> Double? { fields.count > n - 3 ? Double(fields[n - 3]) : nil }
            if let utime = field(14), let stime = field(15), ticks > 0 { cpuSeconds.set((utime + stime) / ticks) }
            if let rss = field(24) { residentMemory.set(rss * pageSize) }
            if let start = field(22), ticks > 0, let boot = Self.bootTime() { startTime.set(boot + start / ticks) }
        }
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") { openFDs.set(Double(entries.count)) }
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 { maxFDs.set(Double(limit.rlim_cur)) }
    }

    private static func bootTime() -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        return stat.split(separator: "\n").first { $0.hasPrefix("btime ") }.flatMap { Double($0.dropFirst(6).trimmingCharacters(in: .whitespaces)) }
    }
}

/// What `sessiongate --version` and `sessiongate_build_info` report.
public enum BuildInfo {
    public static let version = "0.10.0"
    public static var swift: String {
        #if swift(>=6.3)
        return "6.3"
        #elseif swift(>=6.2)
        return "6.2"
        #elseif swift(>=6.1)
        return "6.1"
        #else
        return "6.0"
        #endif
    }
}
