import NIOCore
import NIOHTTP1

/// The admission hook the proxy asks before forwarding a request (DESIGN §2, step 2).
///
/// The proxy stops reading the client until a verdict exists. A guard answers synchronously
/// (`.verdict`) when it can — the hot path allocates no future — and with a future otherwise.
public protocol RequestGuard: Sendable {
    /// Called on the client channel's event loop. `request.head` carries the headers exactly as
    /// the client sent them; `request.target` is the one canonical target.
    func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision
}

public struct GuardRequest: Sendable {
    /// The head as the client sent it (nil when made from an `HTTPRequestHead`).
    let wire: WireHead?
    private let parsed: HTTPRequestHead?
    public var target: RequestTarget
    public var routeName: String
    public var clientAddress: SocketAddress?
    /// The normalized `Host` (nil for an HTTP/1.0 request without one).
    public var host: RequestHost?
    /// A WebSocket handshake (`Connection: upgrade`, `Upgrade: websocket`).
    public var isWebSocketUpgrade: Bool
    /// `Authorization: Bearer …` was sent (found in the proxy's one pass over the headers).
    public var hasBearer: Bool
    /// The request is traced: the admission span, the parent of what the guard does to decide
    /// (store reads, a re-validation). Recorded only when `sampled`.
    public var trace: TraceContext? = nil
    /// The request's own span (with `trace`): the parent of work done after the decision, an
    /// endpoint answering from the body it collected.
    var requestSpanID: UInt64 = 0
    public var requestTrace: TraceContext? { trace?.child(requestSpanID) }

    public init(head: HTTPRequestHead, target: RequestTarget, routeName: String, clientAddress: SocketAddress? = nil, host: RequestHost? = nil,
                isWebSocketUpgrade: Bool = false, hasBearer: Bool = false) {
        self.init(wire: nil, parsed: head, target: target, routeName: routeName, clientAddress: clientAddress, host: host,
                  isWebSocketUpgrade: isWebSocketUpgrade, hasBearer: hasBearer)
    }

    /// A request as the proxy received it.
    init(wire: WireHead, target: RequestTarget, routeName: String, clientAddress: SocketAddress?, host: RequestHost?,
         isWebSocketUpgrade: Bool, hasBearer: Bool) {
        self.init(wire: wire, parsed: nil, target: target, routeName: routeName, clientAddress: clientAddress, host: host,
                  isWebSocketUpgrade: isWebSocketUpgrade, hasBearer: hasBearer)
    }

    private init(wire: WireHead?, parsed: HTTPRequestHead?, target: RequestTarget, routeName: String, clientAddress: SocketAddress?,
                 host: RequestHost?, isWebSocketUpgrade: Bool, hasBearer: Bool) {
        self.wire = wire
        self.parsed = parsed
        self.target = target
        self.routeName = routeName
        self.clientAddress = clientAddress
        self.host = host
        self.isWebSocketUpgrade = isWebSocketUpgrade
        self.hasBearer = hasBearer
    }

    /// The head with every field decoded: built when asked (the gateway's own endpoints and
    /// pages); admission reads single fields with `forEachValue` instead.
    public var head: HTTPRequestHead {
        if let parsed { return parsed }
        guard let wire else { return HTTPRequestHead(version: .http1_1, method: .GET, uri: "/") }
        return HTTPRequestHead(version: wire.version, method: wire.method, uri: wire.target, headers: wire.headers)
    }

    public var method: HTTPMethod { wire?.method ?? parsed?.method ?? .GET }
}

/// Header fields read one name at a time: a received head (`GuardRequest`) without decoding
/// the others, or `HTTPHeaders`.
public protocol HeaderValues {
    /// Calls `body` with the value of every field named `lower` (lower case), in order.
    func forEachValue(named lower: String, _ body: (String) -> Void)
    /// `forEachValue` without making a `String` of each value: the bytes are valid during
    /// `body` only.
    func forEachValueBytes(named lower: String, _ body: (UnsafeRawBufferPointer) -> Void)
    /// False when no `Authorization: Bearer` field was sent (known from the proxy's one pass):
    /// nothing need look for one.
    var mayCarryBearer: Bool { get }
}

extension HeaderValues {
    public var mayCarryBearer: Bool { true }

    public func forEachValueBytes(named lower: String, _ body: (UnsafeRawBufferPointer) -> Void) {
        forEachValue(named: lower) { value in
            var value = value
            value.withUTF8 { body(UnsafeRawBufferPointer($0)) }
        }
    }
}

extension HTTPHeaders: HeaderValues {
    public func forEachValue(named lower: String, _ body: (String) -> Void) {
        for (name, value) in self where HeaderName.equals(name, lower) { body(value) }
    }
}

