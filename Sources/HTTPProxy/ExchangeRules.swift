import GatewayConfig
import NIOCore
import NIOHTTP1

/// The decisions the proxy handler takes for each exchange, as pure functions (tested without
/// I/O in `ExchangeRulesTests`; the handler only applies them).
enum ExchangeRules {
    /// How the response body is framed towards the client.
    enum ResponseFraming: Equatable {
        /// HEAD, 204, 304: no body whatever the headers say.
        case noBody
        /// The upstream's `Content-Length` is forwarded and the bytes pass as they are.
        case raw
        /// Re-chunked for an HTTP/1.1 client.
        case chunked
        /// An HTTP/1.0 client without a length: the body ends when the connection closes.
        case untilClose
    }

    /// RFC 9112 §6.3.
    static func responseFraming(requestMethod: HTTPMethod, status: Int, hasContentLength: Bool, clientVersion: HTTPVersion) -> ResponseFraming {
        if requestMethod == .HEAD || status == 204 || status == 304 { return .noBody }
        if hasContentLength { return .raw }
        // HTTP/2 frames every body; `.chunked` stands for "no length" there.
        return clientVersion.major >= 2 || clientVersion.minor >= 1 ? .chunked : .untilClose
    }

    /// Whether the upstream connection may serve another request after this response.
    static func upstreamKeepsAlive(version: HTTPVersion, connectionTokens: [String]) -> Bool {
        version.minor >= 1 ? !connectionTokens.contains("close") : connectionTokens.contains("keep-alive")
    }

    /// Whom the upstream connection of a forwarded request serves (`routes[].upstream_reuse`);
    /// nil: this request only — a fresh connection, sent `Connection: close`, closed after.
    ///
    /// `echo`: any bodyless request's (every response must echo its own `X-Request-Id`, so
    /// late bytes never pass as another request's response); one with a body gets a connection
    /// of its own, as in `principal`, for the same reason.
    ///
    /// `principal`: the admitted user, or an anonymous request's client connection, so that
    /// bytes an app sends late reach no other client. Two requests get a connection of their own
    /// even so: one with a body (an app that answers without reading it — CL.0 — would read the
    /// body as the next request on the connection, with whatever identity headers the body
    /// spells out; `Connection: close` tells it to stop after its answer), and an anonymous one
    /// that came through a trusted proxy (whose connection carries many clients).
    static func upstreamPrincipal(reuse: GatewayConfiguration.UpstreamReuse, user: String?, client: UInt64, hasBody: Bool,
                                  viaTrustedProxy: Bool) -> UpstreamPrincipal? {
        switch reuse {
        case .none: return nil
        case .shared: return .anyone
        case .echo: return hasBody ? nil : .echoing
        case .principal:
            if hasBody { return nil }
            if let user { return .user(user) }
            return viaTrustedProxy ? nil : .client(client)
        }
    }

    /// Whether an `echo` route's response (or interim response) is the one to this request: it
    /// carries exactly one `X-Request-Id`, the request's own.
    static func echoes(_ head: WireHead, requestID: String) -> Bool {
        head.hasOneField("x-request-id", equalTo: requestID)
    }

    /// Whether a request whose upstream connection closed before any response byte may be sent
    /// again on a fresh connection (RFC 9110 §9.2.2): idempotent, no body (nothing to replay),
    /// completely sent, on a connection reused from the pool (a fresh one failing is the
    /// upstream's answer), and not retried already.
    static func mayRetry(method: HTTPMethod, connectionWasReused: Bool, requestHasBody: Bool, requestEnded: Bool, alreadyRetried: Bool) -> Bool {
        let idempotent: Bool
        switch method {
        case .GET, .HEAD, .OPTIONS, .PUT, .DELETE, .TRACE: idempotent = true
        default: idempotent = false
        }
        return idempotent && connectionWasReused && !requestHasBody && requestEnded && !alreadyRetried
    }

    /// Where a connection stands, as far as reading from the client is concerned.
    enum Phase: Equatable {
        case idle, awaitingVerdict, collecting, connecting, forwarding, closed
    }

