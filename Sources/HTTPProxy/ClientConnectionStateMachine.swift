import GatewayConfig
import NIOCore
import NIOHTTP1

/// Everything an HTTP/1 client connection decides, as a value: each event (a parsed request
/// part, a verdict, an upstream connection, a response part, a timer, the client's FIN) moves it
/// from one state to the next and returns the one `Action` the channel handler runs. The
/// handler (`ProxyServerHandler`) only translates NIO events into events and runs actions;
/// nothing here touches a channel.
///
/// The request in flight is an `ExchangeStateMachine` nested in `.exchange`: what happens to a
/// request (guard, upstream, response) is decided there, for HTTP/1 and HTTP/2 alike; this
/// machine adds what is HTTP/1's — the connection kept or closed after a response, pipelining,
/// the client's FIN, the head's deadline, encoding responses as HTTP/1 bytes — and the
/// connection's ends: a graceful close, the lingering after it, the tunnel.
///
/// Pipelining needs no queue: the handler hands in parsed parts only while `acceptsParts`, so a
/// pipelined request stays unparsed in the `RequestReader` until the one before it is answered
/// (and junk behind a complete request is only found, and answered 400, in its turn).
struct ClientConnectionStateMachine {
    typealias Part = RequestReader.Part

    enum State {
        /// Between requests; `headSince`: when the first byte of the next request's head came
        /// (its head must be complete within `timeouts.requestHead`).
        case idle(headSince: NIODeadline? = nil)
        /// A request is in flight; `keepAlive`: the client wants the connection after it.
        case exchange(ExchangeStateMachine, keepAlive: Bool)
        /// The last response is going out; then the output is shut (`lingering`).
        case closing
        /// The output is shut; what the client still sends is read and discarded for a moment
        /// (RFC 9112 §9.6), until its FIN.
        case lingering
        /// The connection was handed to a WebSocket tunnel.
        case tunnel
        /// Gone.
        case closed
        /// Only while an event changes the nested exchange in place (never seen outside one).
        case modifying
    }

    /// What follows a complete response.
    enum After: Equatable {
        /// Keep the connection: parse the next request.
        case nextRequest
        /// Close it (gracefully: what was written goes out, then a lingering close).
        case close
    }

    /// An exchange that ended: what the access log records and the places to give back.
    struct Ended {
        var log: ExchangeLog
        var lease: ExchangeLease
    }

    /// Kept small (a few words): an action is returned and switched on per event. The large
    /// ones, at most one per request, are boxed (`indirect`).
    enum Action {
        case none
        /// Ask the route's guard (`guardRequest()`); its decision comes back as `verdict(_:for:)`.
        case admit(exchange: UInt64, ProxyRoute)
        /// Hand the collected body to the endpoint; its response comes back as `answered(_:for:)`.
        case answer(exchange: UInt64, ByteBuffer, respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>)
        /// Take an idle connection to the route's upstream of `principal` (`pooled`) or open one
        /// for it (nil: for this request only); it comes back as `connected(_:for:)`.
        case connect(exchange: UInt64, ProxyRoute, principal: UpstreamPrincipal?, pooled: Bool)
        /// Write the request head and what was buffered of the body to the new upstream connection.
        indirect case startForwarding(UpstreamConnection, head: ByteBuffer, method: HTTPMethod, chunked: Bool, body: [Part])
        case forwardBody(UpstreamConnection, ByteBuffer)
        case forwardEnd(UpstreamConnection)
        /// Bytes for the client (a response head, an interim response).
        case write(ByteBuffer)
        /// A response body part for the client.
        case writeBody(ByteBuffer, chunked: Bool)
        /// A response the gateway made: write it, record the exchange, let go of `upstream` (and
        /// count `failure` against it), then `after`.
        indirect case respond(ByteBuffer, Ended, upstream: UpstreamConnection?, failure: UpstreamErrorKind?, after: After)
        /// The upstream's response is complete: write the last chunk if any, record, return the
        /// connection to the pool (`reuse`) or close it, then `after`.
        indirect case finish(Ended, lastChunk: Bool, upstream: UpstreamConnection, reuse: Bool, after: After)
        /// The response cannot be completed: record the exchange (if any) as aborted, close everything.
        indirect case abort(Ended?, upstream: UpstreamConnection?, failure: UpstreamErrorKind?)
        /// Close gracefully with nothing to answer (idle timeout, drain, half-close).
        case close(upstream: UpstreamConnection?)
        /// The app accepted the WebSocket handshake: relay its head (the 101), then splice.
        indirect case upgrade(Ended, UpstreamConnection, head: ByteBuffer)
        /// A connection nobody needs any more (it arrived too late).
        case closeUpstream(UpstreamConnection)
        /// A verdict nobody will apply: its tunnel lease, if any, is finished. Indirect: a
        /// verdict holds a whole local response, and discarding one is rare.
        indirect case discard(Verdict)
        /// The client left before anything was answered: nothing to record; the places the
        /// exchange held are given back.
        case drop(ExchangeLease)
    }

