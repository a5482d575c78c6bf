import GatewayConfig
import NIOCore
import NIOHTTP1

/// Everything a client connection decides, as a value: each event (a parsed request part, a
/// verdict, an upstream connection, a response part, a timer) moves it from one state to the
/// next and returns the one `Action` the channel handler runs. The handler
/// (`ProxyServerHandler`) only translates NIO events into events and runs actions; nothing here
/// touches a channel.
///
/// States carry their data: the exchange waiting for a verdict is in `.awaitingVerdict`, the
/// upstream connection serving it is in `.forwarding`. An answer that arrives for another
/// exchange than the state's (the client left, the request was answered meanwhile) finds no
/// state to apply to, so it is discarded — an action cannot outlive its state.
///
/// Pipelining needs no queue: the handler hands in parsed parts only while `acceptsParts`, so a
/// pipelined request stays unparsed in the `RequestReader` until the one before it is answered
/// (and junk behind a complete request is only found, and answered 400, in its turn).
///
/// Its parts are in three files: this one (states, actions, the answers that come back, timers,
/// responses the gateway makes), `+Request` (a request's head and body) and `+Upstream` (the
/// app's response). Members are internal so that the three can share them; only
/// `ProxyServerHandler` uses the machine, through its events.
struct ClientConnectionStateMachine {
    typealias Part = RequestReader.Part

    enum State {
        /// Between requests; `headSince`: when the first byte of the next request's head came
        /// (its head must be complete within `timeouts.requestHead`).
        case idle(headSince: NIODeadline? = nil)
        /// The route's guard is deciding (`verdict(_:for:)`); body parts are buffered.
        case awaitingVerdict(ExchangeContext)
        /// Reading a body for one of the gateway's own endpoints.
        case collecting(ExchangeContext, Collector)
        /// The endpoint has the body and is answering (`answered(_:for:)`).
        case answering(ExchangeContext)
        /// Waiting for an upstream connection (`connected(_:for:)`); body parts are buffered.
        case connecting(ExchangeContext)
        /// The request goes to, and the response comes from, this upstream connection.
        case forwarding(ExchangeContext, UpstreamConnection)
        /// Nothing more is read or answered: closing, lingering, or handed to a tunnel.
        case closed
    }

    struct Collector {
        let maxBytes: Int
        let respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>
        var body: ByteBuffer
    }

    /// What follows a complete response.
    enum After: Equatable {
        /// Keep the connection: parse the next request.
        case nextRequest
        /// Close it (gracefully: what was written goes out, then a lingering close).
        case close
    }

    /// Kept small (a few words): an action is returned and switched on per event, and a large
    /// payload (a head) made each of those a copy. The rare large ones are boxed (`indirect`).
    enum Action {
        case none
        /// Ask the route's guard (`guardRequest(for:)`); its decision comes back as `verdict(_:for:)`.
        case admit(ExchangeContext, ProxyRoute)
        /// Hand the collected body to the endpoint; its response comes back as `answered(_:for:)`.
        case answer(ExchangeContext, ByteBuffer, respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>)
        /// Take an idle connection to the route's upstream of `principal` (`pooled`) or open one
        /// for it (nil: for this request only); it comes back as `connected(_:for:)`.
        case connect(ExchangeContext, ProxyRoute, principal: UpstreamPrincipal?, pooled: Bool)
        /// Write the request head (`upstreamHead`) and what was buffered of the body to the new
        /// upstream connection.
        case startForwarding(UpstreamConnection, ExchangeContext, body: CircularBuffer<Part>)
        /// A body part for the upstream.
        case forwardBody(UpstreamConnection, ByteBuffer)
        /// The request's end, for the upstream.
        case forwardEnd(UpstreamConnection)
        /// Bytes for the client (a response head, an interim response).
        case write(ByteBuffer)
        /// A response body part for the client.
        case writeBody(ByteBuffer, chunked: Bool)
        /// A response the gateway made: write it, record the exchange, let go of `upstream` (and
        /// count `failure` against it), then `after`.
        case respond(ByteBuffer, ExchangeContext, upstream: UpstreamConnection?, failure: UpstreamErrorKind?, after: After)
        /// The upstream's response is complete: write the last chunk if any, record, return the
        /// connection to the pool (`reuse`) or close it, then `after`.
        case finish(ExchangeContext, lastChunk: Bool, upstream: UpstreamConnection?, reuse: Bool, after: After)
        /// The response cannot be completed: record `exchange` as aborted, close everything.
        case abort(ExchangeContext?, upstream: UpstreamConnection?, failure: UpstreamErrorKind?)
        /// Close gracefully with nothing to answer (idle timeout, drain, half-close).
        case close(upstream: UpstreamConnection?)
        /// The app accepted the WebSocket handshake: relay its 101, then splice the connections.
        indirect case upgrade(ExchangeContext, UpstreamConnection, ResponseHead)
        /// A connection nobody needs any more (it arrived too late).
        case closeUpstream(UpstreamConnection)
        /// A verdict nobody will apply: its tunnel lease, if any, is finished.
        case discard(Verdict)
        /// The client left before anything was answered: nothing to record; the exchange's
        /// tunnel lease, if any, is finished.
        case drop(ExchangeContext)
    }