    /// Whether the client may be read now. Never while a verdict or a connection is pending;
    /// a request body only as fast as the upstream takes it (or, for the gateway's own
    /// endpoints, until it is complete); once the request is complete, only
    /// while nothing of a pipelined request is held unparsed (`pipelinedEmpty`: so buffering stays
    /// bounded by a single read, and the connection's read interest is not toggled per request).
    /// Between requests, only while the client takes our responses (`clientWritable`): the
    /// gateway's own answers are not paced by an upstream, so a client pipelining requests
    /// without reading would otherwise pile responses up in memory.
    static func shouldReadClient(phase: Phase, quiescing: Bool, requestEnded: Bool, pipelinedEmpty: Bool, upstreamWritable: Bool,
                                 clientWritable: Bool = true) -> Bool {
        switch phase {
        case .idle: return !quiescing && clientWritable
        case .collecting: return !requestEnded
        case .awaitingVerdict, .connecting, .closed: return false
        case .forwarding: return requestEnded ? pipelinedEmpty : upstreamWritable
        }
    }

    /// What a decoder error (bytes that do not parse) does to the exchange in flight. Bytes are
    /// parsed only while the current request is arriving or between requests (a pipelined
    /// request waits unparsed for its turn), so junk behind a complete request is answered in
    /// its turn, after the request before it.
    enum DecoderErrorAction: Equatable {
        /// Answer 400/431 now and close (nothing is in flight, or the request itself broke
        /// before any response byte).
        case answerNow
        /// The request broke while its response was streaming: abort the connection.
        case abort
    }

    static func onDecoderError(phase: Phase, responseStarted: Bool) -> DecoderErrorAction {
        phase != .idle && responseStarted ? .abort : .answerNow
    }

    /// Whether a response status can be relayed: outside 100–599 nobody can say how the
    /// message is framed (502, as nginx answers). The framing fields are the wire engine's
    /// (`MessageFraming.response`).
    static func relaysStatus(_ status: Int) -> Bool { (100...599).contains(status) }

    /// Every KiB of request body received earns the client one more second beyond
    /// `timeouts.request_body` (a minimum rate, as Apache's `mod_reqtimeout`): a large upload
    /// at a honest pace is never cut off, one byte every few seconds always is.
    static let bodyBytesPerSecond = 1024

    /// When a request body must be complete: its allowance from the head, plus the time the
    /// gateway itself held the client back (verdict, connect, a slow upstream), plus the rate
    /// credit for what already arrived.
    static func bodyDeadline(start: NIODeadline, allowance: TimeAmount, held: TimeAmount, bytesReceived: Int) -> NIODeadline {
        start + allowance + held + .seconds(Int64(bytesReceived / bodyBytesPerSecond))
    }

    /// Whether the client connection stays open for another request after this exchange. After
    /// the client's FIN too: requests pipelined before it are still to be answered, and the
    /// connection closes when none is left (`onClientInputEnd`).
    static func clientKeepsAlive(requested: Bool, requestComplete: Bool, quiescing: Bool) -> Bool {
        requested && requestComplete && !quiescing
    }

    /// What the end of the client's input (its FIN) does to the exchange in flight, once every
    /// complete part the client sent before it was handed in.
    enum InputEndAction: Equatable {
        /// Nothing now: the request in flight is complete and is answered (or the connection is
        /// closing already).
        case carryOn
        /// Between requests: close.
        case close
        /// The request was cut short, its head or body incomplete: it can never be answered.
        /// It ends now as the client's abort, and the upstream request it started with it —
        /// not at the idle timeout, logged as the app's 504.
        case abortRequest
    }

    static func onClientInputEnd(phase: Phase, requestEnded: Bool) -> InputEndAction {
        switch phase {
        case .idle: return .close
        case .closed: return .carryOn
        case .awaitingVerdict, .collecting, .connecting, .forwarding: return requestEnded ? .carryOn : .abortRequest
        }
    }

    /// What a response head tells the client in `Connection`, for the gateway's own responses
    /// and relayed ones alike.
    enum ConnectionField: Equatable {
        /// Nothing: HTTP/1.1 keeps the connection by default.
        case none
        /// The gateway closes the connection after this response.
        case close
        /// An HTTP/1.0 client assumes close unless told otherwise (RFC 9112 §9.3, appendix C.2.2).
        case keepAlive
    }

    static func connectionField(keepAlive: Bool, clientVersion: HTTPVersion) -> ConnectionField {
        guard keepAlive else { return .close }
        return clientVersion.minor == 0 ? .keepAlive : .none
    }
}
