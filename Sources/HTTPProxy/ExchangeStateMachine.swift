import GatewayConfig
import NIOCore
import NIOHTTP1

/// One request and its response, as a value: from the guard's question to the last response
/// byte, whatever protocol the client speaks. Each event (a body part, the verdict, an upstream
/// connection, a response part, a timer) moves it to its next state and returns the one
/// `Action` its connection runs. The HTTP/1 connection machine nests one per request
/// (`ClientConnectionStateMachine.State.exchange`); encoding for the client is the
/// connection's.
///
/// Each state holds what only it means: the admitted request while the guard decides, the body
/// parts received while nothing can take them, the collector of an endpoint's body, the request
/// head kept for a retry while connecting and forwarding, the response deadline until the
/// response starts. What lasts the whole exchange is beside the state: what the access log
/// records (`log`), the places it holds (`lease`), how much of the request arrived (`body`).
///
/// Answers that come back later name the exchange by `id`; one for an exchange that ended finds
/// no state to apply to and is let go (`.discard`, `.closeUpstream`).
struct ExchangeStateMachine {
    typealias Part = RequestReader.Part

    enum State {
        /// The route's guard is deciding; body parts wait.
        /// (Boxed: the admitted request is most of an exchange's size, and is needed only here.)
        indirect case awaitingVerdict(Admission.Admitted, waiting: [Part])
        /// Reading a body for one of the gateway's own endpoints.
        case collecting(Collector)
        /// The endpoint has the body and is answering.
        case answering
        /// Waiting for an upstream connection; body parts wait (an array: an empty one is no
        /// allocation, where a `CircularBuffer` allocated its storage for every request).
        case connecting(Forward, waiting: [Part])
        /// The request goes to, and the response comes from, this upstream connection.
        case forwarding(Forward, UpstreamConnection, Response)
        /// The response is complete, or the exchange was aborted: nothing applies any more.
        case ended
    }

    struct Collector {
        let maxBytes: Int
        let respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>
        var body: ByteBuffer
    }

    /// The request on its way upstream.
    struct Forward {
        let route: ProxyRoute
        /// The request head as it goes upstream (kept for the retry).
        let head: ByteBuffer
        /// The header rules it was admitted under (they apply to the response head too).
        let rules: RequestHeaderRules
        let principal: UpstreamPrincipal?
        /// When the upstream connection was asked for.
        let since: NIODeadline
        var retried = false
    }

    enum Response {
        /// Not started; the upstream must answer by `deadline` once the request was sent whole.
        case awaited(deadline: NIODeadline?)
        /// The head went to the client; the body follows framed so.
        case relaying(ExchangeRules.ResponseFraming, upstreamKeepAlive: Bool)
    }

    /// How much of the request body arrived, and the clock it arrives against.
    struct RequestBody {
        var framing: BodyFraming = .none
        var ended = false
        var received = 0
        /// The route's bound (0: none).
        var limit = 0
        /// While a body is arriving: when its head came, and how long the gateway held the client
        /// back meanwhile (not the client's time).
        var clock: Clock? = nil

        struct Clock {
            var start: NIODeadline
            var held: TimeAmount = .zero
            var heldSince: NIODeadline? = nil
        }

        var expected: Bool { framing != .none }
        /// Read to its end (or there is none): the connection's framing is not in doubt.
        var drained: Bool { ended || framing == .none }
    }