    let shared: ProxyShared
    var peerAddress: IPAddress? = nil
    var remoteAddress: SocketAddress? = nil
    /// The client's address as `X-Forwarded-For` and the access log write it.
    var peerString = "-"
    /// This client connection's number: the principal of its anonymous requests.
    var clientID: UInt64 = 0
    /// The peer is one of `server.trusted_proxies` (as of the last request head).
    var peerTrusted = false
    let allocator = ByteBufferAllocator()
    var state: State = .idle()
    /// Body parts received while the verdict or the upstream connection is pending.
    var buffered = CircularBuffer<Part>()
    var quiescing = false
    var inputClosed = false
    /// The last exchange, reused for the next when nothing else holds it (`newExchange`).
    var spare: ExchangeContext? = nil
    var requestIDs: RequestIDs

    // Deadlines (one timer in the handler serves them all).
    var lastActivity: NIODeadline
    var responseDeadline: NIODeadline? = nil
    /// While a request body is arriving: when its head came (`ExchangeRules.bodyDeadline`), and
    /// how long the gateway held the client back meanwhile (not the client's time).
    var bodyStart: NIODeadline? = nil
    var bodyHeld: TimeAmount = .zero
    var heldSince: NIODeadline? = nil

    init(shared: ProxyShared, seed: UInt64) {
        self.shared = shared
        self.requestIDs = RequestIDs(seed: seed)
        self.lastActivity = .now()
    }

    /// The connection is in a pipeline: who the client is (read once: `Channel.remoteAddress`
    /// takes a lock on every access), and when it started.
    mutating func connectionStarted(remoteAddress: SocketAddress?, clientID: UInt64, now: NIODeadline) {
        self.remoteAddress = remoteAddress
        self.clientID = clientID
        let ip = remoteAddress?.ipAddress
        peerString = ip ?? "-"
        peerAddress = ip.flatMap(IPAddress.parse)
        lastActivity = now
    }

    /// The state's phase (`ExchangeRules`' view of it), its exchange and its upstream connection,
    /// in one pass (each binding of a payload is a retain).
    var parts: (phase: ExchangeRules.Phase, exchange: ExchangeContext?, upstream: UpstreamConnection?) {
        switch state {
        case .idle: return (.idle, nil, nil)
        case .closed: return (.closed, nil, nil)
        case .awaitingVerdict(let x), .answering(let x): return (.awaitingVerdict, x, nil)
        case .collecting(let x, _): return (.collecting, x, nil)
        case .connecting(let x): return (.connecting, x, nil)
        case .forwarding(let x, let upstream): return (.forwarding, x, upstream)
        }
    }

    /// The exchange in flight, if any.
    var current: ExchangeContext? { parts.exchange }

    var phase: ExchangeRules.Phase { parts.phase }

    // The queries the handler asks per event are `mutating` on purpose: a non-mutating read of
    // a struct stored in a class copies the whole struct first (every reference in it retained
    // and released), measured at ~1 µs a request; a mutating access works in place.

    var isClosed: Bool {
        mutating get { if case .closed = state { return true } else { return false } }
    }

