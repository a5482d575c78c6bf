import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import ServiceLifecycle

/// The gateway's traces (`tracing`): spans made where the work happens, queued without
/// blocking, exported in batches over OTLP by this service's one loop.
///
/// Requests never wait for tracing: `record` appends to a bounded queue under a lock and
/// returns; a full queue drops the span (`tracing_spans_dropped_total{reason="queue_full"}`), a
/// failed export drops its batch (`reason="export_failed"`, the failure logged once per outage).
/// A service of the gateway's group, stopped after everything that records spans: what is
/// queued then is exported (one attempt) before the exporter closes.
final class GatewayTracer: Service, Sendable {
    let includeUser: Bool
    /// For traces no request started (outbox jobs); requests are sampled by the proxy's snapshot.
    private let sampler: NIOLockedValueBox<TraceSampler>
    private let queue: NIOLockedValueBox<[SpanRecord]>
    private let maxQueue: Int
    private let exporter: any SpanExporter
    private let resource: [(String, SpanRecord.Value)]
    private let metrics: GatewayMetrics
    private let logger: Logger
    /// Unix time minus uptime, in nanoseconds: the proxy's uptimes as Unix times.
    private let uptimeOffset: Int64
    private let wake = NIOLockedValueBox(Wake())
    private let stopped = NIOLockedValueBox(false)

    /// A signal for the export loop, kept until it is taken (none is lost between a check and a
    /// wait).
    private struct Wake {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>? = nil
    }

    /// Spans per export request.
    static let batchSize = 512
    /// How often the queue is exported (sooner when a batch is full).
    static let exportInterval: TimeAmount = .seconds(1)

    init(_ c: GatewayConfiguration.Tracing, exporter: any SpanExporter, metrics: GatewayMetrics, logger: Logger) {
        includeUser = c.includeUser
        sampler = NIOLockedValueBox(TraceSampler(ratio: c.sampleRatio))
        maxQueue = c.maxQueue
        queue = NIOLockedValueBox([])
        self.exporter = exporter
        resource = [("service.name", .string(c.serviceName)), ("service.version", .string(BuildInfo.version)),
                    ("host.name", .string(ProcessInfo.processInfo.hostName))]
        self.metrics = metrics
        self.logger = logger
        let wall = Int64(Date().timeIntervalSince1970 * 1_000_000_000)
        uptimeOffset = wall - Int64(NIODeadline.now().uptimeNanoseconds)
        metrics.primeTracing()
    }

    /// A reload's new `tracing.sample_ratio` (the proxy's snapshot carries it for requests).
    func setSampleRatio(_ ratio: Double) { sampler.withLockedValue { $0.ratio = ratio } }

    // MARK: making spans

    func unixTime(uptime: UInt64) -> UInt64 { UInt64(Int64(uptime) + uptimeOffset) }
    var now: UInt64 { unixTime(uptime: NIODeadline.now().uptimeNanoseconds) }

    /// A random id for a span or half a trace id, never 0.
    func newID() -> UInt64 {
        var generator = SystemRandomNumberGenerator()
        var id: UInt64 = 0
        while id == 0 { id = generator.next() }
        return id
    }

    /// A span starting now under `parent`; nil when there is none or its trace is not recorded.
    func start(_ name: String, kind: SpanRecord.Kind = .internal, parent: TraceContext?) -> OpenSpan? {
        guard let parent, parent.sampled else { return nil }
        return OpenSpan(tracer: self, record: SpanRecord(traceID: parent.traceID, spanID: newID(), parentSpanID: parent.spanID, state: parent.state,
                                                         name: name, kind: kind, start: now, end: 0))
    }

    /// A new trace for work no request started (an event delivery, an outbox job), sampled by
    /// `tracing.sample_ratio`: its root span, or nil when it is not recorded, with the context
    /// to propagate either way.
    func root(_ name: String, kind: SpanRecord.Kind = .internal) -> (span: OpenSpan?, context: TraceContext) {
        let traceID = TraceID(high: newID(), low: newID())
        let sampled = sampler.withLockedValue { $0.samples(traceID, parent: nil) }
        let context = TraceContext(traceID: traceID, spanID: newID(), sampled: sampled)
        guard sampled else { return (nil, context) }
        return (OpenSpan(tracer: self, record: SpanRecord(traceID: traceID, spanID: context.spanID, name: name, kind: kind, start: now, end: 0)), context)
    }

    /// Queues a finished span for export: never waits; a full queue drops it.
    func record(_ span: SpanRecord) { record(CollectionOfOne(span)) }

    /// Queues spans under one lock; those that do not fit are dropped (and counted).
    func record(_ spans: some Collection<SpanRecord>) {
        let (accepted, before) = queue.withLockedValue { queue -> (Int, Int) in
            let before = queue.count
            let room = max(0, maxQueue - before)
            queue.append(contentsOf: spans.prefix(room))
            return (queue.count - before, before)
        }
        if accepted < spans.count { metrics.recordSpansDropped(spans.count - accepted, reason: .queueFull) }
        if before < Self.batchSize, before + accepted >= Self.batchSize { signal() }
    }