    let shared: ProxyShared
    let allocator = ByteBufferAllocator()
    /// Who the client is (set once, when the connection starts).
    var peer = Peer()
    var state: State = .idle()
    private var requestIDs: RequestIDs
    /// The number of the next exchange: answers that come back name theirs.
    private var exchanges: UInt64 = 0
    /// The server drains: the exchange in flight is the last.
    private(set) var quiescing = false
    /// The client's FIN came: nothing more than what the reader holds will.
    private(set) var inputClosed = false
    /// Bytes came from the client or the upstream (for the idle timeout).
    private(set) var lastActivity: NIODeadline
    /// The routes as this connection last read them (`ProxyShared.routingGeneration`), and
    /// whether its peer is a trusted proxy under them: read again only after a reload.
    private var routing: (generation: Int, snapshot: RoutingSnapshot, peerTrusted: Bool)? = nil

    struct Peer {
        var address: IPAddress? = nil
        var socketAddress: SocketAddress? = nil
        /// The client's address as `X-Forwarded-For` and the access log write it.
        var string = "-"
        /// This client connection's number: the principal of its anonymous requests.
        var clientID: UInt64 = 0
        /// The peer is one of `server.trusted_proxies` (as of the last request head).
        var trusted = false
    }

    init(shared: ProxyShared, seed: UInt64) {
        self.shared = shared
        self.requestIDs = RequestIDs(seed: seed)
        self.lastActivity = .now()
    }

    /// The connection is in a pipeline: who the client is (read once: `Channel.remoteAddress`
    /// takes a lock on every access), and when it started.
    mutating func connectionStarted(remoteAddress: SocketAddress?, clientID: UInt64, now: NIODeadline) {
        let ip = remoteAddress?.ipAddress
        peer = Peer(address: ip.flatMap(IPAddress.parse), socketAddress: remoteAddress, string: ip ?? "-", clientID: clientID)
        lastActivity = now
    }

    // The queries the handler asks per event are `mutating` on purpose: a non-mutating read of
    // a struct stored in a class copies the whole struct first (every reference in it retained
    // and released), measured at ~1 µs a request; a mutating access works in place.

    /// Nothing more is read or answered (closing, lingering, a tunnel, gone).
    var isClosed: Bool {
        mutating get {
            switch state {
            case .idle, .exchange: return false
            case .closing, .lingering, .tunnel, .closed, .modifying: return true
            }
        }
    }

    var isLingering: Bool {
        mutating get { if case .lingering = state { return true } else { return false } }
    }

    /// The upstream connection serving the request in flight, if any.
    var upstream: UpstreamConnection? {
        mutating get { peek { x, _ in x.upstream } ?? nil }
    }

    /// Whether the next parsed request part may be handed in: between requests, and while the
    /// current request is still arriving. A pipelined request waits, unparsed, for its turn.
    var acceptsParts: Bool {
        mutating get {
            switch state {
            case .idle: return true
            case .exchange: return peek { x, _ in !x.body.ended } ?? false
            case .closing, .lingering, .tunnel, .closed, .modifying: return false
            }
        }
    }