    /// Whether the next parsed request part may be handed in: between requests, and while the
    /// current request is still arriving. A pipelined request waits, unparsed, for its turn.
    var acceptsParts: Bool {
        mutating get {
        switch state {
        case .idle: return true
        case .closed: return false
        case .awaitingVerdict(let x), .collecting(let x, _), .answering(let x), .connecting(let x), .forwarding(let x, _): return !x.requestEnded
        }
        }
    }

    /// Whether the client may be read now (`ExchangeRules.shouldReadClient`); `unparsedBytes`:
    /// the reader holds bytes of a request not yet handed in.
    mutating func wantsRead(clientWritable: Bool, unparsedBytes: Bool) -> Bool {
        let (phase, exchange, upstream) = parts
        let requestEnded = exchange?.requestEnded ?? false
        let upstreamWritable = upstream?.isWritable ?? false
        return ExchangeRules.shouldReadClient(phase: phase, quiescing: quiescing, requestEnded: requestEnded, pipelinedEmpty: !unparsedBytes,
                                              upstreamWritable: upstreamWritable, clientWritable: clientWritable)
    }

    /// The head, body or response deadline, when one is running (the idle deadline is checked lazily).
    var eagerDeadline: NIODeadline? {
        mutating get {
            if case .idle(let since?) = state { return since + shared.timeouts.requestHead }
            switch (responseDeadline, currentBodyDeadline) {
            case (let a?, let b?): return min(a, b)
            case (let a, let b): return a ?? b
            }
        }
    }

    // MARK: client events

    /// Bytes came from the client, or a read burst from the upstream: progress, for the idle timeout.
    mutating func activity(now: NIODeadline) { lastActivity = now }

    /// After the reader was handed what it could parse: between requests, whether bytes of the
    /// next request's head are waiting (its `request_head` clock starts with the first of them).
    mutating func headPending(_ pending: Bool, now: @autoclosure () -> NIODeadline) {
        switch state {
        case .idle(nil) where pending: state = .idle(headSince: now())
        case .idle(.some) where !pending: state = .idle()
        default: break
        }
    }

    /// The handler held a read back (the gateway, not the client, is slow meanwhile).
    mutating func readHeld(now: @autoclosure () -> NIODeadline) {
        if bodyStart != nil, heldSince == nil { heldSince = now() }
    }

    /// Reading resumes: the time the client was held back is not counted against its body.
    mutating func readResumed(now: @autoclosure () -> NIODeadline) {
        if let since = heldSince {
            bodyHeld = bodyHeld + (now() - since)
            heldSince = nil
        }
    }

    /// A part the `RequestReader` parsed (only while `acceptsParts`). The clocks are read only
    /// when an event needs the time (a few `clock_gettime` per request were 2 % of one).
    mutating func requestPart(_ part: Part, now: @autoclosure () -> NIODeadline) -> Action {
        switch state {
        case .idle:
            // Anything but a head here is what remains of a request answered before its end.
            guard case .head(let head) = part else { return .none }
            return startExchange(head, now: now())
        case .closed, .answering:
            return .none
        case .awaitingVerdict(let x), .connecting(let x):
            if let failed = count(part, x) { return failed }
            buffered.append(part)
            return .none
        case .collecting(let x, var collector):
            if let failed = count(part, x) { return failed }
            return collect(part, x, &collector)
        case .forwarding(let x, let upstream):
            if let failed = count(part, x) { return failed }
            switch part {
            case .body(let bytes): return .forwardBody(upstream, bytes)
            case .end:
                startResponseDeadline(now: now())
                return .forwardEnd(upstream)
            case .head: return .none
            }
        }
    }

    /// The client's bytes are not HTTP/1.1 (or too much of it): framing is in doubt, so answer
    /// (if nothing was answered yet) and close. Nothing after the error is read.
    mutating func requestUnreadable(_ error: WireError, now: NIODeadline) -> Action {
        let response: LocalResponse
        switch error {
        case .tooLarge(let reason): response = .error(.requestHeaderFieldsTooLarge, "request head too large: \(reason)", close: true)
        case .malformed(let reason): response = .error(.badRequest, "malformed HTTP request: \(reason)", close: true)
        }
        let exchange: ExchangeContext
        if let x = current {
            if ExchangeRules.onDecoderError(phase: phase, responseStarted: x.responseStarted) == .abort { return abort(failure: nil) }
            exchange = x
        } else {
            exchange = ExchangeContext(method: .GET, clientVersion: .http1_1, start: now, path: "", requestID: nextRequestID())
        }
        return respond(response, exchange)
    }

