import HTTPProxy

/// Turns each finished exchange into one access-log line, the request metrics and, when it
/// was traced, its spans.
struct GatewayObserver: ProxyObserver {
    let metrics: GatewayMetrics
    let accessLog: AccessLog?
    let tracer: GatewayTracer?

    var wantsRequestDetails: Bool { accessLog != nil }

    func exchangeCompleted(_ record: ExchangeRecord) {
        metrics.recordRequest(route: record.route ?? "-", status: record.status, durationNanoseconds: record.durationNanoseconds,
                              http2: record.protocolName == "HTTP/2")
        accessLog?.write(record)
        tracer?.exchange(record)
    }

    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { metrics.recordUpstreamError(route: route, kind: kind) }
    func clientConnectionOpened() { metrics.clientConnections.increment() }
    func clientConnectionClosed() { metrics.clientConnections.decrement() }
    func upstreamConnectionOpened(_ upstream: UpstreamAddress) {
        metrics.upstreamConnections.increment()
        metrics.recordUpstreamConnect(upstream.description)
    }
    func upstreamConnectionClosed() { metrics.upstreamConnections.decrement() }
    func tlsHandshakeFailed(_ reason: TLSHandshakeFailure) { metrics.recordTLSHandshakeFailure(reason) }
    func clientConnectionRefused(_ reason: ConnectionRefusal) { metrics.recordConnectionRefused(reason) }
}