    /// Kept small (a few words): an action is returned and switched on per event. The rare
    /// large ones are boxed (`indirect`).
    enum Action {
        case none
        /// Ask the route's guard (`Admitted.guardRequest`); its decision comes back as `verdict`.
        case askGuard
        /// Hand the collected body to the endpoint; its response comes back as `answered`.
        case answer(ByteBuffer, respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>)
        /// Take an idle connection of `principal` (`pooled`) or open one (`principal` nil: for
        /// this request only); it comes back as `connected`.
        case connect(ProxyRoute, principal: UpstreamPrincipal?, pooled: Bool)
        /// Write the request head and what waited of the body to the new connection.
        case startForwarding(UpstreamConnection, head: ByteBuffer, chunked: Bool, body: [Part])
        case forwardBody(UpstreamConnection, ByteBuffer)
        case forwardEnd(UpstreamConnection)
        /// A response the gateway makes; `upstream` is let go (counted with `failure`). Ends
        /// the exchange.
        indirect case respond(LocalResponse, upstream: UpstreamConnection?, failure: UpstreamErrorKind?)
        /// An interim response (1xx) from the app.
        case interim(status: Int)
        /// The app's final response head, to relay framed so.
        indirect case relayHead(ResponseHead, ExchangeRules.ResponseFraming, rules: RequestHeaderRules)
        case relayBody(ByteBuffer, chunked: Bool)
        /// The app's response is complete: the connection goes back to the pool (`reuse`) or
        /// closes. Ends the exchange.
        case finish(lastChunk: Bool, upstream: UpstreamConnection, reuse: Bool)
        /// The response cannot be completed (`upstream` closed too). Ends the exchange.
        case abort(upstream: UpstreamConnection?, failure: UpstreamErrorKind?)
        /// The app accepted the WebSocket handshake: relay its 101, then splice. Ends the exchange.
        indirect case upgrade(UpstreamConnection, ResponseHead, rules: RequestHeaderRules)
        /// A connection nobody needs (it came too late).
        case closeUpstream(UpstreamConnection)
        /// A verdict nobody will apply: its tunnel lease, if any, is finished. Indirect: a
        /// verdict holds a whole local response, and discarding one is rare.
        indirect case discard(Verdict)
    }

    /// Who the client is, for the upstream head and the pool.
    struct Client {
        /// The principal of an anonymous request on this client connection.
        var id: UInt64
        /// The address as `X-Forwarded-For` writes it.
        var address: String
        /// The peer is one of `server.trusted_proxies`.
        var trusted: Bool
        var scheme: String
    }

    /// This exchange's number on its connection: answers that come back name it.
    let id: UInt64
    var log: ExchangeLog
    var lease = ExchangeLease()
    var body = RequestBody()
    /// A WebSocket handshake (its connection becomes a tunnel, never pooled).
    var isWebSocket = false
    var state: State

    /// An exchange the guard is to decide (`admitted`); `now`: when its head came.
    init(id: UInt64, log: ExchangeLog, admitted: Admission.Admitted, now: NIODeadline) {
        self.id = id
        self.log = log
        self.log.route = admitted.route
        self.log.path = admitted.target.path
        self.isWebSocket = admitted.inbound.isWebSocketUpgrade
        self.body = RequestBody(framing: admitted.inbound.framing, limit: admitted.route.maxBodyBytes,
                                clock: admitted.inbound.framing != .none ? .init(start: now) : nil)
        self.state = .awaitingVerdict(admitted, waiting: [])
    }

    /// An exchange answered without the guard (`Admission.Refusal`): it begins answered.
    init(id: UInt64, log: ExchangeLog, framing: BodyFraming) {
        self.id = id
        self.log = log
        self.body = RequestBody(framing: framing)
        self.state = .ended
    }

    // MARK: queries

    /// A response byte went to the client (relayed, or the gateway's own).
    var responseStarted: Bool {
        switch state {
        case .forwarding(_, _, .relaying): return true
        case .ended: return log.status != 0
        default: return false
        }
    }

    /// The phase as `ExchangeRules` sees it.
    var phase: ExchangeRules.Phase {
        switch state {
        case .awaitingVerdict, .answering: return .awaitingVerdict
        case .collecting: return .collecting
        case .connecting: return .connecting
        case .forwarding: return .forwarding
        case .ended: return .closed
        }
    }

    var upstream: UpstreamConnection? {
        if case .forwarding(_, let connection, _) = state { return connection }
        return nil
    }

    /// The response or body deadline, whichever comes first, when one runs.
    func deadline(bodyAllowance: TimeAmount) -> NIODeadline? {
        var response: NIODeadline? = nil
        if case .forwarding(_, _, .awaited(let deadline?)) = state { response = deadline }
        switch (response, bodyDeadline(allowance: bodyAllowance)) {
        case (let a?, let b?): return min(a, b)
        case (let a, let b): return a ?? b
        }
    }

    /// nil while no body is arriving, or while the gateway holds the client back.
    func bodyDeadline(allowance: TimeAmount) -> NIODeadline? {
        guard let clock = body.clock, clock.heldSince == nil, !body.ended else { return nil }
        return ExchangeRules.bodyDeadline(start: clock.start, allowance: allowance, held: clock.held, bytesReceived: body.received)
    }

    // MARK: the client's side