    /// The client's FIN: a half-close, or a close (with half-closure allowed, both arrive so).
    /// Nothing more comes than what the reader holds (`unparsedBytes`: bytes of requests behind
    /// the current one). Every request complete before the FIN is answered, in order, as nginx
    /// does; the connection closes once the reader is drained (`readerDrained`), and a request
    /// cut short ends then. With nothing behind it, the current request is the last: its
    /// response says `Connection: close`.
    mutating func clientInputClosed(unparsedBytes: Bool) -> Action {
        inputClosed = true
        if !unparsedBytes { current?.keepAlive = false }
        return readerDrained()
    }

    /// The reader has handed in every complete part it holds (the handler asks after each pump).
    /// After the client's FIN that is all there will be (`ExchangeRules.onClientInputEnd`):
    /// between requests the connection closes; a request cut short is aborted as the client's.
    mutating func readerDrained() -> Action {
        guard inputClosed, acceptsParts else { return .none }
        let (phase, exchange, _) = parts
        switch ExchangeRules.onClientInputEnd(phase: phase, requestEnded: exchange?.requestEnded ?? true) {
        case .carryOn: return .none
        case .close: return closeNow()
        case .abortRequest: return clientAbandoned()
        }
    }

    /// The client left in the middle of a request: nothing can be answered. The exchange is
    /// recorded as aborted, with `ExchangeRecord.clientClosedRequest` (499) when no response had
    /// begun, and the upstream connection serving it, if any, is closed.
    mutating func clientAbandoned() -> Action {
        if let x = current, !x.responseStarted { x.status = ExchangeRecord.clientClosedRequest }
        buffered.removeAll()
        return abort(failure: nil)
    }

    /// The server drains: finish the exchange in flight, then close.
    mutating func quiesce() -> Action {
        quiescing = true
        if case .idle = state { return closeNow() }
        return .none
    }

    /// The client connection is gone.
    mutating func clientClosed() -> Action {
        let before = state
        state = .closed
        buffered.removeAll()
        switch before {
        case .forwarding(let x, let upstream):
            if !x.responseStarted { x.status = ExchangeRecord.clientClosedRequest }
            return .abort(x, upstream: upstream, failure: nil)
        case .connecting(let x), .awaitingVerdict(let x), .collecting(let x, _), .answering(let x):
            return .drop(x)
        case .idle, .closed:
            return .none
        }
    }

    /// The handler closed the connection gracefully and now only discards what arrives.
    mutating func closing() { state = .closed }

    // MARK: answers that come back

    /// What the guard of `.admit(exchange, route)` is asked (built from the exchange, not carried
    /// in the action: a head is too large to pass around by value).
    mutating func guardRequest(for x: ExchangeContext, route: ProxyRoute) -> GuardRequest? {
        guard let inbound = x.inbound, let target = x.target else { return nil }
        return GuardRequest(wire: inbound.head, target: target, routeName: route.name, clientAddress: remoteAddress, host: inbound.host,
                            isWebSocketUpgrade: inbound.isWebSocketUpgrade, hasBearer: inbound.hasBearer)
    }