    /// The methods spans name as they are; any other is `_OTHER` (OpenTelemetry's HTTP
    /// conventions: a client must not set a span name's cardinality).
    static let knownMethods: Set<String> = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]

    /// The spans of a traced exchange (`ExchangeRecord.trace`), recorded when its trace is: the
    /// request (server), its admission, and the exchange with the upstream and its connect.
    func exchange(_ r: ExchangeRecord) {
        guard let t = r.trace, t.context.sampled else { return }
        let end = unixTime(uptime: t.end)
        let method = Self.knownMethods.contains(r.method) ? r.method : "_OTHER"
        var server = SpanRecord(traceID: t.context.traceID, spanID: t.context.spanID, parentSpanID: t.parentSpanID, state: t.context.state,
                                name: "\(method) \(r.route ?? "-")", kind: .server, start: unixTime(uptime: t.start), end: end)
        server.attributes = [
            ("http.request.method", .string(method)), ("url.path", .string(r.path)), ("http.route", .string(r.route ?? "-")),
            ("http.response.status_code", .int(Int64(r.status))), ("network.protocol.version", .string(Self.version(r.protocolName))),
            ("client.address", .string(r.client)), ("sessiongate.request_id", .string(r.requestID)),
        ]
        if method != r.method { server.attributes.append(("http.request.method_original", .string(r.method))) }
        if includeUser, let user = r.user { server.attributes.append(("enduser.id", .string(user))) }
        if r.aborted { server.attributes.append(("sessiongate.aborted", .bool(true))) }
        if r.status >= 500 { server.error = "HTTP \(r.status)" }
        var spans = [server]
        if t.decided != 0 {
            spans.append(SpanRecord(traceID: t.context.traceID, spanID: t.admissionSpanID, parentSpanID: t.context.spanID, name: "admission",
                                    kind: .internal, start: unixTime(uptime: t.start), end: unixTime(uptime: t.decided)))
        }
        if t.upstreamAsked != 0 {
            var upstream = SpanRecord(traceID: t.context.traceID, spanID: t.upstreamSpanID, parentSpanID: t.context.spanID, state: t.context.state,
                                      name: "upstream \(method)", kind: .client, start: unixTime(uptime: t.upstreamAsked), end: end)
            if let address = r.upstream {
                upstream.attributes = [("server.address", .string(address.host)), ("server.port", .int(Int64(address.port)))]
            }
            if t.firstByte != 0 {
                upstream.attributes.append(("http.response.status_code", .int(Int64(r.status))))
                upstream.events = [(name: "first_byte", time: unixTime(uptime: t.firstByte))]
            } else {
                upstream.error = r.aborted ? "client left before the response" : "no response from the upstream"
            }
            spans.append(upstream)
            if t.connected != 0 {
                spans.append(SpanRecord(traceID: t.context.traceID, spanID: t.connectSpanID, parentSpanID: t.upstreamSpanID, name: "connect",
                                        kind: .internal, start: unixTime(uptime: t.upstreamAsked), end: unixTime(uptime: t.connected)))
            }
        }
        record(spans)
    }

    private static func version(_ protocolName: String) -> String {
        switch protocolName {
        case "HTTP/1.1": "1.1"
        case "HTTP/2": "2"
        case "HTTP/1.0": "1.0"
        default: protocolName
        }
    }

    // MARK: exporting

    /// Exports the queue every `exportInterval` (sooner when a batch is full) until the group
    /// shuts down, then what is left (one attempt), then closes the exporter.
    func run() async {
        await withGracefulShutdownHandler {
            await exportLoop()
        } onGracefulShutdown: {
            self.stopped.withLockedValue { $0 = true }
            self.signal()
        }
        await exporter.shutdown()
    }

    /// For a process that will not run: closes the exporter, exporting nothing.
    func abandon() { exporter.abandon() }

    private func signal() {
        let waiter = wake.withLockedValue { wake -> CheckedContinuation<Void, Never>? in
            guard let waiter = wake.waiter else {
                wake.pending = true
                return nil
            }
            wake.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    private func exportLoop() async {
        var failing = false
        while true {
            // Cancelled (the group failed): as stopping, never a loop of sleeps that return at once.
            let stopping = stopped.withLockedValue { $0 } || Task.isCancelled
            let batch = queue.withLockedValue { queue -> [SpanRecord] in
                let batch = Array(queue.prefix(Self.batchSize))
                queue.removeFirst(batch.count)
                return batch
            }
            if !batch.isEmpty {
                let body = OTLPEncoding.exportRequest(batch, resource: resource, scope: (name: "sessiongate", version: BuildInfo.version))
                do {
                    try await exporter.export(body)
                    metrics.recordSpansExported(batch.count)
                    if failing {
                        failing = false
                        logger.info("trace export works again")
                    }
                } catch {
                    metrics.recordSpanExportFailed(spans: batch.count)
                    if !failing {
                        failing = true
                        logger.warning("trace export failed: spans are dropped until it works again (tracing_exports_failed_total counts)",
                                       metadata: ["error": "\(error)", "endpoint": "\(exporter.endpoint)"])
                    }
                    if stopping {
                        // The process is ending: one failed attempt, not one per batch.
                        let rest = queue.withLockedValue { queue in
                            defer { queue.removeAll() }
                            return queue.count
                        }
                        if rest > 0 { metrics.recordSpansDropped(rest, reason: .exportFailed) }
                        return
                    }
                }
                // A full batch: the next at once, unless the collector is failing (then once per interval).
                if batch.count == Self.batchSize, !failing { continue }
            }
            if stopping { return }
            await sleep(Self.exportInterval)
        }
    }

    /// Waits for `interval`, or less when signalled (a batch filled, the group shuts down).
    private func sleep(_ interval: TimeAmount) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(nanoseconds: UInt64(interval.nanoseconds)) }
            group.addTask { await self.signalled() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Returns once signalled (at once when a signal is pending), or cancelled.
    private func signalled() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = wake.withLockedValue { wake -> Bool in
                    if wake.pending {
                        wake.pending = false
                        return true
                    }
                    wake.waiter = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            signal()
        }
    }
}

