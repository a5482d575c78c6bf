import AppleID
import Foundation
import HTTPProxy
import NIOConcurrencyHelpers
import NIOCore
import Prometheus
import Sessions

#if canImport(Glibc)
import Glibc
#endif

/// Every metric the gateway exports, declared in one place, with bounded labels (route name,
/// status class, error kind — never a user or a session). Served on the admin listener.
public final class GatewayMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    private let routes = MetricCache<String, RouteMetrics>()
    let clientConnections: Prometheus.Gauge
    /// Requests that came on HTTP/2 streams (the rest came on HTTP/1.x).
    let http2Requests: Prometheus.Counter
    /// 1 while the session store answers its once-a-second ping.
    let storeUp: Prometheus.Gauge
    let upstreamConnections: Prometheus.Gauge
    let reloadsSucceeded: Prometheus.Counter
    let reloadsFailed: Prometheus.Counter
    let reloadsRefused: Prometheus.Counter
    /// Admission results, indexed by `AdmissionResult` (made once: no lookup per request).
    private let admissions: [Prometheus.Counter]
    let cacheHits: Prometheus.Counter
    let cacheMisses: Prometheus.Counter
    let invalidationsReceived: Prometheus.Counter
    private let counters = MetricCache<MetricSeries, Prometheus.Counter>()
    private let gauges = MetricCache<MetricSeries, Prometheus.Gauge>()
    private let histograms = MetricCache<MetricSeries, DurationHistogram>()
    /// Run before each scrape: values read rather than counted (client secrets, log drops).
    private let collectors = NIOLockedValueBox<[@Sendable () -> Void]>([])
    /// Counters fed from totals kept elsewhere: the last total seen, per counter.
    private let mirrored = NIOLockedValueBox<[MetricSeries: Int]>([:])
    private let process: ProcessMetrics

    static let latencyBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
        .milliseconds(500), .seconds(1), .seconds(2), .seconds(5), .seconds(10),
    ]

    public init() {
        clientConnections = registry.makeGauge(descriptor: Self.name("client_connections", help: "Open client connections."))
        http2Requests = registry.makeCounter(descriptor: Self.name("http2_requests", unit: "total", help: "Requests answered on HTTP/2 streams."))
        storeUp = registry.makeGauge(descriptor: Self.name("store_up", help: "1 while the session store takes writes (one every second), else 0."))
        upstreamConnections = registry.makeGauge(descriptor: Self.name("upstream_connections", help: "Open upstream connections (busy and pooled)."))
        let registry = self.registry
        let reloads = ReloadResult.allCases.map {
            registry.makeCounter(descriptor: Self.name("config_reloads", unit: "total", help: "Configuration reloads (SIGHUP)."), labels: [("result", $0.rawValue)])
        }
        reloadsSucceeded = reloads[0]
        reloadsFailed = reloads[1]
        reloadsRefused = reloads[2]
        admissions = AdmissionResult.allCases.map {
            registry.makeCounter(descriptor: Self.name("admissions", unit: "total", help: "Admission decisions on guarded routes, by result."), labels: [("result", $0.label)])
        }
        let lookups = SessionCacheResult.allCases.map {
            registry.makeCounter(descriptor: Self.name("session_cache", unit: "total", help: "Session lookups by the local cache's answer."), labels: [("result", $0.rawValue)])
        }
        cacheHits = lookups[0]
        cacheMisses = lookups[1]
        invalidationsReceived = registry.makeCounter(descriptor: Self.name("invalidations_received", unit: "total", help: "Invalidation messages received over Redis pub/sub."))
        process = ProcessMetrics(registry: registry)
        registry.makeGauge(descriptor: Self.name("build_info", help: "Version of this binary and the Swift compiler that built it (always 1)."),
                           labels: [("version", BuildInfo.version), ("swift", BuildInfo.swift)]).set(Double(1))
        // Every label value of every family, at 0 (TLS and routes: `primeTLS`, `prime(routes:)`).
        for flow in SignInFlow.allCases { for outcome in SignInOutcome.allCases { recordSignIn(flow: flow, outcome: outcome, count: false) } }
        for kind in AnonymousWrites.Kind.allCases { for outcome in SignInStartOutcome.allCases { recordSignInStart(kind, outcome: outcome, count: false) } }
        for endpoint in AppleEndpoint.allCases {
            for outcome in AppleCallOutcome.allCases { _ = appleCalls(endpoint, outcome) }
            _ = appleLatency(endpoint)
        }
        for reason in DeferredAppleCall.allCases { _ = appleCallsDeferred(reason) }
        for kind in RevalidationKind.allCases { _ = revalidations(kind) }
        for source in Revocations.Source.allCases { _ = revocations(source) }
        for reason in SessionEndReason.allCases { _ = sessionsEnded(reason) }
        for type in NotificationType.allCases { for result in NotificationResult.allCases { _ = notifications(type, result) } }
        for operation in StoreOperation.allCases { _ = storeLatency(operation) }
        for stream in LogStream.allCases { _ = counter("log_lines_dropped", help: Self.logDropsHelp, labels: [("stream", stream.rawValue)]) }
        for kind in OutboxJob.Kind.allCases {
            recordOutbox(kind: kind, pending: 0, oldestSeconds: 0)
            for result in OutboxAttemptResult.allCases { _ = outboxAttempts(kind, result) }
        }
        recordSessionCache(entries: 0, evictions: 0)
        recordHeldRevocations(depth: 0, oldestSeconds: 0)
        for result in HeldRevocationResult.allCases { _ = heldRevocations(result) }
        for reason in ConnectionRefusal.allCases { _ = counter("connections_refused", help: Self.connectionsRefusedHelp, labels: [("reason", reason.rawValue)]) }
        _ = routeMetrics("-")
        addCollector { [unowned self] in
            for stream in LogStream.allCases {
                self.mirror("log_lines_dropped", help: Self.logDropsHelp, labels: [("stream", stream.rawValue)], total: stream.sink.droppedLines)
            }
        }
    }

    static let tlsFailuresHelp = "Client TLS handshakes on the public listener that did not complete, by reason."
    static let cacheEvictionsHelp = "Live sessions the local cache evicted for room (store.local_cache_entries reached): a steady rate means the cache is too small."

    /// The local session cache's size and evictions, read at each scrape.
    func recordSessionCache(entries: Int, evictions: Int) {
        gauge("session_cache_entries", help: "Sessions held by the local cache.", labels: []).set(Double(entries))
        mirror("session_cache_evictions", help: Self.cacheEvictionsHelp, labels: [], total: evictions)
    }

    static let connectionsRefusedHelp = "Client connections refused at accept (503) over server.limits.max_connections (instance) or max_connections_per_client (client)."

    /// Counts a client connection refused over a cap.
    func recordConnectionRefused(_ reason: ConnectionRefusal) {
        counter("connections_refused", help: Self.connectionsRefusedHelp, labels: [("reason", reason.rawValue)]).increment()
    }

    /// Counts a client TLS handshake that did not complete.
    func recordTLSHandshakeFailure(_ reason: TLSHandshakeFailure) {
        counter("tls_handshake_failures", help: Self.tlsFailuresHelp, labels: [("reason", reason.rawValue)]).increment()
    }

    /// The listener certificate's expiry (Unix seconds), set at start and on every reload.
    func recordCertificateExpiry(_ notValidAfter: Int64) {
        gauge("tls_certificate_expiry_timestamp", unit: "seconds", help: "When the listener's certificate expires (Unix seconds): alert well before time().",
              labels: []).set(Double(notValidAfter))
    }

    /// The TLS families at 0 (only when the listener speaks TLS).
    func primeTLS() {
        for reason in TLSHandshakeFailure.allCases { _ = counter("tls_handshake_failures", help: Self.tlsFailuresHelp, labels: [("reason", reason.rawValue)]) }
    }

    static let appleCallsHelp = "Calls to Apple, by endpoint and outcome."
    static let revalidationsHelp = "Refresh-token validations, by kind."
    static let revocationsHelp = "User revocations, by source."
    static let sessionsEndedHelp = "Sessions ended, by reason."
    static let notificationsHelp = "Apple server-to-server notifications, by type and result."
    static let logDropsHelp = "Log lines dropped because the log reader fell behind, by stream."

    /// Every route's families at 0 (at start and after a reload adds routes).
    func prime(routes: [String], upstreams: [String] = []) {
        for upstream in upstreams { _ = upstreamConnects(upstream) }
        for route in routes {
            _ = routeMetrics(route)
            for kind in UpstreamErrorKind.allCases { _ = upstreamErrorCounter(route: route, kind: kind) }
        }
    }

    /// A value to refresh before each scrape.
    func addCollector(_ collect: @escaping @Sendable () -> Void) {
        collectors.withLockedValue { $0.append(collect) }
    }

    /// Brings a counter up to a total kept elsewhere.
    func mirror(_ metric: String, help: String, labels: [(String, String)], total: Int) {
        let key = MetricSeries(metric, labels)
        let delta = mirrored.withLockedValue { seen -> Int in
            defer { seen[key] = max(seen[key] ?? 0, total) }
            return total - (seen[key] ?? 0)
        }
        let mirror = counter(metric, help: help, labels: labels)
        if delta > 0 { mirror.increment(by: Int64(delta)) }
    }

    /// Outbox jobs waiting (queued or failed, to be retried), by kind; the oldest one's age.
    func recordOutbox(kind: OutboxJob.Kind, pending: Int, oldestSeconds: Int64) {
        gauge("outbox_pending", help: "Outbox jobs not done yet (revocations at Apple, events for the app), by kind.", labels: [("kind", kind.rawValue)]).set(Double(pending))
        gauge("outbox_oldest", unit: "seconds", help: "Age of the oldest outbox job not done yet, by kind (0: none).", labels: [("kind", kind.rawValue)]).set(Double(oldestSeconds))
    }

    /// Revocations the store did not take, held by this instance (`HeldRevocations`); the
    /// oldest one's age.
    func recordHeldRevocations(depth: Int, oldestSeconds: Int64) {
        gauge("held_revocations", help: "Revocations (logouts, Apple's notifications, invalid_grant) the session store did not take, held by this instance until it does.",
              labels: []).set(Double(depth))
        gauge("held_revocations_oldest", unit: "seconds", help: "Age of the oldest held revocation (0: none).", labels: []).set(Double(oldestSeconds))
    }

    func recordHeldRevocation(_ result: HeldRevocationResult) { heldRevocations(result).increment() }

    private func heldRevocations(_ result: HeldRevocationResult) -> Prometheus.Counter {
        counter("held_revocation_changes", help: "Revocations held (the store did not take them), applied later, dropped (a notification that can never verify), or refused (the held queue full: answered 503).",
                labels: [("result", result.rawValue)])
    }

    /// An outbox job's attempt by kind and result.
    func recordOutboxAttempt(kind: OutboxJob.Kind, result: OutboxAttemptResult) { outboxAttempts(kind, result).increment() }

    private func outboxAttempts(_ kind: OutboxJob.Kind, _ result: OutboxAttemptResult) -> Prometheus.Counter {
        counter("outbox_attempts", help: "Outbox job attempts, by kind and result (done, failed: retried later, dropped: can never succeed).",
                labels: [("kind", kind.rawValue), ("result", result.rawValue)])
    }

    /// Apple's client secret for `clientID`: seconds until it expires, and mint failures.
    func recordClientSecret(clientID: String, expiresIn: Int64?, age: Int64?, mintFailures: Int) {
        if let expiresIn {
            gauge("apple_client_secret_expires_in", unit: "seconds", help: "Seconds until the Apple client secret in use expires, by client id (alert well before 0).",
                  labels: [("client_id", clientID)]).set(Double(expiresIn))
        }
        if let age { recordClientSecretAge(clientID: clientID, seconds: age) }
        mirror("apple_client_secret_mint_failures", help: "Client secrets that could not be signed.", labels: [], total: mintFailures)
    }

    private func gauge(_ metric: String, unit: String = "", help: String, labels: [(String, String)]) -> Prometheus.Gauge {
        gauges(MetricSeries(metric, labels)) { registry.makeGauge(descriptor: Self.name(metric, unit: unit, help: help), labels: labels) }
    }

    private func histogram(_ metric: String, help: String, labels: [(String, String)]) -> DurationHistogram {
        histograms(MetricSeries(metric, labels)) {
            registry.makeDurationHistogram(descriptor: Self.name(metric, unit: "seconds", help: help), labels: labels, buckets: Self.latencyBuckets)
        }
    }

    func storeLatency(_ operation: StoreOperation) -> DurationHistogram {
        histogram("store_duration", help: "Session-store operations (memory or Redis), by operation.", labels: [("operation", operation.rawValue)])
    }

    func appleLatency(_ endpoint: AppleEndpoint) -> DurationHistogram {
        histogram("apple_call_duration", help: "Calls to Apple, by endpoint.", labels: [("endpoint", endpoint.rawValue)])
    }

    /// Runs a call to Apple, recording its duration under `endpoint`; in a trace, as an
    /// `apple.<endpoint>` span whose context Apple receives.
    func timeAppleCall<T>(_ endpoint: AppleEndpoint, _ call: () async -> T) async -> T {
        await TraceScope.outbound("apple." + endpoint.rawValue) { fields in
            let start = NIODeadline.now()
            let result = await AppleTokenClient.$traceFields.withValue(fields) { await call() }
            appleLatency(endpoint).recordNanoseconds(Int64(NIODeadline.now().uptimeNanoseconds - start.uptimeNanoseconds))
            return result
        }
    }

    func recordAdmission(_ result: AdmissionResult) { admissions[result.rawValue].increment() }

    /// Sign-ins by flow and outcome.
    func recordSignIn(flow: SignInFlow, outcome: SignInOutcome, count: Bool = true) {
        let c = counter("sign_ins", help: "Sign-in attempts by flow and outcome.", labels: [("flow", flow.rawValue), ("outcome", outcome.rawValue)])
        if count { c.increment() }
    }

    /// Sign-in starts by endpoint (`login`, `native_nonce`) and outcome: `throttled` is one
    /// client over `apple.logins_per_minute` (429), `busy` the instance over
    /// `apple.max_pending_logins` (503).
    func recordSignInStart(_ endpoint: AnonymousWrites.Kind, outcome: SignInStartOutcome, count: Bool = true) {
        let c = counter("sign_in_starts", help: "Requests that start a sign-in (a login state or a native nonce written), by endpoint and outcome.",
                        labels: [("endpoint", endpoint.rawValue), ("outcome", outcome.rawValue)])
        if count { c.increment() }
    }

    /// Seconds since the client secret in use for `clientID` was minted (re-minted at half its
    /// lifetime; an alert well below Apple's six-month cap).
    func recordClientSecretAge(clientID: String, seconds: Int64) {
        gauge("apple_client_secret_age", unit: "seconds", help: "Age of the Apple client secret in use, by client id.", labels: [("client_id", clientID)])
            .set(Double(seconds))
    }

    /// Calls to Apple by endpoint and outcome.
    func recordAppleCall(endpoint: AppleEndpoint, outcome: AppleCallOutcome) { appleCalls(endpoint, outcome).increment() }

    private func appleCalls(_ endpoint: AppleEndpoint, _ outcome: AppleCallOutcome) -> Prometheus.Counter {
        counter("apple_calls", help: Self.appleCallsHelp, labels: [("endpoint", endpoint.rawValue), ("outcome", outcome.rawValue)])
    }

    /// Due re-validations that did not call Apple, by reason.
    func recordAppleCallDeferred(_ reason: DeferredAppleCall) { appleCallsDeferred(reason).increment() }

    private func appleCallsDeferred(_ reason: DeferredAppleCall) -> Prometheus.Counter {
        counter("apple_calls_deferred", help: "Due re-validations that did not call Apple, by reason (backoff, circuit, outage).", labels: [("reason", reason.rawValue)])
    }

    /// Re-validations by kind: `fresh` (a sign-in), `background` (stale within the grace),
    /// `blocking` (the request waited).
    func recordRevalidation(kind: RevalidationKind) { revalidations(kind).increment() }

    private func revalidations(_ kind: RevalidationKind) -> Prometheus.Counter {
        counter("revalidations", help: Self.revalidationsHelp, labels: [("kind", kind.rawValue)])
    }

    /// Revocations by source.
    func recordRevocation(source: Revocations.Source) { revocations(source).increment() }

    private func revocations(_ source: Revocations.Source) -> Prometheus.Counter {
        counter("revocations", help: Self.revocationsHelp, labels: [("source", source.rawValue)])
    }

    /// Notifications from Apple by type and result.
    func recordNotification(type: NotificationType, result: NotificationResult) { notifications(type, result).increment() }

    private func notifications(_ type: NotificationType, _ result: NotificationResult) -> Prometheus.Counter {
        counter("apple_notifications", help: Self.notificationsHelp, labels: [("type", type.rawValue), ("result", result.rawValue)])
    }

    enum SpanDrop: String, CaseIterable { case queueFull = "queue_full", exportFailed = "export_failed" }

    static let spansExportedHelp = "Spans the trace collector accepted."
    static let spansDroppedHelp = "Spans not exported, by reason (queue_full: tracing.max_queue reached; export_failed)."
    static let exportsFailedHelp = "Trace export requests that failed (unreachable collector, error answer, timeout)."

    /// The tracing families at 0 (only with `tracing:`).
    func primeTracing() {
        _ = counter("tracing_spans_exported", help: Self.spansExportedHelp, labels: [])
        _ = counter("tracing_exports_failed", help: Self.exportsFailedHelp, labels: [])
        for reason in SpanDrop.allCases { _ = counter("tracing_spans_dropped", help: Self.spansDroppedHelp, labels: [("reason", reason.rawValue)]) }
    }

    /// Spans a collector accepted (`tracing`).
    func recordSpansExported(_ count: Int) {
        counter("tracing_spans_exported", help: Self.spansExportedHelp, labels: []).increment(by: Int64(count))
    }

    /// Spans lost: the export queue was full (`tracing.max_queue`), or their export failed.
    func recordSpansDropped(_ count: Int, reason: SpanDrop) {
        counter("tracing_spans_dropped", help: Self.spansDroppedHelp, labels: [("reason", reason.rawValue)]).increment(by: Int64(count))
    }

    /// An export request the collector did not accept (its spans are dropped).
    func recordSpanExportFailed(spans: Int) {
        counter("tracing_exports_failed", help: Self.exportsFailedHelp, labels: []).increment()
        recordSpansDropped(spans, reason: .exportFailed)
    }

    /// Ended sessions by reason.
    func recordSessionEnded(reason: SessionEndReason) { sessionsEnded(reason).increment() }

    private func sessionsEnded(_ reason: SessionEndReason) -> Prometheus.Counter {
        counter("sessions_ended", help: Self.sessionsEndedHelp, labels: [("reason", reason.rawValue)])
    }

    private func counter(_ metric: String, help: String, labels: [(String, String)]) -> Prometheus.Counter {
        counters(MetricSeries(metric, labels)) { registry.makeCounter(descriptor: Self.name(metric, unit: "total", help: help), labels: labels) }
    }

    /// A route's request counters (one per status class) and latency histogram, made once.
    struct RouteMetrics: Sendable {
        let byClass: [Prometheus.Counter]  // by `StatusClass`: 1xx…5xx, then "other"
        let latency: DurationHistogram
    }

    private func routeMetrics(_ route: String) -> RouteMetrics {
        routes(route) {
            RouteMetrics(
                byClass: StatusClass.allCases.map {
                    registry.makeCounter(descriptor: Self.name("requests", unit: "total", help: "Requests answered, by route and status class."),
                                         labels: [("route", route), ("status_class", $0.rawValue)])
                },
                latency: registry.makeDurationHistogram(
                    descriptor: Self.name("request_duration", unit: "seconds", help: "Time from request head to the end of the response."),
                    labels: [("route", route)], buckets: Self.latencyBuckets))
        }
    }

    func recordRequest(route: String, status: Int, durationNanoseconds: Int64, http2: Bool = false) {
        if http2 { http2Requests.increment() }
        let metrics = routeMetrics(route)
        let index = status >= 100 && status < 600 ? status / 100 - 1 : 5
        metrics.byClass[index].increment()
        metrics.latency.recordNanoseconds(durationNanoseconds)
    }

    /// `sessiongate_upstream_connects_total{upstream}`: its rate is the connects per second an
    /// upstream sees (churn: a healthy pool keeps it near 0 under steady traffic).
    func recordUpstreamConnect(_ upstream: String) { upstreamConnects(upstream).increment() }

    private func upstreamConnects(_ upstream: String) -> Prometheus.Counter {
        counter("upstream_connects", help: "Connections opened to each upstream.", labels: [("upstream", upstream)])
    }

    func recordUpstreamError(route: String, kind: UpstreamErrorKind) {
        upstreamErrorCounter(route: route, kind: kind).increment()
    }

    private func upstreamErrorCounter(route: String, kind: UpstreamErrorKind) -> Prometheus.Counter {
        counter("upstream_errors", help: "Failed upstream exchanges, by route and kind.", labels: [("route", route), ("kind", kind.rawValue)])
    }

    /// `sessiongate_<name>_<unit>` (descriptors are not Sendable, so they are made where used).
    private static func name(_ metric: String, unit: String = "", help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "sessiongate", metricName: metric, unitName: unit, helpText: help)
    }

    /// Counts the open descriptors again (once a second, off the event loops: a scrape is answered on one).
    func collectProcessMetrics() { process.collectDescriptors() }

    /// The Prometheus text exposition (collected values refreshed first).
    public func exposition() -> [UInt8] {
        for collect in collectors.withLockedValue({ $0 }) { collect() }
        process.collectStat()
        return registry.emitToBuffer()
    }
}