    mutating func verdict(_ result: Result<Verdict, any Error>, for exchange: ExchangeContext, now: @autoclosure () -> NIODeadline) -> Action {
        guard case .awaitingVerdict(let x) = state, x === exchange else {
            if case .success(let verdict) = result { return .discard(verdict) }
            return .none
        }
        switch result {
        case .failure: return respond(.error(.serviceUnavailable, "admission could not be decided"), x)
        case .success(.respond(let response)): return respond(response, x)
        case .success(.collectBody(let maxBytes, let respond)):
            var collector = Collector(maxBytes: maxBytes, respond: respond, body: allocator.buffer(capacity: 0))
            state = .collecting(x, collector)
            while let part = buffered.popFirst() {
                let action = collect(part, x, &collector)
                if case .none = action { continue }
                buffered.removeAll()
                return action
            }
            return .none
        case .success(.forward(let addHeaders, let removeHeaders, let tunnel, let user)):
            guard let inbound = x.inbound, let target = x.target, let route = x.route else { return .discard(.forward(addHeaders: [], tunnel: tunnel)) }
            x.tunnel = tunnel
            x.user = user
            if route.maxInFlight > 0 {
                // Shed at once rather than queue without bound behind a slow app.
                guard route.enterInFlight() else {
                    var response = LocalResponse.error(.serviceUnavailable, "route \(route.name) has max_in_flight requests in flight; retry shortly")
                    response.headers.append(("retry-after", "1"))
                    return respond(response, x, failure: .maxInFlight)
                }
                x.inFlight = true
            }
            x.forwarded = true
            x.inbound = nil
            // WebSocket handshakes never take a pooled connection (theirs becomes a tunnel).
            let principal = x.isWebSocket ? nil : ExchangeRules.upstreamPrincipal(reuse: route.upstreamReuse, user: user, client: clientID,
                                                                                  hasBody: x.requestHasBody, viaTrustedProxy: peerTrusted)
            let head = UpstreamRequestHead.forwarding(inbound, method: x.method, target: target, route: route, requestID: x.requestID,
                                                      client: peerString, scheme: shared.scheme, adding: addHeaders, removing: removeHeaders,
                                                      closing: principal == nil && !x.isWebSocket)
            var bytes = allocator.buffer(capacity: inbound.head.bytes.readableBytes + 256)
            head.write(inbound, into: &bytes)
            x.upstreamHead = bytes
            x.upstreamStart = now()
            state = .connecting(x)
            return .connect(x, route, principal: principal, pooled: principal != nil)
        }
    }

    mutating func answered(_ result: Result<LocalResponse, any Error>, for exchange: ExchangeContext) -> Action {
        guard case .answering(let x) = state, x === exchange else { return .none }
        switch result {
        case .success(let response): return respond(response, x)
        case .failure: return respond(.error(.serviceUnavailable, "the request could not be answered"), x)
        }
    }

    /// The upstream connection asked for with `.connect`, or why there is none.
    mutating func connected(_ result: Result<UpstreamConnection, any Error>, for exchange: ExchangeContext, now: @autoclosure () -> NIODeadline) -> Action {
        guard case .connecting(let x) = state, x === exchange else {
            if case .success(let connection) = result { return .closeUpstream(connection) }
            return .none
        }
        switch result {
        case .success(let connection):
            guard x.upstreamHead != nil else { return .closeUpstream(connection) }
            state = .forwarding(x, connection)
            // The request's end is among what goes out now: the upstream's time to answer starts.
            if x.requestEnded { startResponseDeadline(now: now()) }
            let body = buffered
            buffered.removeAll()
            return .startForwarding(connection, x, body: body)
        case .failure(let error):
            if let channelError = error as? ChannelError, case .connectTimeout = channelError {
                return respond(.error(.gatewayTimeout, "upstream did not accept the connection in time"), x, failure: .connectTimeout)
            } else if error is UpstreamTLSFailure {
                return respond(.error(.badGateway, "TLS handshake with the upstream failed"), x, failure: .tlsHandshake)
            }
            return respond(.error(.badGateway, "upstream refused the connection"), x, failure: .connectRefused)
        }
    }

    // MARK: timers

    mutating func timerFired(now: NIODeadline) -> Action {
        if case .closed = state { return .none }
        if let deadline = responseDeadline, deadline <= now, case .forwarding(let x, _) = state, !x.responseStarted {
            responseDeadline = nil
            return respond(.error(.gatewayTimeout, "upstream did not respond in time"), x, failure: .responseTimeout)
        }
        if let deadline = currentBodyDeadline, deadline <= now {
            return requestFailed(.requestTimeout, "the request body did not arrive within server.timeouts.request_body")
        }
        if case .idle(let since?) = state, since + shared.timeouts.requestHead <= now {
            // A client trickling header lines resets the idle timer with each; the head's own
            // deadline does not move (nginx's client_header_timeout, HAProxy's http-request).
            let x = ExchangeContext(method: .GET, clientVersion: .http1_1, start: since, path: "", requestID: nextRequestID())
            return respond(.error(.requestTimeout, "the request head did not arrive within server.timeouts.request_head", close: true), x)
        }
        guard lastActivity + shared.timeouts.idle <= now else { return .none }
        switch state {
        case .idle:
            return closeNow()
        case .collecting(let x, _):
            return respond(.error(.requestTimeout, "the request body did not arrive within the idle timeout", close: true), x)
        case .awaitingVerdict(let x), .answering(let x):
            return respond(.error(.serviceUnavailable, "admission could not be decided in time", close: true), x)
        case .forwarding(let x, _), .connecting(let x):
            if x.responseStarted { return abort(failure: .idleTimeout) }
            return respond(.error(.gatewayTimeout, "no progress within the idle timeout", close: true), x, failure: .idleTimeout)
        case .closed:
            return .none
        }
    }