    /// A body part or the request's end. `.respond`/`.abort` when the body outgrew its bound.
    mutating func requestPart(_ part: Part, now: @autoclosure () -> NIODeadline, responseTimeout: TimeAmount) -> Action {
        switch part {
        case .head: return .none
        case .end:
            body.ended = true
            body.clock = nil
        case .body(let bytes):
            body.received += bytes.readableBytes
            if body.limit > 0, body.received > body.limit {
                return requestFailed(.payloadTooLarge, "request body larger than \(body.limit) bytes")
            }
        }
        switch state {
        case .awaitingVerdict(let admitted, var waiting):
            state = .ended  // lets go of the buffer's other reference, so that it grows in place
            waiting.append(part)
            state = .awaitingVerdict(admitted, waiting: waiting)
            return .none
        case .connecting(let forward, var waiting):
            state = .ended
            waiting.append(part)
            state = .connecting(forward, waiting: waiting)
            return .none
        case .collecting(var collector):
            state = .answering  // lets go of the collector's copy, so that the body grows in place
            return collect(part, &collector)
        case .forwarding(let forward, let upstream, let response):
            switch part {
            case .body(let bytes): return .forwardBody(upstream, bytes)
            case .end:
                if case .awaited = response { state = .forwarding(forward, upstream, .awaited(deadline: now() + responseTimeout)) }
                return .forwardEnd(upstream)
            case .head: return .none
            }
        case .answering, .ended:
            return .none
        }
    }

    private mutating func collect(_ part: Part, _ collector: inout Collector) -> Action {
        switch part {
        case .head:
            break
        case .body(var bytes):
            guard collector.body.readableBytes + bytes.readableBytes <= collector.maxBytes else {
                return respond(.error(.payloadTooLarge, "request body larger than \(collector.maxBytes) bytes", close: true))
            }
            collector.body.writeBuffer(&bytes)
        case .end:
            return .answer(collector.body, respond: collector.respond)
        }
        state = .collecting(collector)
        return .none
    }

    /// The request failed while its body was arriving (too large, too slow): answered with
    /// `status` if no response byte went out yet; otherwise aborted.
    mutating func requestFailed(_ status: HTTPResponseStatus, _ reason: String) -> Action {
        body.clock = nil
        if responseStarted { return abort(failure: nil) }
        return respond(.error(status, reason, close: true))
    }

    /// The connection held a read back (the gateway, not the client, is slow meanwhile).
    mutating func readHeld(now: @autoclosure () -> NIODeadline) {
        if body.clock != nil, body.clock?.heldSince == nil { body.clock?.heldSince = now() }
    }

    /// Reading resumes: the time the client was held back is not counted against its body.
    mutating func readResumed(now: @autoclosure () -> NIODeadline) {
        guard var clock = body.clock, let since = clock.heldSince else { return }
        clock.held = clock.held + (now() - since)
        clock.heldSince = nil
        body.clock = clock
    }

    /// The client left, or its request ended short: nothing can be answered. The status is the
    /// 499 of `ExchangeRecord.clientClosedRequest` unless a response had begun.
    mutating func clientLeft() -> Action {
        if !responseStarted { log.status = ExchangeRecord.clientClosedRequest }
        return abort(failure: nil)
    }

    // MARK: answers that come back

    mutating func verdict(_ result: Result<Verdict, any Error>, client: Client, allocator: ByteBufferAllocator,
                          now: @autoclosure () -> NIODeadline) -> Action {
        guard case .awaitingVerdict(let admitted, let waiting) = state else {
            if case .success(let verdict) = result { return .discard(verdict) }
            return .none
        }
        log.trace?.spans.decided = now().uptimeNanoseconds
        switch result {
        case .failure:
            return respond(.error(.serviceUnavailable, "admission could not be decided"))
        case .success(.respond(let response)):
            return respond(response)
        case .success(.collectBody(let maxBytes, let respond)):
            var collector = Collector(maxBytes: maxBytes, respond: respond, body: allocator.buffer(capacity: 0))
            state = .answering
            for part in waiting {
                let action = collect(part, &collector)
                if case .none = action { continue }
                return action
            }
            state = .collecting(collector)
            return .none
        case .success(.forward(let addHeaders, let removeHeaders, let tunnel, let user)):
            lease.tunnel = tunnel
            log.user = user
            let route = admitted.route
            if route.maxInFlight > 0 {
                // Shed at once rather than queue without bound behind a slow app.
                guard route.enterInFlight() else {
                    var response = LocalResponse.error(.serviceUnavailable, "route \(route.name) has max_in_flight requests in flight; retry shortly")
                    response.headers.append(("retry-after", "1"))
                    return respond(response, failure: .maxInFlight)
                }
                lease.inFlight = route
            }
            log.forwarded = true
            // WebSocket handshakes never take a pooled connection (theirs becomes a tunnel).
            let principal = isWebSocket ? nil : ExchangeRules.upstreamPrincipal(reuse: route.upstreamReuse, user: user, client: client.id,
                                                                               hasBody: body.expected, viaTrustedProxy: client.trusted)
            let inbound = admitted.inbound
            let head = UpstreamRequestHead.forwarding(inbound, method: log.method, target: admitted.target, route: route, requestID: log.requestID,
                                                      client: client.address, scheme: client.scheme, adding: addHeaders, removing: removeHeaders,
                                                      closing: principal == nil && !isWebSocket, trace: log.trace?.spans.upstream)
            var bytes = allocator.buffer(capacity: inbound.head.bytes.readableBytes + 256)
            head.write(inbound, into: &bytes)
            let since = now()
            log.trace?.spans.upstreamAsked = since.uptimeNanoseconds
            state = .connecting(Forward(route: route, head: bytes, rules: admitted.snapshot.rules, principal: principal, since: since),
                                waiting: waiting)
            return .connect(route, principal: principal, pooled: principal != nil)
        }
    }

