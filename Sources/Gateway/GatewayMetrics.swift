import HTTPProxy
import NIOConcurrencyHelpers
import Prometheus

/// Every metric the gateway exports, declared in one place, with bounded labels (route name,
/// status class, error kind — never a user or a session). Served on the admin listener.
public final class GatewayMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    private let routes = NIOLockedValueBox<[String: RouteMetrics]>([:])
    private let upstreamErrors = NIOLockedValueBox<[String: Prometheus.Counter]>([:])
    let clientConnections: Prometheus.Gauge
    let upstreamConnections: Prometheus.Gauge
    let reloadsSucceeded: Prometheus.Counter
    let reloadsFailed: Prometheus.Counter
    let reloadsRefused: Prometheus.Counter
    /// Admission results, indexed by `AdmissionResult` (made once: no lookup per request).
    private let admissions: [Prometheus.Counter]
    let cacheHits: Prometheus.Counter
    let cacheMisses: Prometheus.Counter
    let invalidationsReceived: Prometheus.Counter
    private let labelled = NIOLockedValueBox<[String: Prometheus.Counter]>([:])
    private let gauges = NIOLockedValueBox<[String: Prometheus.Gauge]>([:])

    /// How admission ended for one request on a guarded route.
    enum AdmissionResult: Int, CaseIterable {
        case session, anonymous, unauthenticated, forbidden, storeUnavailable, appleUnavailable
        var label: String { ["session", "anonymous", "unauthenticated", "forbidden", "store_unavailable", "apple_unavailable"][rawValue] }
    }

    static let latencyBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
        .milliseconds(500), .seconds(1), .seconds(2), .seconds(5), .seconds(10),
    ]

    public init() {
        clientConnections = registry.makeGauge(descriptor: Self.name("client_connections", help: "Open client connections."))
        upstreamConnections = registry.makeGauge(descriptor: Self.name("upstream_connections", help: "Open upstream connections (busy and pooled)."))
        reloadsSucceeded = registry.makeCounter(descriptor: Self.name("config_reloads", unit: "total", help: "Configuration reloads (SIGHUP)."), labels: [("result", "ok")])
        reloadsFailed = registry.makeCounter(descriptor: Self.name("config_reloads", unit: "total", help: "Configuration reloads (SIGHUP)."), labels: [("result", "invalid")])
        reloadsRefused = registry.makeCounter(descriptor: Self.name("config_reloads", unit: "total", help: "Configuration reloads (SIGHUP)."), labels: [("result", "refused")])
        let registry = self.registry
        admissions = AdmissionResult.allCases.map {
            registry.makeCounter(descriptor: Self.name("admissions", unit: "total", help: "Admission decisions on guarded routes, by result."), labels: [("result", $0.label)])
        }
        cacheHits = registry.makeCounter(descriptor: Self.name("session_cache", unit: "total", help: "Session lookups by the local cache's answer."), labels: [("result", "hit")])
        invalidationsReceived = registry.makeCounter(descriptor: Self.name("invalidations_received", unit: "total", help: "Invalidation messages received over Redis pub/sub."))
        cacheMisses = registry.makeCounter(descriptor: Self.name("session_cache", unit: "total", help: "Session lookups by the local cache's answer."), labels: [("result", "miss")])
    }

    func recordAdmission(_ result: AdmissionResult) { admissions[result.rawValue].increment() }

    /// Sign-ins by flow (`web`, `native`) and outcome (`ok`, `cancelled`, `rejected`,
    /// `apple_unavailable`, `apple_misconfigured`, `store_unavailable`).
    func recordSignIn(flow: String, outcome: String) {
        counter("sign_ins", help: "Sign-in attempts by flow and outcome.", labels: [("flow", flow), ("outcome", outcome)]).increment()
    }

    /// Seconds since the client secret in use for `clientID` was minted (re-minted at half its
    /// lifetime; an alert well below Apple's six-month cap).
    func recordClientSecretAge(clientID: String, seconds: Int64) {
        let gauge = gauges.withLockedValue { cache in
            if let g = cache[clientID] { return g }
            let g = registry.makeGauge(descriptor: Self.name("apple_client_secret_age", unit: "seconds", help: "Age of the Apple client secret in use, by client id."),
                                       labels: [("client_id", clientID)])
            cache[clientID] = g
            return g
        }
        gauge.set(Double(seconds))
    }

    /// Calls to Apple by endpoint (`token`, `refresh`, `revoke`) and outcome.
    func recordAppleCall(endpoint: String, outcome: String) {
        counter("apple_calls", help: "Calls to Apple, by endpoint and outcome.", labels: [("endpoint", endpoint), ("outcome", outcome)]).increment()
    }

    /// Re-validations by kind: `fresh` (a sign-in), `background` (stale within the grace),
    /// `blocking` (the request waited).
    func recordRevalidation(kind: String) {
        counter("revalidations", help: "Refresh-token validations, by kind.", labels: [("kind", kind)]).increment()
    }

    /// Revocations by source (`apple_notification`, `user`, `apple_invalid_grant`).
    func recordRevocation(source: String) {
        counter("revocations", help: "User revocations, by source.", labels: [("source", source)]).increment()
    }

    /// Notifications from Apple by type (`email-disabled`, …, `unknown`) and result
    /// (`processed`, `duplicate`, `rejected`).
    func recordNotification(type: String, result: String) {
        counter("apple_notifications", help: "Apple server-to-server notifications, by type and result.", labels: [("type", type), ("result", result)]).increment()
    }

    /// Ended sessions by reason (`logout`, `operator`).
    func recordSessionEnded(reason: String) {
        counter("sessions_ended", help: "Sessions ended, by reason.", labels: [("reason", reason)]).increment()
    }

    private func counter(_ metric: String, help: String, labels: [(String, String)]) -> Prometheus.Counter {
        let key = metric + labels.map { " \($0.0)=\($0.1)" }.joined()
        return labelled.withLockedValue { cache in
            if let c = cache[key] { return c }
            let c = registry.makeCounter(descriptor: Self.name(metric, unit: "total", help: help), labels: labels)
            cache[key] = c
            return c
        }
    }

    /// A route's request counters (one per status class) and latency histogram, made once.
    struct RouteMetrics: Sendable {
        let byClass: [Prometheus.Counter]  // 1xx…5xx, then "other"
        let latency: DurationHistogram
    }

    private func routeMetrics(_ route: String) -> RouteMetrics {
        routes.withLockedValue { cache in
            if let m = cache[route] { return m }
            let classes = ["1xx", "2xx", "3xx", "4xx", "5xx", "other"]
            let m = RouteMetrics(
                byClass: classes.map {
                    registry.makeCounter(descriptor: Self.name("requests", unit: "total", help: "Requests answered, by route and status class."),
                                         labels: [("route", route), ("status_class", $0)])
                },
                latency: registry.makeDurationHistogram(
                    descriptor: Self.name("request_duration", unit: "seconds", help: "Time from request head to the end of the response."),
                    labels: [("route", route)], buckets: Self.latencyBuckets))
            cache[route] = m
            return m
        }
    }

    func recordRequest(route: String, status: Int, durationNanoseconds: Int64) {
        let metrics = routeMetrics(route)
        let index = status >= 100 && status < 600 ? status / 100 - 1 : 5
        metrics.byClass[index].increment()
        metrics.latency.recordNanoseconds(durationNanoseconds)
    }

    func recordUpstreamError(route: String, kind: UpstreamErrorKind) {
        let key = route + " " + kind.rawValue
        let counter = upstreamErrors.withLockedValue { cache in
            if let c = cache[key] { return c }
            let c = registry.makeCounter(descriptor: Self.name("upstream_errors", unit: "total", help: "Failed upstream exchanges, by route and kind."),
                                         labels: [("route", route), ("kind", kind.rawValue)])
            cache[key] = c
            return c
        }
        counter.increment()
    }

    /// `sessiongate_<name>_<unit>` (descriptors are not Sendable, so they are made where used).
    private static func name(_ metric: String, unit: String = "", help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "sessiongate", metricName: metric, unitName: unit, helpText: help)
    }

    /// The Prometheus text exposition.
    public func exposition() -> [UInt8] { registry.emitToBuffer() }
}