    /// Whether the client may be read now (`ExchangeRules.shouldReadClient`); `unparsedBytes`:
    /// the reader holds bytes of a request not yet handed in. While lingering, always.
    mutating func wantsRead(clientWritable: Bool, unparsedBytes: Bool) -> Bool {
        switch state {
        case .idle:
            return ExchangeRules.shouldReadClient(phase: .idle, quiescing: quiescing, requestEnded: false, pipelinedEmpty: !unparsedBytes,
                                                  upstreamWritable: false, clientWritable: clientWritable)
        case .exchange:
            let quiescing = self.quiescing
            return peek { x, _ in
                ExchangeRules.shouldReadClient(phase: x.phase, quiescing: quiescing, requestEnded: x.body.ended, pipelinedEmpty: !unparsedBytes,
                                               upstreamWritable: x.upstream?.isWritable ?? false, clientWritable: clientWritable)
            } ?? false
        case .lingering: return true
        case .closing, .tunnel, .closed, .modifying: return false
        }
    }

    /// The head, body or response deadline, when one is running (the idle deadline is checked lazily).
    var eagerDeadline: NIODeadline? {
        mutating get {
            switch state {
            case .idle(let since?): return since + shared.timeouts.requestHead
            case .exchange:
                let allowance = shared.timeouts.requestBody
                return peek { x, _ in x.deadline(bodyAllowance: allowance) } ?? nil
            default: return nil
            }
        }
    }

    /// Runs `event` on the exchange in flight (`id`: only if it is that one) in place — the state
    /// lets go of its copy first, so nothing in it is copied — and what it returns is made this
    /// connection's action while the exchange is still in hand. nil when there is no such exchange.
    @inline(__always)
    private mutating func exchange(_ id: UInt64? = nil, _ event: (inout ExchangeStateMachine) -> ExchangeStateMachine.Action) -> Action? {
        guard case .exchange(var x, var keepAlive) = takeExchange() else { return nil }
        guard id == nil || x.id == id else {
            state = .exchange(x, keepAlive: keepAlive)
            return nil
        }
        let (action, next) = http1(event(&x), &x, keepAlive: &keepAlive)
        switch next {
        case .same: state = .exchange(x, keepAlive: keepAlive)
        case .idle: state = .idle()
        case .closing: state = .closing
        case .tunnel: state = .tunnel
        }
        return action
    }

    /// Where the connection goes after an exchange's action.
    private enum Next { case same, idle, closing, tunnel }

    /// Runs `body` on the exchange in flight in place, when there is one.
    @inline(__always)
    private mutating func update(_ body: (inout ExchangeStateMachine) -> Void) {
        guard case .exchange(var x, let keepAlive) = takeExchange() else { return }
        body(&x)
        state = .exchange(x, keepAlive: keepAlive)
    }

    /// Reads the exchange in flight without copying it (it is moved out and back).
    @inline(__always)
    private mutating func peek<R>(_ read: (borrowing ExchangeStateMachine, Bool) -> R) -> R? {
        guard case .exchange(let x, let keepAlive) = takeExchange() else { return nil }
        let result = read(x, keepAlive)
        state = .exchange(x, keepAlive: keepAlive)
        return result
    }

    /// The state, moved out (`.modifying` left in its place) when it is `.exchange`, so that its
    /// payload is taken, not copied (a copy was every reference in it retained, and ~600 bytes
    /// moved, several times per event); `.modifying` otherwise, the state untouched.
    @inline(__always)
    private mutating func takeExchange() -> State {
        guard case .exchange = state else { return .modifying }
        var taken = State.modifying
        swap(&taken, &state)
        return taken
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
        update { $0.readHeld(now: now()) }
    }

    /// Reading resumes: the time the client was held back is not counted against its body.
    mutating func readResumed(now: @autoclosure () -> NIODeadline) {
        update { $0.readResumed(now: now()) }
    }

