import NIOCore

/// The spans of one traced exchange as the proxy times them, handed to the observer when the
/// exchange ends (`ExchangeRecord.trace`): the request (a server span, `context.spanID`), the
/// guard's decision (admission), and the exchange with the upstream (a client span, whose id
/// the upstream receives in `traceparent`) with its connect. Times are uptimes
/// (`NIODeadline.uptimeNanoseconds`); 0: the step did not happen.
public struct ExchangeSpans: Sendable {
    /// The trace, and the request's own span.
    public var context: TraceContext
    /// The trusted caller's span, when it sent a `traceparent`.
    public var parentSpanID: UInt64?
    public var admissionSpanID: UInt64
    public var upstreamSpanID: UInt64
    public var connectSpanID: UInt64
    public var start: UInt64
    /// The guard's verdict was applied.
    public var decided: UInt64 = 0
    /// An upstream connection was asked for, was had, and the response head came.
    public var upstreamAsked: UInt64 = 0
    public var connected: UInt64 = 0
    public var firstByte: UInt64 = 0
    /// The exchange ended (the record was made).
    public var end: UInt64 = 0

    /// The context the guard's work (store reads, Apple) is a child of.
    public var admission: TraceContext { context.child(admissionSpanID) }
    /// What the upstream receives: the trace, and the upstream span as its parent.
    public var upstream: TraceContext { context.child(upstreamSpanID) }

    /// A traced exchange's spans: the caller's context when a trusted proxy sent a valid one,
    /// otherwise a new trace; ids from `next` (never 0).
    static func start(_ inbound: InboundRequest, sampler: TraceSampler, at start: NIODeadline, next: () -> UInt64) -> ExchangeSpans {
        let caller = inbound.traceParent.flatMap { TraceContext.parse(traceparent: $0, tracestate: inbound.traceState) }
        let traceID = caller?.traceID ?? TraceID(high: next(), low: next())
        let context = TraceContext(traceID: traceID, spanID: next(), sampled: sampler.samples(traceID, parent: caller), state: caller?.state)
        return ExchangeSpans(context: context, parentSpanID: caller?.spanID, admissionSpanID: next(), upstreamSpanID: next(),
                             connectSpanID: next(), start: start.uptimeNanoseconds)
    }
}

/// An exchange's spans while it runs: a reference, so that the exchange's log stays small
/// (untraced exchanges carry nil). Used on the exchange's event loop only.
final class ExchangeTrace {
    var spans: ExchangeSpans

    init(_ spans: ExchangeSpans) { self.spans = spans }
}
