import HTTPProxy
import NIOConcurrencyHelpers
import Prometheus

/// Every metric the gateway exports, declared in one place, with bounded labels (route name,
/// status class, error kind — never a user or a session). Served on the admin listener.
public final class GatewayMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    private let requests = NIOLockedValueBox<[String: Prometheus.Counter]>([:])
    private let latency = NIOLockedValueBox<[String: DurationHistogram]>([:])
    private let upstreamErrors = NIOLockedValueBox<[String: Prometheus.Counter]>([:])
    let clientConnections: Prometheus.Gauge
    let upstreamConnections: Prometheus.Gauge
    let reloadsSucceeded: Prometheus.Counter
    let reloadsFailed: Prometheus.Counter

    static let latencyBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
        .milliseconds(500), .seconds(1), .seconds(2), .seconds(5), .seconds(10),
    ]

    public init() {
        clientConnections = registry.makeGauge(name: "sessiongate_client_connections", help: "Open client connections.")
        upstreamConnections = registry.makeGauge(name: "sessiongate_upstream_connections", help: "Open upstream connections (busy and pooled).")
        reloadsSucceeded = registry.makeCounter(name: "sessiongate_config_reloads_total", labels: [("result", "ok")], help: "Configuration reloads (SIGHUP).")
        reloadsFailed = registry.makeCounter(name: "sessiongate_config_reloads_total", labels: [("result", "invalid")], help: "Configuration reloads (SIGHUP).")
    }

    func recordRequest(route: String, status: Int, durationNanoseconds: Int64) {
        let statusClass = status >= 100 && status < 600 ? "\(status / 100)xx" : "other"
        let key = route + " " + statusClass
        let counter = requests.withLockedValue { cache in
            if let c = cache[key] { return c }
            let c = registry.makeCounter(name: "sessiongate_requests_total", labels: [("route", route), ("status_class", statusClass)],
                                         help: "Requests answered, by route and status class.")
            cache[key] = c
            return c
        }
        counter.increment()
        let histogram = latency.withLockedValue { cache in
            if let h = cache[route] { return h }
            let h = registry.makeDurationHistogram(name: "sessiongate_request_duration_seconds", labels: [("route", route)],
                                                   buckets: Self.latencyBuckets, help: "Time from request head to the end of the response.")
            cache[route] = h
            return h
        }
        histogram.recordNanoseconds(durationNanoseconds)
    }

    func recordUpstreamError(route: String, kind: UpstreamErrorKind) {
        let key = route + " " + kind.rawValue
        let counter = upstreamErrors.withLockedValue { cache in
            if let c = cache[key] { return c }
            let c = registry.makeCounter(name: "sessiongate_upstream_errors_total", labels: [("route", route), ("kind", kind.rawValue)],
                                         help: "Failed upstream exchanges, by route and kind.")
            cache[key] = c
            return c
        }
        counter.increment()
    }

    /// The Prometheus text exposition.
    public func exposition() -> [UInt8] { registry.emitToBuffer() }
}
