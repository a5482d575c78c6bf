import HTTPProxy

/// Turns each finished exchange into one access-log line and the request metrics.
struct GatewayObserver: ProxyObserver {
    let metrics: GatewayMetrics
    let accessLog: AccessLog?

    var wantsRequestDetails: Bool { accessLog != nil }

    func exchangeCompleted(_ record: ExchangeRecord) {
        metrics.recordRequest(route: record.route ?? "-", status: record.status, durationNanoseconds: record.durationNanoseconds,
                              http2: record.protocolName == "HTTP/2")
        accessLog?.write(record)
    }

    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { metrics.recordUpstreamError(route: route, kind: kind) }
    func clientConnectionOpened() { metrics.clientConnections.increment() }
    func clientConnectionClosed() { metrics.clientConnections.decrement() }
    func upstreamConnectionOpened() { metrics.upstreamConnections.increment() }
    func upstreamConnectionClosed() { metrics.upstreamConnections.decrement() }
    func tlsHandshakeFailed(_ reason: TLSHandshakeFailure) { metrics.recordTLSHandshakeFailure(reason) }
    func clientConnectionRefused(_ reason: ConnectionRefusal) { metrics.recordConnectionRefused(reason) }
}
