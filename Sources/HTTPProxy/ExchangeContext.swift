import NIOCore
import NIOHTTP1

/// One request/response pair on a client connection, from its head to its last response byte.
///
/// A class for its identity: every answer that comes back later (a verdict, an endpoint's
/// response, an upstream connection) names the exchange it was asked for, and the state machine
/// applies it only while that very exchange is still the one waiting for it. A late answer for a
/// finished exchange cannot be mistaken for the current one's (no generation counters).
///
/// A connection reuses its last context for the next request (`reset`) when nothing else holds
/// it any more (no answer can come back for it): an allocation per request was ~1.5 % of one.
final class ExchangeContext {
    private(set) var method: HTTPMethod
    private(set) var clientVersion: HTTPVersion
    private(set) var start: NIODeadline
    /// The canonical path once the target parsed; the raw target before.
    var path: String
    var requestID: String
    var requestEnded = false
    var requestHasBody = false
    /// The body goes upstream in chunks (it came chunked).
    var requestChunked = false
    var keepAlive = false
    var isWebSocket = false
    var route: ProxyRoute? = nil
    var userAgent: String? = nil
    /// Kept between the head and the verdict (the upstream head is written from it).
    var inbound: InboundRequest? = nil
    var target: RequestTarget? = nil
    /// The request head as it goes upstream (kept for the retry).
    var upstreamHead: ByteBuffer? = nil
    var responseStarted = false
    var framing: ExchangeRules.ResponseFraming = .raw
    var upstreamKeepAlive = true
    var status = 0
    var bytesSent = 0
    var retried = false
    /// The request went to the upstream (not answered by the gateway itself).
    var forwarded = false
    /// Request body bytes received so far, and the route's bound on them (0: none).
    var bodyBytes = 0
    var maxBodyBytes = 0
    /// The routing snapshot this request was admitted under (its header rules).
    var snapshot: RoutingSnapshot? = nil
    /// A WebSocket handshake's lease: attached on upgrade, finished otherwise.
    var tunnel: TunnelLease? = nil
    /// Who the guard admitted, for the access log.
    var user: String? = nil
    /// It holds one of its route's `max_in_flight` places (given back when it ends).
    var inFlight = false
    /// When the upstream connection was asked for, and how long until the response head.
    var upstreamStart: NIODeadline? = nil
    var upstreamNanoseconds: Int64? = nil

    init(method: HTTPMethod, clientVersion: HTTPVersion, start: NIODeadline, path: String, requestID: String) {
        self.method = method
        self.clientVersion = clientVersion
        self.start = start
        self.path = path
        self.requestID = requestID
    }

    /// Makes this context what `init` would make (every stored property; a test compares the two).
    func reset(method: HTTPMethod, clientVersion: HTTPVersion, start: NIODeadline, path: String, requestID: String) {
        self.method = method
        self.clientVersion = clientVersion
        self.start = start
        self.path = path
        self.requestID = requestID
        requestEnded = false
        requestHasBody = false
        requestChunked = false
        keepAlive = false
        isWebSocket = false
        route = nil
        userAgent = nil
        inbound = nil
        target = nil
        upstreamHead = nil
        responseStarted = false
        framing = .raw
        upstreamKeepAlive = true
        status = 0
        bytesSent = 0
        retried = false
        forwarded = false
        bodyBytes = 0
        maxBodyBytes = 0
        snapshot = nil
        tunnel = nil
        user = nil
        inFlight = false
        upstreamStart = nil
        upstreamNanoseconds = nil
    }

    /// The exchange ended (answered, aborted, dropped, or a tunnel now): its route's in-flight
    /// place, if it held one, is given back, and a WebSocket lease it did not hand to a tunnel
    /// (an upgrade takes it first) leaves its registry.
    func ended() {
        if inFlight {
            inFlight = false
            route?.leaveInFlight()
        }
        if let tunnel {
            self.tunnel = nil
            tunnel.finish()
        }
    }

    /// The access-log record of this exchange.
    func record(aborted: Bool, client: String, now: NIODeadline) -> ExchangeRecord {
        ExchangeRecord(
            method: method.rawValue, path: path, status: status, route: route?.name, upstream: forwarded ? route?.upstream : nil,
            client: client, requestID: requestID, durationNanoseconds: Int64(now.uptimeNanoseconds - start.uptimeNanoseconds),
            bytesSent: bytesSent, aborted: aborted, userAgent: userAgent, user: user, upstreamNanoseconds: upstreamNanoseconds)
    }
}