    mutating func answered(_ result: Result<LocalResponse, any Error>) -> Action {
        guard case .answering = state else { return .none }
        switch result {
        case .success(let response): return respond(response)
        case .failure: return respond(.error(.serviceUnavailable, "the request could not be answered"))
        }
    }

    /// The upstream connection asked for with `.connect`, or why there is none.
    mutating func connected(_ result: Result<UpstreamConnection, any Error>, now: @autoclosure () -> NIODeadline, responseTimeout: TimeAmount) -> Action {
        guard case .connecting(let forward, let waiting) = state else {
            if case .success(let connection) = result { return .closeUpstream(connection) }
            return .none
        }
        switch result {
        case .success(let connection):
            log.trace?.spans.connected = now().uptimeNanoseconds
            // The request's end is among what goes out now: the upstream's time to answer starts.
            state = .forwarding(forward, connection, .awaited(deadline: body.ended ? now() + responseTimeout : nil))
            return .startForwarding(connection, head: forward.head, chunked: body.framing == .chunked, body: waiting)
        case .failure(let error):
            if error is UpstreamBusy {
                var response = LocalResponse.error(.serviceUnavailable,
                                                   "route \(forward.route.name) has all of its upstream_max_connections in use; retry shortly")
                response.headers.append(("retry-after", "1"))
                return respond(response, failure: .connectionsExhausted)
            }
            if let channelError = error as? ChannelError, case .connectTimeout = channelError {
                return respond(.error(.gatewayTimeout, "upstream did not accept the connection in time"), failure: .connectTimeout)
            } else if error is UpstreamTLSFailure {
                return respond(.error(.badGateway, "TLS handshake with the upstream failed"), failure: .tlsHandshake)
            }
            return respond(.error(.badGateway, "upstream refused the connection"), failure: .connectRefused)
        }
    }

    // MARK: the app's side

    /// A part of the app's response; `clientVersion`: what the client speaks (its framing).
    mutating func upstreamPart(_ part: ResponseReader.Part, now: @autoclosure () -> NIODeadline) -> Action {
        guard case .forwarding(let forward, let upstream, let response) = state else { return .none }
        switch part {
        case .head(let head):
            return responseHead(head, forward, upstream, response, now: now())
        case .body(let bytes):
            log.bytesSent += bytes.readableBytes
            guard case .relaying(let framing, _) = response, framing != .noBody else { return .none }
            return .relayBody(bytes, chunked: framing == .chunked)
        case .end:
            // Response trailers are not relayed.
            state = .ended
            var reuse = false
            var chunked = false
            if case .relaying(let framing, let upstreamKeepAlive) = response {
                reuse = body.ended && upstreamKeepAlive && !isWebSocket
                chunked = framing == .chunked
            }
            return .finish(lastChunk: chunked, upstream: upstream, reuse: reuse)
        }
    }