extension GuardRequest: HeaderValues {
    /// Known from the proxy's pass for a received head; a head given whole is looked at.
    public var mayCarryBearer: Bool { wire == nil || hasBearer }

    public func forEachValue(named lower: String, _ body: (String) -> Void) {
        if let wire {
            for field in wire.fields where wire.nameEquals(field, lower) { body(wire.value(field)) }
        } else {
            parsed?.headers.forEachValue(named: lower, body)
        }
    }

    public func forEachValueBytes(named lower: String, _ body: (UnsafeRawBufferPointer) -> Void) {
        guard let wire else {
            parsed?.headers.forEachValueBytes(named: lower, body)
            return
        }
        wire.bytes.withUnsafeReadableBytes { raw in
            for field in wire.fields where wire.nameEquals(field, lower) {
                body(UnsafeRawBufferPointer(rebasing: raw[Int(field.valueStart)..<Int(field.valueStart + field.valueLength)]))
            }
        }
    }

    /// A CORS preflight (the Fetch standard): `OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`. It carries no cookies or credentials.
    public var isPreflight: Bool {
        method == .OPTIONS && firstValue(named: "origin") != nil && firstValue(named: "access-control-request-method") != nil
    }

    /// The first value of the field named `lower`.
    public func firstValue(named lower: String) -> String? {
        var first: String? = nil
        forEachValue(named: lower) { if first == nil { first = $0 } }
        return first
    }
}

public enum GuardDecision {
    case verdict(Verdict)
    case pending(EventLoopFuture<Verdict>)
}

extension EventLoopFuture where Value == Verdict {
    /// A verdict decided later reaches its requester on `loop` — unless the requester is `gone()`
    /// by then (its connection or stream closed): nobody applies the verdict, so it is discarded.
    func deliver(on loop: any EventLoop, unless gone: @escaping () -> Bool, _ deliver: @escaping (Result<Verdict, any Error>) -> Void) {
        let callbacks = NIOLoopBound((gone: gone, deliver: deliver), eventLoop: loop)
        hop(to: loop).whenComplete { result in
            guard !callbacks.value.gone() else {
                if case .success(let verdict) = result { verdict.discard() }
                return
            }
            callbacks.value.deliver(result)
        }
    }
}

public enum Verdict: Sendable {
    /// Forward upstream, adding these headers (after every identity header was stripped) and
    /// removing `removeHeaders` (e.g. `Authorization` when it carried the gateway's own session
    /// token). `tunnel`: for a WebSocket handshake, a lease the guard can end later. `user`: who
    /// was admitted (the access log's `user`).
    case forward(addHeaders: [(String, String)], removeHeaders: [String] = [], tunnel: TunnelLease? = nil, user: String? = nil)
    /// Answer the client directly; the upstream sees nothing.
    case respond(LocalResponse)
    /// Read the request body (at most `maxBytes`, else 413), then answer with what `respond`
    /// makes of it: the gateway's own POST endpoints. The upstream sees nothing.
    case collectBody(maxBytes: Int, respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>)

    public static let forward = Verdict.forward(addHeaders: [])

    /// A verdict nobody will apply: a tunnel lease it carries is finished (it leaves its registry).
    func discard() {
        if case .forward(_, _, let tunnel?, _) = self { tunnel.finish() }
    }
}

/// A response the gateway writes itself (errors, redirects, its own endpoints).
public struct LocalResponse: Sendable {
    public var status: HTTPResponseStatus
    public var headers: [(String, String)]
    public var body: ByteBuffer
    /// Close the client connection after this response.
    public var close: Bool
    /// What the access log says this answer was about, beyond the request it answers.
    public var subject: LoggedSubject? = nil

    /// A forward-auth check (`/_auth/check`) answers for another request: the access log names
    /// the user it admitted and the request the front proxy asked about.
    public struct LoggedSubject: Sendable, Equatable {
        public var user: String?
        /// `METHOD path` of the original request, as a trusted front proxy sent it.
        public var original: String?

        public init(user: String?, original: String?) {
            self.user = user
            self.original = original
        }
    }

    public init(status: HTTPResponseStatus, headers: [(String, String)] = [], body: ByteBuffer = ByteBuffer(), close: Bool = false) {
        self.status = status
        self.headers = headers
        self.body = body
        self.close = close
    }

    /// A short plain-text error: `"<code> <reason>: <detail>\n"`.
    public static func error(_ status: HTTPResponseStatus, _ detail: String, close: Bool = false) -> LocalResponse {
        LocalResponse(
            status: status,
            headers: [("content-type", "text/plain; charset=utf-8")],
            body: ByteBuffer(string: "\(status.code) \(status.reasonPhrase): \(detail)\n"),
            close: close
        )
    }
}

/// Admits every request: the behaviour of `auth: public`.
public struct PublicGuard: RequestGuard {
    public init() {}
    public func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision { .verdict(.forward) }
}
