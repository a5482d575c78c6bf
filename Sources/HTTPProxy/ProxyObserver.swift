import NIOCore

/// Why an exchange with an upstream failed (bounded: a metric label).
public enum UpstreamErrorKind: String, Sendable, CaseIterable {
    case connectRefused = "connect_refused"
    case connectTimeout = "connect_timeout"
    case responseTimeout = "response_timeout"
    case closedBeforeResponse = "closed_before_response"
    case resetDuringResponse = "reset_during_response"
    case idleTimeout = "idle_timeout"
    /// A response head the gateway will not relay (ambiguous `Transfer-Encoding`): 502.
    case invalidResponse = "invalid_response"
    /// The TLS handshake with an https upstream failed (certificate not trusted, wrong name) or
    /// timed out: 502.
    case tlsHandshake = "tls_handshake"
    /// Not sent: the route had `max_in_flight` requests in flight already (503 + `Retry-After`).
    case maxInFlight = "max_in_flight"
    /// Not sent: every connection of the upstream's budget (`upstream_max_connections`) stayed
    /// in use for `upstream_connect` (503 + `Retry-After`).
    case connectionsExhausted = "connections_exhausted"
    /// The app's response did not echo the request's `X-Request-Id` on an `echo` route: 502,
    /// the connection closed.
    case echoMismatch = "echo_mismatch"
}

/// One completed (or abandoned) exchange, for the access log and metrics.
public struct ExchangeRecord: Sendable {
    /// The status of an exchange the client abandoned before any response byte (it closed or
    /// reset its connection, or its request ended short): nginx's 499, "client closed request".
    /// No client ever receives it.
    public static let clientClosedRequest = 499

    public var method: String
    /// The canonical path, or the raw target when it could not be parsed.
    public var path: String
    /// The status sent, or `clientClosedRequest` (499) when the client left before any was.
    public var status: Int
    public var route: String?
    public var upstream: UpstreamAddress?
    public var client: String
    public var requestID: String
    public var durationNanoseconds: Int64
    public var bytesSent: Int
    /// The exchange ended without a complete response (aborted connection).
    public var aborted: Bool
    public var userAgent: String?
    /// The signed-in user the guard admitted (Apple's `sub`), if any.
    public var user: String? = nil
    /// From asking for an upstream connection to the upstream's response head (connect plus the
    /// app's time to answer: nginx's `$upstream_header_time`); nil when nothing went upstream.
    public var upstreamNanoseconds: Int64? = nil
    /// What the client spoke: `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    public var protocolName: String = "HTTP/1.1"
    /// A forward-auth check's original request (`METHOD URI`, from a trusted front proxy).
    public var original: String? = nil
    /// The exchange's spans, when it was traced (`RoutingSnapshot.tracing`).
    public var trace: ExchangeSpans? = nil
}

/// What the proxy reports; the gateway turns it into metrics and access-log lines.
/// Called on event loops: implementations must be cheap and thread-safe.
public protocol ProxyObserver: Sendable {
    /// Whether records need the fields only an access log uses (`userAgent`); skipped otherwise.
    var wantsRequestDetails: Bool { get }
    func exchangeCompleted(_ record: ExchangeRecord)
    func upstreamFailed(_ kind: UpstreamErrorKind, route: String)
    func clientConnectionOpened()
    func clientConnectionClosed()
    /// A new connection to `upstream` is up (`sessiongate_upstream_connects_total`).
    func upstreamConnectionOpened(_ upstream: UpstreamAddress)
    func upstreamConnectionClosed()
    /// A client's TLS handshake on the public listener did not complete.
    func tlsHandshakeFailed(_ reason: TLSHandshakeFailure)
    /// A client connection was over a cap (`server.limits`): answered 503 and closed.
    func clientConnectionRefused(_ reason: ConnectionRefusal)
}

extension ProxyObserver {
    public func tlsHandshakeFailed(_ reason: TLSHandshakeFailure) {}
    public func clientConnectionRefused(_ reason: ConnectionRefusal) {}
}

public struct SilentProxyObserver: ProxyObserver {
    public init() {}
    public var wantsRequestDetails: Bool { false }
    public func exchangeCompleted(_ record: ExchangeRecord) {}
    public func upstreamFailed(_ kind: UpstreamErrorKind, route: String) {}
    public func clientConnectionOpened() {}
    public func clientConnectionClosed() {}
    public func upstreamConnectionOpened(_ upstream: UpstreamAddress) {}
    public func upstreamConnectionClosed() {}
}