    private mutating func responseHead(_ wire: WireHead, _ forward: Forward, _ upstream: UpstreamConnection, _ response: Response,
                                       now: NIODeadline) -> Action {
        let status = wire.status
        if log.upstreamNanoseconds == nil, status >= 200 || status == 101 {
            log.upstreamNanoseconds = Int64(now.uptimeNanoseconds - forward.since.uptimeNanoseconds)
            log.trace?.spans.firstByte = now.uptimeNanoseconds
        }
        if status == 101 {
            if isWebSocket, case .awaited = response {
                log.status = 101
                state = .ended
                return .upgrade(upstream, ResponseHead(wire), rules: forward.rules)
            }
            return respond(.error(.badGateway, "upstream switched protocols unasked"), failure: .closedBeforeResponse)
        }
        guard ExchangeRules.relaysStatus(status) else {
            return respond(.error(.badGateway, "upstream answered with an invalid status"), failure: .invalidResponse)
        }
        let echoed = upstream.principal != .echoing || ExchangeRules.echoes(wire, requestID: log.requestID)
        if status < 200 {
            // Interim responses are not for HTTP/1.0 clients (RFC 9110 §15.2), nor relayed
            // on an `echo` connection unless they are this request's.
            guard log.version.major >= 2 || log.version.minor >= 1, echoed else { return .none }
            return .interim(status: status)
        }
        guard echoed else {
            // Not this request's answer — late bytes of an earlier one, or an app that does not
            // echo: never relayed, and the connection closes (`respond` closes it).
            return respond(.error(.badGateway, "upstream response did not echo the request's X-Request-Id (upstream_reuse: echo)"),
                           failure: .echoMismatch)
        }
        let head = ResponseHead(wire)
        log.status = status
        let framing = ExchangeRules.responseFraming(requestMethod: log.method, status: status, hasContentLength: head.hasContentLength,
                                                    clientVersion: log.version)
        let upstreamKeepAlive = ExchangeRules.upstreamKeepsAlive(version: wire.version, connectionTokens: head.connectionTokens)
        state = .forwarding(forward, upstream, .relaying(framing, upstreamKeepAlive: upstreamKeepAlive))
        return .relayHead(head, framing, rules: forward.rules)
    }

    /// The upstream connection closed (`error`: it sent what is not a response, or failed).
    mutating func upstreamClosed(_ error: (any Error)?) -> Action {
        guard case .forwarding(var forward, let connection, let response) = state else { return .none }
        let started: Bool
        if case .relaying = response { started = true } else { started = false }
        if let invalid = error as? WireError {
            // Bytes that are not a response (framing two hops could read differently, a bad
            // status line, a truncated chunk): never relayed.
            guard started else {
                return respond(.error(.badGateway, "upstream response refused: \(invalid)"), upstream: nil, failure: .invalidResponse)
            }
            state = .ended
            return .abort(upstream: nil, failure: .invalidResponse)
        }
        if !started {
            if ExchangeRules.mayRetry(method: log.method, connectionWasReused: connection.reused, requestHasBody: body.expected,
                                      requestEnded: body.ended, alreadyRetried: forward.retried) {
                // The pooled connection was closed by the upstream before answering: the request
                // never reached it. Retry once on a fresh connection (RFC 9110 §9.2.2).
                forward.retried = true
                state = .connecting(forward, waiting: [.end(nil)])
                return .connect(forward.route, principal: connection.principal, pooled: false)
            }
            return respond(.error(.badGateway, "upstream closed the connection before responding"), upstream: nil, failure: .closedBeforeResponse)
        }
        // Mid-response: never let a truncated response look complete.
        state = .ended
        return .abort(upstream: nil, failure: .resetDuringResponse)
    }

    // MARK: timers

    /// The response or the body deadline passed (`now`).
    mutating func timerFired(now: NIODeadline, bodyAllowance: TimeAmount) -> Action {
        if case .forwarding(_, _, .awaited(let deadline?)) = state, deadline <= now {
            return respond(.error(.gatewayTimeout, "upstream did not respond in time"), failure: .responseTimeout)
        }
        if let deadline = bodyDeadline(allowance: bodyAllowance), deadline <= now {
            return requestFailed(.requestTimeout, "the request body did not arrive within server.timeouts.request_body")
        }
        return .none
    }

    /// Nothing moved within the idle timeout.
    mutating func idleTimeout() -> Action {
        switch state {
        case .collecting:
            return respond(.error(.requestTimeout, "the request body did not arrive within the idle timeout", close: true))
        case .awaitingVerdict, .answering:
            return respond(.error(.serviceUnavailable, "admission could not be decided in time", close: true))
        case .forwarding, .connecting:
            if responseStarted { return abort(failure: .idleTimeout) }
            return respond(.error(.gatewayTimeout, "no progress within the idle timeout", close: true), failure: .idleTimeout)
        case .ended:
            return .none
        }
    }

