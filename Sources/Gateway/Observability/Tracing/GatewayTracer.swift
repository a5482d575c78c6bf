import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore

/// The gateway's traces (`tracing`): spans made where the work happens, queued without
/// blocking, exported in batches over OTLP by one task.
///
/// Requests never wait for tracing: `record` appends to a bounded queue under a lock and
/// returns; a full queue drops the span (`tracing_spans_dropped_total{reason="queue_full"}`), a
/// failed export drops its batch (`reason="export_failed"`, the failure logged once per outage).
final class GatewayTracer: Sendable {
    let includeUser: Bool
    private let sampler: NIOLockedValueBox<TraceSampler>
    private let queue: NIOLockedValueBox<[SpanRecord]>
    private let maxQueue: Int
    private let exporter: any SpanExporter
    private let resource: [(String, SpanRecord.Value)]
    private let metrics: GatewayMetrics
    private let logger: Logger
    /// Unix time minus uptime, in nanoseconds: the proxy's uptimes as Unix times.
    private let uptimeOffset: Int64
    private let ids = NIOLockedValueBox(SystemRandomNumberGenerator())
    private let exporting = NIOLockedValueBox<Task<Void, Never>?>(nil)
    private let wake = NIOLockedValueBox<CheckedContinuation<Void, Never>?>(nil)
    private let stopped = NIOLockedValueBox(false)

    /// Spans per export request.
    static let batchSize = 512
    /// The longest a recorded span waits for its export.
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
    }

    /// A reload's new `tracing.sample_ratio` (the proxy's snapshot carries it for requests).
    func setSampleRatio(_ ratio: Double) { sampler.withLockedValue { $0.ratio = ratio } }

    // MARK: making spans

    func unixTime(uptime: UInt64) -> UInt64 { UInt64(Int64(uptime) + uptimeOffset) }
    var now: UInt64 { unixTime(uptime: NIODeadline.now().uptimeNanoseconds) }

    func newID() -> UInt64 {
        ids.withLockedValue { generator in
            var id: UInt64 = 0
            while id == 0 { id = generator.next() }
            return id
        }
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

    /// The spans of a traced exchange (`ExchangeRecord.trace`), recorded when its trace is: the
    /// request (server), its admission, and the exchange with the upstream and its connect.
    func exchange(_ r: ExchangeRecord) {
        guard let t = r.trace, t.context.sampled else { return }
        let end = unixTime(uptime: t.end)
        var server = SpanRecord(traceID: t.context.traceID, spanID: t.context.spanID, parentSpanID: t.parentSpanID, state: t.context.state,
                                name: "\(r.method) \(r.route ?? "-")", kind: .server, start: unixTime(uptime: t.start), end: end)
        server.attributes = [
            ("http.request.method", .string(r.method)), ("url.path", .string(r.path)), ("http.route", .string(r.route ?? "-")),
            ("http.response.status_code", .int(Int64(r.status))), ("network.protocol.version", .string(Self.version(r.protocolName))),
            ("client.address", .string(r.client)), ("sessiongate.request_id", .string(r.requestID)),
        ]
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
                                      name: "upstream \(r.method)", kind: .client, start: unixTime(uptime: t.upstreamAsked), end: end)
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
        protocolName.hasPrefix("HTTP/") ? String(protocolName.dropFirst(5)) : protocolName
    }

    // MARK: exporting

    /// Starts the export task (once).
    func start() {
        exporting.withLockedValue { task in
            guard task == nil else { return }
            task = Task { await self.exportLoop() }
        }
    }

    /// Exports what is queued, then stops: after the listeners drained.
    func shutdown() async {
        stopped.withLockedValue { $0 = true }
        start()  // a tracer never started still exports what it holds
        signal()
        await exporting.withLockedValue { $0 }?.value
        await exporter.shutdown()
    }

    private func signal() {
        wake.withLockedValue { continuation in
            continuation?.resume()
            continuation = nil
        }
    }

    private func exportLoop() async {
        var failing = false
        while true {
            let stopping = stopped.withLockedValue { $0 }
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
                if batch.count == Self.batchSize { continue }
            }
            if stopping { return }
            await sleep(Self.exportInterval)
        }
    }

    /// Waits for `interval`, or less when a batch fills or the tracer stops.
    private func sleep(_ interval: TimeAmount) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = stopped.withLockedValue { $0 } || queue.withLockedValue { $0.count >= Self.batchSize }
            if ready {
                continuation.resume()
                return
            }
            wake.withLockedValue { $0 = continuation }
            Task {
                try? await Task.sleep(nanoseconds: UInt64(interval.nanoseconds))
                self.signal()
            }
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
            case .failure(let error): self.end(error: "\(error)")
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

    /// Runs a call to another service (Apple, the app) in a client span named `name`, giving
    /// `body` the fields that carry the trace to it (`traceparent`, `tracestate`): the span's
    /// when the trace is recorded, the scope's when not; none outside a trace.
    static func outbound<T>(_ name: String, _ attributes: [(String, SpanRecord.Value)] = [], _ body: ([(String, String)]) async -> T) async -> T {
        await span(name, kind: .client, attributes) {
            guard let context = current?.context else { return await body([]) }
            var fields = [("traceparent", context.traceparent)]
            if let state = context.state { fields.append(("tracestate", state)) }
            return await body(fields)
        }
    }

    /// Runs work no request started as the root span `name` of a trace of its own (recorded by
    /// `tracing.sample_ratio`), or just runs it when nothing is traced.
    static func root<T>(_ tracer: GatewayTracer?, _ name: String, _ body: () async -> T) async -> T {
        guard let tracer else { return await body() }
        let (span, context) = tracer.root(name)
        let result = await $current.withValue(TraceScope(tracer: tracer, context: context)) { await body() }
        span?.end()
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