    /// A part the `RequestReader` parsed (only while `acceptsParts`). The clocks are read only
    /// when an event needs the time (a few `clock_gettime` per request were 2 % of one).
    mutating func requestPart(_ part: Part, now: @autoclosure () -> NIODeadline) -> Action {
        switch state {
        case .idle:
            // Anything but a head here is what remains of a request answered before its end.
            guard case .head(let head) = part else { return .none }
            return startExchange(head, now: now())
        case .exchange:
            let timeout = shared.timeouts.upstreamResponse
            return exchange { $0.requestPart(part, now: now(), responseTimeout: timeout) } ?? .none
        case .closing, .lingering, .tunnel, .closed, .modifying:
            return .none
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
        if case .exchange(let x, _) = state {
            if ExchangeRules.onDecoderError(phase: x.phase, responseStarted: x.responseStarted) == .abort { return abort(failure: nil) }
            return respond(response)
        }
        return answerUnread(response, start: now)
    }

    /// The client's FIN: a half-close, or a close (with half-closure allowed, both arrive so).
    /// Nothing more comes than what the reader holds (`unparsedBytes`: bytes of requests behind
    /// the current one). Every request complete before the FIN is answered, in order, as nginx
    /// does; the connection closes once the reader is drained (`readerDrained`), and a request
    /// cut short ends then. With nothing behind it, the current request is the last: its
    /// response says `Connection: close`.
    mutating func clientInputClosed(unparsedBytes: Bool) -> Action {
        inputClosed = true
        if !unparsedBytes, case .exchange(let x, true) = state {
            state = .modifying
            state = .exchange(x, keepAlive: false)
        }
        return readerDrained()
    }

    /// The reader has handed in every complete part it holds (the handler asks after each pump).
    /// After the client's FIN that is all there will be (`ExchangeRules.onClientInputEnd`):
    /// between requests the connection closes; a request cut short is aborted as the client's.
    mutating func readerDrained() -> Action {
        guard inputClosed, acceptsParts else { return .none }
        let phase: ExchangeRules.Phase
        var requestEnded = true
        switch state {
        case .idle: phase = .idle
        case .exchange(let x, _):
            phase = x.phase
            requestEnded = x.body.ended
        default: phase = .closed
        }
        switch ExchangeRules.onClientInputEnd(phase: phase, requestEnded: requestEnded) {
        case .carryOn: return .none
        case .close: return closeNow()
        case .abortRequest: return clientAbandoned()
        }
    }

    /// The client left in the middle of a request: nothing can be answered. The exchange is
    /// recorded as aborted, with `ExchangeRecord.clientClosedRequest` (499) when no response had
    /// begun, and the upstream connection serving it, if any, is closed.
    mutating func clientAbandoned() -> Action {
        exchange { $0.clientLeft() } ?? .none
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
        guard case .exchange(var x, _) = before else { return .none }
        if case .forwarding = x.state {
            let upstream = x.upstream
            _ = x.clientLeft()
            return .abort(Ended(log: x.log, lease: x.lease), upstream: upstream, failure: nil)
        }
        // Nothing was answered or sent upstream: nothing to record.
        return .drop(x.lease)
    }

    /// The handler shut the connection's output after the last response: what arrives now is
    /// read and discarded until the client's FIN.
    mutating func lingering() { state = .lingering }

    /// The handler left the pipeline.
    mutating func gone() { state = .closed }

    // MARK: answers that come back

    /// What the guard of `.admit(exchange:_:)` is asked (built from the state, not carried in
    /// the action: a head is too large to pass around by value).
    mutating func guardRequest(for id: UInt64) -> GuardRequest? {
        let address = peer.socketAddress
        return peek { x, _ in
            guard x.id == id, case .awaitingVerdict(let admitted, _) = x.state else { return nil }
            return admitted.guardRequest(clientAddress: address, trace: x.log.trace?.spans)
        } ?? nil
    }

    mutating func verdict(_ result: Result<Verdict, any Error>, for id: UInt64, now: @autoclosure () -> NIODeadline) -> Action {
        let client = ExchangeStateMachine.Client(id: peer.clientID, address: peer.string, trusted: peer.trusted, scheme: shared.scheme)
        let allocator = self.allocator
        if let action = exchange(id, { $0.verdict(result, client: client, allocator: allocator, now: now()) }) { return action }
        if case .success(let verdict) = result { return .discard(verdict) }
        return .none
    }

    mutating func answered(_ result: Result<LocalResponse, any Error>, for id: UInt64) -> Action {
        exchange(id) { $0.answered(result) } ?? .none
    }

    /// The upstream connection asked for with `.connect`, or why there is none.
    mutating func connected(_ result: Result<UpstreamConnection, any Error>, for id: UInt64, now: @autoclosure () -> NIODeadline) -> Action {
        let timeout = shared.timeouts.upstreamResponse
        if let action = exchange(id, { $0.connected(result, now: now(), responseTimeout: timeout) }) { return action }
        if case .success(let connection) = result { return .closeUpstream(connection) }
        return .none
    }

    /// A part of the app's response.
    mutating func upstreamPart(_ part: ResponseReader.Part, now: @autoclosure () -> NIODeadline) -> Action {
        exchange { $0.upstreamPart(part, now: now()) } ?? .none
    }

    /// The upstream connection closed (`error`: it sent what is not a response, or failed).
    mutating func upstreamClosed(_ error: (any Error)?) -> Action {
        exchange { $0.upstreamClosed(error) } ?? .none
    }

    // MARK: timers

    mutating func timerFired(now: NIODeadline) -> Action {
        switch state {
        case .exchange:
            let allowance = shared.timeouts.requestBody
            if let action = exchange(nil, { $0.timerFired(now: now, bodyAllowance: allowance) }), !action.isNone { return action }
        case .idle(let since?) where since + shared.timeouts.requestHead <= now:
            // A client trickling header lines resets the idle timer with each; the head's own
            // deadline does not move (nginx's client_header_timeout, HAProxy's http-request).
            return answerUnread(.error(.requestTimeout, "the request head did not arrive within server.timeouts.request_head", close: true),
                                start: since)
        case .idle:
            break
        case .closing, .lingering, .tunnel, .closed, .modifying:
            return .none
        }
        guard lastActivity + shared.timeouts.idle <= now else { return .none }
        if case .idle = state { return closeNow() }
        return exchange { $0.idleTimeout() } ?? .none
    }

    /// When the timer should fire next (after `timerFired` returned `.none`).
    mutating func nextDeadline(now: NIODeadline) -> NIODeadline {
        var next = lastActivity + shared.timeouts.idle
        if let deadline = eagerDeadline, deadline < next { next = deadline }
        return max(next, now + .milliseconds(1))
    }

    // MARK: the exchange's actions, for HTTP/1

    /// What an action of the exchange in flight (`x`, taken out of the state) means on this
    /// connection: responses encoded as HTTP/1, and where the connection goes after one that
    /// ends the exchange.
    private mutating func http1(_ action: ExchangeStateMachine.Action, _ x: inout ExchangeStateMachine, keepAlive: inout Bool) -> (Action, Next) {
        switch action {
        case .none: return (.none, .same)
        case .askGuard:
            guard case .awaitingVerdict(let admitted, _) = x.state else { return (.none, .same) }
            return (.admit(exchange: x.id, admitted.route), .same)
        case .answer(let body, let respond):
            return (.answer(exchange: x.id, body, respond: respond), .same)
        case .connect(let route, let principal, let pooled):
            return (.connect(exchange: x.id, route, principal: principal, pooled: pooled), .same)
        case .startForwarding(let connection, let head, let chunked, let body):
            return (.startForwarding(connection, head: head, method: x.log.method, chunked: chunked, body: body), .same)
        case .forwardBody(let connection, let bytes): return (.forwardBody(connection, bytes), .same)
        case .forwardEnd(let connection): return (.forwardEnd(connection), .same)
        case .respond(let response, let upstream, let failure):
            // A body not read to its end leaves the connection's framing in doubt.
            let keeps = !response.close && afterResponse(keepAlive: keepAlive, requestComplete: x.body.drained) == .nextRequest
            let bytes = HTTPWire.localResponse(response, requestID: x.log.requestID, keepAlive: keeps, clientVersion: x.log.version,
                                               headRequest: x.log.method == .HEAD, allocator: allocator)
            let after: After = keeps ? .nextRequest : .close
            return (.respond(bytes, Ended(log: x.log, lease: x.lease), upstream: upstream, failure: failure, after: after), after == .close ? .closing : .idle)
        case .interim(let status):
            // Interim (100 Continue, 103): the status line alone, to HTTP/1.1 clients.
            var buffer = allocator.buffer(capacity: 64)
            HTTPWire.writeStatusLine(HTTPResponseStatus(statusCode: status), into: &buffer)
            buffer.writeStaticString("\r\n")
            return (.write(buffer), .same)
        case .relayHead(let head, let framing, let rules):
            if framing == .untilClose || quiescing { keepAlive = false }
            var buffer = allocator.buffer(capacity: head.head.bytes.readableBytes + 96)
            head.write(rules: rules, .init(requestID: x.log.requestID, chunked: framing == .chunked, keepAlive: keepAlive, clientVersion: x.log.version),
                       into: &buffer)
            return (.write(buffer), .same)
        case .relayBody(let bytes, let chunked):
            return (.writeBody(bytes, chunked: chunked), .same)
        case .finish(let lastChunk, let upstream, let reuse):
            let after = afterResponse(keepAlive: keepAlive, requestComplete: x.body.ended)
            return (.finish(Ended(log: x.log, lease: x.lease), lastChunk: lastChunk, upstream: upstream, reuse: reuse, after: after),
                    after == .close ? .closing : .idle)
        case .abort(let upstream, let failure):
            return (.abort(Ended(log: x.log, lease: x.lease), upstream: upstream, failure: failure), .closing)
        case .upgrade(let connection, let head, let rules):
            var buffer = allocator.buffer(capacity: head.head.bytes.readableBytes)
            head.writeUpgrade(rules: rules, into: &buffer)
            return (.upgrade(Ended(log: x.log, lease: x.lease), connection, head: buffer), .tunnel)
        case .closeUpstream(let connection): return (.closeUpstream(connection), .same)
        case .discard(let verdict): return (.discard(verdict), .same)
        }
    }

    /// A response the gateway makes for the exchange in flight.
    mutating func respond(_ response: LocalResponse) -> Action {
        exchange { $0.respond(response) } ?? .none
    }

    private func afterResponse(keepAlive: Bool, requestComplete: Bool) -> After {
        ExchangeRules.clientKeepsAlive(requested: keepAlive, requestComplete: requestComplete, quiescing: quiescing) ? .nextRequest : .close
    }

    /// A response to bytes that never made a request (a head that broke or never ended).
    private mutating func answerUnread(_ response: LocalResponse, start: NIODeadline) -> Action {
        let log = ExchangeLog(method: .GET, version: .http1_1, start: start, path: "", requestID: nextRequestID())
        state = .exchange(ExchangeStateMachine(id: nextExchange(), log: log, framing: .none), keepAlive: false)
        return respond(response)
    }

    mutating func abort(failure: UpstreamErrorKind?) -> Action {
        if let action = exchange(nil, { $0.abort(failure: failure) }) { return action }
        state = .closing
        return .abort(nil, upstream: nil, failure: failure)
    }

    mutating func closeNow() -> Action {
        let upstream = self.upstream
        state = .closing
        return .close(upstream: upstream)
    }

    mutating func nextRequestID() -> String { requestIDs.next() }

    /// The routing snapshot for the next request, and whether the peer is trusted under it.
    mutating func currentRouting() -> (snapshot: RoutingSnapshot, peerTrusted: Bool) {
        let generation = shared.routingGeneration
        if let routing, routing.generation == generation { return (routing.snapshot, routing.peerTrusted) }
        let snapshot = shared.snapshot
        let trusted = snapshot.trusts(peer.address)
        routing = (generation, snapshot, trusted)
        return (snapshot, trusted)
    }
    mutating func nextID() -> UInt64 { requestIDs.nextValue() }

    mutating func nextExchange() -> UInt64 {
        exchanges &+= 1
        return exchanges
    }
}

extension ExchangeStateMachine.Action {
    var isNone: Bool { if case .none = self { return true } else { return false } }
}

extension ClientConnectionStateMachine.Action {
    var isNone: Bool { if case .none = self { return true } else { return false } }
}