    // MARK: ends

    /// A response the gateway makes; the upstream connection in the state, if any, is let go.
    mutating func respond(_ response: LocalResponse, failure: UpstreamErrorKind? = nil) -> Action {
        respond(response, upstream: upstream, failure: failure)
    }

    mutating func respond(_ response: LocalResponse, upstream: UpstreamConnection?, failure: UpstreamErrorKind?) -> Action {
        if let subject = response.subject {
            log.user = subject.user
            log.original = subject.original
        }
        log.status = Int(response.status.code)
        log.bytesSent = response.body.readableBytes
        body.clock = nil
        state = .ended
        return .respond(response, upstream: upstream, failure: failure)
    }

    mutating func abort(failure: UpstreamErrorKind?) -> Action {
        let upstream = self.upstream
        state = .ended
        return .abort(upstream: upstream, failure: failure)
    }
}

/// What the access log records of an exchange, filled in as it goes.
struct ExchangeLog {
    var method: HTTPMethod
    /// The client's protocol version (HTTP/2 streams are logged as such by their connection).
    var version: HTTPVersion
    var start: NIODeadline
    /// The canonical path once the target parsed; the raw target before.
    var path: String
    var requestID: String
    var userAgent: String? = nil
    var route: ProxyRoute? = nil
    /// The request went to the upstream (not answered by the gateway itself).
    var forwarded = false
    /// Who the guard admitted.
    var user: String? = nil
    /// The request a forward-auth check was about (`LocalResponse.LoggedSubject`).
    var original: String? = nil
    /// The status sent (0: none yet).
    var status = 0
    var bytesSent = 0
    /// From asking for an upstream connection to the response head.
    var upstreamNanoseconds: Int64? = nil
    /// The exchange's spans, when it is traced.
    var trace: ExchangeTrace? = nil

    /// What admission read of the request that the log records, whatever the protocol: the
    /// canonical path of a refused request whose target parsed, a trusted proxy's request id,
    /// the user agent (`userAgent`: an access log wants it).
    /// An admitted request is traced when the snapshot says so (`tracing`; ids from `next`).
    mutating func note(_ outcome: Admission.Outcome, head: WireHead, userAgent wanted: Bool, tracing: TraceSampler?, next: () -> UInt64) {
        if case .refused(let refusal) = outcome, let path = refusal.path { self.path = path }
        guard let inbound = outcome.inbound else { return }
        // An `echo` route's app must echo an id no response could have known: the gateway's own.
        if let id = inbound.requestID, !outcome.echoesRequestID { requestID = id }
        if wanted { userAgent = head.firstValue(named: "user-agent") }
        if let tracing, case .admitted = outcome {
            trace = ExchangeTrace(.start(inbound, sampler: tracing, at: start, next: next))
        }
    }

    func record(aborted: Bool, client: String, now: NIODeadline) -> ExchangeRecord {
        ExchangeRecord(
            method: method.rawValue, path: path, status: status, route: route?.name, upstream: forwarded ? route?.upstream : nil,
            client: client, requestID: requestID, durationNanoseconds: Int64(now.uptimeNanoseconds - start.uptimeNanoseconds),
            bytesSent: bytesSent, aborted: aborted, userAgent: userAgent, user: user, upstreamNanoseconds: upstreamNanoseconds,
            protocolName: Self.protocolName(version), original: original,
            trace: trace.map { trace in
                var spans = trace.spans
                spans.end = now.uptimeNanoseconds
                return spans
            })
    }

    static func protocolName(_ version: HTTPVersion) -> String {
        switch (version.major, version.minor) {
        case (1, 1): return "HTTP/1.1"
        case (1, 0): return "HTTP/1.0"
        case (2, _): return "HTTP/2"
        default: return "HTTP/\(version.major).\(version.minor)"
        }
    }
}

/// The places an exchange holds until it ends: one of its route's `max_in_flight`, and a
/// WebSocket handshake's tunnel lease (attached on upgrade, finished otherwise). A value: the
/// connection releases it once, from the action that ends the exchange.
struct ExchangeLease {
    var inFlight: ProxyRoute? = nil
    var tunnel: TunnelLease? = nil

    /// Gives the in-flight place back and finishes the lease (it leaves its registry).
    func release() {
        inFlight?.leaveInFlight()
        tunnel?.finish()
    }
}