/// A span being timed; `end` records it.
struct OpenSpan: Sendable {
    let tracer: GatewayTracer
    var record: SpanRecord

    /// What children of this span name as their parent.
    var context: TraceContext {
        TraceContext(traceID: record.traceID, spanID: record.spanID, sampled: true, state: record.state)
    }

    func end(error: String? = nil) {
        var record = self.record
        record.end = tracer.now
        if let error { record.error = error }
        tracer.record(record)
    }

    /// Ends when `future` completes (failed: with its error).
    func end<T>(with future: EventLoopFuture<T>) {
        future.whenComplete { result in
            switch result {
            case .success: self.end()
            case .failure(let error): self.end(error: String("\(error)".prefix(256)))
            }
        }
    }

    /// A store operation's span (a client span to Redis or the memory store).
    static func store(_ operation: StoreOperation, tracer: GatewayTracer?, parent: TraceContext?) -> OpenSpan? {
        guard var span = tracer?.start("store." + operation.rawValue, kind: .client, parent: parent) else { return nil }
        span.record.attributes = [("db.operation.name", .string(operation.rawValue))]
        return span
    }
}

/// The trace async work runs in: set around a sign-in, a re-validation, an outbox job, so
/// that what it calls (the store, Apple, the app) records its spans under it and propagates
/// its context, without passing it through every call.
struct TraceScope: Sendable {
    let tracer: GatewayTracer
    /// The span children are made under (recorded or not: its `traceparent` goes out).
    let context: TraceContext

    @TaskLocal static var current: TraceScope?

    /// Runs `body` in a child span named `name` of the current scope (with the child as the
    /// scope), or just runs it when there is no scope.
    static func span<T>(_ name: String, kind: SpanRecord.Kind = .internal, _ attributes: [(String, SpanRecord.Value)] = [],
                        _ body: () async -> T) async -> T {
        guard let scope = current else { return await body() }
        guard var span = scope.tracer.start(name, kind: kind, parent: scope.context) else { return await body() }
        span.record.attributes = attributes
        let result = await $current.withValue(TraceScope(tracer: scope.tracer, context: span.context)) { await body() }
        span.end()
        return result
    }

    /// Runs a call to another service in a client span named `name`, giving `body` the
    /// `traceparent` that carries the trace to it: the span's when the trace is recorded, the
    /// scope's when not; none outside a trace. A caller's `tracestate` is vendor state for our
    /// side of the trace: it is not passed to a third party (Apple).
    static func outbound<T>(_ name: String, _ body: ([(String, String)]) async -> T) async -> T {
        await span(name, kind: .client) {
            guard let context = current?.context else { return await body([]) }
            return await body([("traceparent", context.traceparent)])
        }
    }

    /// Runs work no request started as the root span `name` of a trace of its own (recorded by
    /// `tracing.sample_ratio`), or just runs it when nothing is traced.
    static func root<T>(_ tracer: GatewayTracer?, _ name: String, kind: SpanRecord.Kind = .internal, _ attributes: [(String, SpanRecord.Value)] = [],
                        _ body: () async -> (T, error: String?)) async -> T {
        guard let tracer else { return await body().0 }
        var (span, context) = tracer.root(name, kind: kind)
        span?.record.attributes = attributes
        let (result, error) = await $current.withValue(TraceScope(tracer: tracer, context: context)) { await body() }
        span?.end(error: error)
        return result
    }

    /// Runs `body` in `scope` (a request's, or a new root's), when there is one.
    static func with<T>(_ scope: TraceScope?, _ body: () async throws -> T) async rethrows -> T {
        guard let scope else { return try await body() }
        return try await $current.withValue(scope) { try await body() }
    }

    /// The scope of a traced request's work: nil when nothing is traced.
    init?(_ tracer: GatewayTracer?, _ context: TraceContext?) {
        guard let tracer, let context else { return nil }
        self.init(tracer: tracer, context: context)
    }

    init(tracer: GatewayTracer, context: TraceContext) {
        self.tracer = tracer
        self.context = context
    }
}