    /// When the timer should fire next (after `timerFired` returned `.none`).
    mutating func nextDeadline(now: NIODeadline) -> NIODeadline {
        var next = lastActivity + shared.timeouts.idle
        if let deadline = eagerDeadline, deadline < next { next = deadline }
        return max(next, now + .milliseconds(1))
    }

    // MARK: responses the gateway makes

    /// The request failed while its body was arriving (too large, too slow): answered with
    /// `status` and closed if no response byte went out yet; otherwise the connection is aborted.
    mutating func requestFailed(_ status: HTTPResponseStatus, _ reason: String) -> Action {
        bodyStart = nil
        guard let x = current else { return .none }
        if x.responseStarted { return abort(failure: nil) }
        return respond(.error(status, reason, close: true), x)
    }

    /// A response the gateway makes for `x`; the upstream connection in the state, if any, is let go.
    mutating func respond(_ response: LocalResponse, _ x: ExchangeContext, failure: UpstreamErrorKind? = nil) -> Action {
        var upstream: UpstreamConnection? = nil
        if case .forwarding(_, let connection) = state { upstream = connection }
        return respond(response, x, upstream: upstream, failure: failure)
    }

    mutating func respond(_ response: LocalResponse, _ x: ExchangeContext, upstream: UpstreamConnection?, failure: UpstreamErrorKind?) -> Action {
        // A body not read to its end leaves the connection's framing in doubt.
        let drained = x.requestEnded || !x.requestHasBody
        x.keepAlive = !response.close && keepsAlive(x, requestComplete: drained)
        x.status = Int(response.status.code)
        x.responseStarted = true
        x.bytesSent = response.body.readableBytes
        let bytes = HTTPWire.localResponse(response, requestID: x.requestID, keepAlive: x.keepAlive, clientVersion: x.clientVersion,
                                           headRequest: x.method == .HEAD, allocator: allocator)
        responseDeadline = nil
        bodyStart = nil
        buffered.removeAll()
        let after: After = x.keepAlive ? .nextRequest : .close
        state = after == .close ? .closed : .idle()
        return .respond(bytes, x, upstream: upstream, failure: failure, after: after)
    }

    func afterResponse(_ x: ExchangeContext) -> After {
        keepsAlive(x, requestComplete: x.requestEnded) ? .nextRequest : .close
    }

    func keepsAlive(_ x: ExchangeContext, requestComplete: Bool) -> Bool {
        ExchangeRules.clientKeepsAlive(requested: x.keepAlive, requestComplete: requestComplete, quiescing: quiescing)
    }

    mutating func abort(failure: UpstreamErrorKind?) -> Action {
        var upstream: UpstreamConnection? = nil
        if case .forwarding(_, let connection) = state { upstream = connection }
        let x = current
        state = .closed
        return .abort(x, upstream: upstream, failure: failure)
    }

    mutating func closeNow() -> Action {
        var upstream: UpstreamConnection? = nil
        if case .forwarding(_, let connection) = state { upstream = connection }
        state = .closed
        return .close(upstream: upstream)
    }

    mutating func startResponseDeadline(now: NIODeadline) {
        responseDeadline = now + shared.timeouts.upstreamResponse
    }

    /// nil while no body is arriving, or while the gateway holds the client back.
    var currentBodyDeadline: NIODeadline? {
        guard let start = bodyStart, heldSince == nil, let x = current, !x.requestEnded else { return nil }
        return ExchangeRules.bodyDeadline(start: start, allowance: shared.timeouts.requestBody, held: bodyHeld, bytesReceived: x.bodyBytes)
    }

    mutating func nextRequestID() -> String { requestIDs.next() }
}
