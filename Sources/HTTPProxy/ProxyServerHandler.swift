import GatewayConfig
import NIOCore
import NIOHTTP1
import NIOSSL

/// The client side of the proxy: one per client connection, last in the pipeline (after TLS,
/// if any). It reads requests with the wire engine (`RequestReader`) straight from the
/// received bytes, decides, per request, what happens (reject, answer, forward), streams
/// bodies both ways with back-pressure, handles pipelining itself, and writes responses with
/// its own serializer (one write per head, flushes coalesced per read burst).
///
/// Read gating: the handler swallows `read()` unless `ExchangeRules.shouldReadClient` allows
/// it — never while a verdict or an upstream connection is pending, a body only as fast as the
/// upstream takes it. Everything runs on the client's event loop, as does the upstream
/// connection. The decisions themselves live in `ExchangeRules`; this class applies them.
final class ProxyServerHandler: ChannelDuplexHandler, RemovableChannelHandler, UpstreamConnectionOwner {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private typealias Phase = ExchangeRules.Phase
    private typealias RequestPart = RequestReader.Part

    /// The request/response pair in flight.
    private struct Exchange {
        var method: HTTPMethod = .GET
        var clientVersion: HTTPVersion = .http1_1
        var start: NIODeadline = .now()
        var path = ""
        var requestEnded = false
        var requestHasBody = false
        /// The body goes upstream in chunks (it came chunked).
        var requestChunked = false
        var keepAlive = true
        var isWebSocket = false
        var route: ProxyRoute? = nil
        var requestID = ""
        var userAgent: String? = nil
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
        /// When the upstream connection was asked for, and how long until the response head.
        var upstreamStart: NIODeadline? = nil
        var upstreamNanoseconds: Int64? = nil
    }

    private let shared: ProxyShared
    private let pool: UpstreamPool
    private var context: ChannelHandlerContext!
    private var phase: Phase = .idle
    private var exchange = Exchange()
    private var generation: UInt64 = 0
    private var reader: RequestReader
    private var buffered = CircularBuffer<RequestPart>()
    private var pipelined = CircularBuffer<RequestPart>()
    private var drainingPipeline = false
    private var readPending = false
    private var quiescing = false
    private var upstream: UpstreamConnection? = nil
    private var peerAddress: IPAddress? = nil
    /// Read once: `Channel.remoteAddress` takes a lock on every access.
    private var remoteAddress: SocketAddress? = nil
    private var peerString = "-"
    private var idSeed: UInt64 = 0
    private var lastActivity: NIODeadline = .now()
    private var responseDeadline: NIODeadline? = nil
    /// While a request body is arriving: when its head came (`ExchangeRules.bodyDeadline`), and
    /// how long the gateway held the client back meanwhile (not the client's time).
    private var bodyStart: NIODeadline? = nil
    private var bodyHeld: TimeAmount = .zero
    private var heldSince: NIODeadline? = nil
    /// A decoder error behind a request still being answered: answered (400/431, close) once
    /// everything before it has been (a valid request followed by junk gets its own response).
    private var deferredError: LocalResponse? = nil
    private var timer: Scheduled<Void>? = nil
    private var timerDeadline: NIODeadline = .distantFuture
    private var inReadBurst = false
    private var inputClosed = false
    private var closing = false
    /// After the last response: output shut, input still read and discarded (lingering close).
    private var lingering = false
    /// `.collecting`: the body read so far and what answers it.
    private var collected = ByteBuffer()
    private var collector: (maxBytes: Int, respond: @Sendable (ByteBuffer) -> EventLoopFuture<LocalResponse>)? = nil

    init(shared: ProxyShared, pool: UpstreamPool) {
        self.shared = shared
        self.pool = pool
        self.reader = RequestReader(maxHeadBytes: shared.limits.maxHeaderBytes, maxFields: shared.limits.maxHeaderCount)
    }

    // MARK: channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        var rng = SystemRandomNumberGenerator()
        idSeed = rng.next() | 1
        remoteAddress = context.channel.remoteAddress
        if let remote = remoteAddress, let ip = remote.ipAddress {
            peerString = ip
            peerAddress = IPAddress.parse(ip)
        }
        shared.observer.clientConnectionOpened()
        armTimer(in: shared.timeouts.idle)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        // No upstream may call back into a handler without a pipeline (closing it clears its
        // owner); normally channelInactive or the upgrade has let it go already.
        if let upstream { upstream.close(); self.upstream = nil }
        // The context holds this handler: keeping it would keep both, and the connection's
        // every buffer, for the life of the process (measured: ~2 KiB per closed connection).
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        if phase == .forwarding || phase == .connecting {
            if let upstream { upstream.close() }
            if phase == .forwarding { record(aborted: true) }
        }
        upstream = nil
        phase = .closed
        generation &+= 1
        timer?.cancel()
        exchange.tunnel?.finish()
        shared.observer.clientConnectionClosed()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if lingering || deferredError != nil { return }
        lastActivity = .now()
        inReadBurst = true
        reader.receive(unwrapInboundIn(data))
        do {
            while phase != .closed, let part = try reader.next() { receive(part) }
        } catch {
            requestUnreadable(error)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        inReadBurst = false
        if phase == .forwarding { upstream?.flush() }
        context.flush()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            upstream?.clientBecameWritable()
            resumeReading()
        }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard phase != .closed else { return }
        // The transport failed (a reset, TLS ended without close_notify): nothing can be
        // answered; channelInactive records what was in flight.
        context.close(promise: nil)
    }

    /// The client's bytes are not HTTP/1.1 (or too much of it): framing is in doubt, so answer
    /// (if nothing was answered yet) and close. Nothing after the error is read.
    private func requestUnreadable(_ error: WireError) {
        let response: LocalResponse
        switch error {
        case .tooLarge(let reason): response = .error(.requestHeaderFieldsTooLarge, "request head too large: \(reason)", close: true)
        case .malformed(let reason): response = .error(.badRequest, "malformed HTTP request: \(reason)", close: true)
        }
        switch ExchangeRules.onDecoderError(phase: phase, requestEnded: exchange.requestEnded, responseStarted: exchange.responseStarted,
                                            upgradeRequested: exchange.isWebSocket) {
        case .answerAfterCurrent:
            // Nothing more is parsed, so nothing else can come in between.
            if deferredError == nil { deferredError = response }
            return
        case .abort:
            return abort()
        case .answerNow:
            break
        }
        if phase == .idle {
            exchange = Exchange()
            exchange.requestID = nextRequestID()
        }
        if let upstream { upstream.close(); self.upstream = nil }
        generation &+= 1
        respondLocal(response)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            quiescing = true
            if phase == .idle, pipelined.isEmpty { close() }
            return
        }
        if let event = event as? ChannelEvent, event == .inputClosed {
            if lingering { return context.close(promise: nil) }  // the client is done too
            // The client half-closed after sending: answer what it asked, then close.
            inputClosed = true
            exchange.keepAlive = false
            if phase == .idle, pipelined.isEmpty { close() }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func read(context: ChannelHandlerContext) {
        if lingering || wantsRead {
            releaseHold()
            context.read()
        } else {
            readPending = true
            if bodyStart != nil, heldSince == nil { heldSince = .now() }
        }
    }

    private var wantsRead: Bool {
        // After a decoder error nothing more can be parsed: stop reading.
        deferredError == nil && ExchangeRules.shouldReadClient(phase: phase, quiescing: quiescing, requestEnded: exchange.requestEnded,
                                       pipelinedEmpty: pipelined.isEmpty, upstreamWritable: upstream?.isWritable ?? false,
                                       clientWritable: context.channel.isWritable)
    }

    private func resumeReading() {
        if readPending, wantsRead {
            releaseHold()
            context.read()
        }
    }

    /// Reading resumes: the time the client was held back is not counted against its body.
    private func releaseHold() {
        readPending = false
        if let since = heldSince {
            bodyHeld = bodyHeld + (.now() - since)
            heldSince = nil
        }
    }

    // MARK: requests

    private func receive(_ part: RequestPart) {
        if phase == .idle {
            guard case .head(let head) = part else { return }
            startExchange(head)
        } else if phase != .closed, !exchange.requestEnded {
            requestPart(part)
        } else if phase != .closed {
            pipelined.append(part)
        }
    }

    private func requestPart(_ part: RequestPart) {
        switch part {
        case .end:
            exchange.requestEnded = true
            bodyStart = nil
        case .body(let buffer):
            exchange.bodyBytes += buffer.readableBytes
            if exchange.maxBodyBytes > 0, exchange.bodyBytes > exchange.maxBodyBytes {
                return requestFailed(.payloadTooLarge, "request body larger than \(exchange.maxBodyBytes) bytes")
            }
        case .head: break
        }
        switch phase {
        case .awaitingVerdict, .connecting:
            buffered.append(part)
        case .collecting:
            collect(part)
        case .forwarding:
            guard let upstream else { return }
            switch part {
            case .body(let buffer): upstream.writeBody(buffer)
            case .end:
                upstream.writeEnd()
                startResponseDeadline()
            case .head: break
            }
        case .idle, .closed:
            break
        }
    }

    private func startExchange(_ head: WireHead) {
        generation &+= 1
        bodyStart = nil
        // Parts of the previous request that arrived while its verdict was pending and that
        // request was answered locally: they must never be replayed into this one.
        buffered.removeAll(keepingCapacity: true)
        let uri = head.target
        exchange = Exchange(method: head.method, clientVersion: head.version, start: .now(), path: uri)
        exchange.requestID = nextRequestID()
        exchange.keepAlive = false
        // The wire engine reads HTTP/1.0 and HTTP/1.1 only, heads within server.limits.
        if head.method == .CONNECT {
            // A tunnel to wherever the client names is not what a gateway in front of an app
            // offers (nginx answers 405 too); the reader parsed nothing behind it.
            return respondLocal(Self.methodNotAllowed("CONNECT is not proxied"))
        }
        let snapshot = shared.snapshot
        let trusted = peerAddress.map { ip in snapshot.trustedProxies.contains { $0.contains(ip) } } ?? false
        let inbound: InboundRequest
        switch snapshot.rules.inspect(head, peerTrusted: trusted) {
        case .success(let value): inbound = value
        case .failure(.badRequest(let reason)): return respondLocal(.error(.badRequest, reason, close: true))
        case .failure(.expectationFailed): return respondLocal(.error(.expectationFailed, "only Expect: 100-continue is supported", close: true))
        }
        exchange.requestHasBody = inbound.framing != .none
        exchange.requestChunked = inbound.framing == .chunked
        exchange.keepAlive = inbound.keepAlive && !quiescing && !inbound.isWebSocketUpgrade
        exchange.isWebSocket = inbound.isWebSocketUpgrade
        if let id = inbound.requestID { exchange.requestID = id }
        if shared.observer.wantsRequestDetails { exchange.userAgent = head.firstValue(named: "user-agent") }
        if inbound.upgrade == nil, head.fields.contains(where: { head.nameIs($0, "upgrade") }) {
            // e.g. h2c: served as plain HTTP/1.1 without the upgrade, then closed (the
            // reader stops parsing after an upgrade request).
            exchange.keepAlive = false
        }
        let target: RequestTarget
        switch RequestTarget.parse(uri, host: inbound.host) {
        case .success(let t): target = t
        case .failure(let rejection): return respondLocal(.error(.badRequest, rejection.rawValue, close: true))
        }
        exchange.path = target.path
        guard let route = snapshot.table.match(host: inbound.host, path: target.path) else {
            return respondLocal(.error(.notFound, "no route for this host and path"))
        }
        if head.method == .TRACE, !route.allowTrace {
            var response = Self.methodNotAllowed("TRACE is not forwarded on this route")
            response.close = false
            return respondLocal(response)
        }
        if inbound.isWebSocketUpgrade, !snapshot.origins.admits(origin: head.firstValue(named: "origin"), host: inbound.host) {
            return respondLocal(.error(.forbidden, "cross-origin WebSocket handshake refused", close: true))
        }
        exchange.maxBodyBytes = route.maxBodyBytes
        if route.maxBodyBytes > 0, case .contentLength(let length) = inbound.framing, length > route.maxBodyBytes {
            return respondLocal(.error(.payloadTooLarge, "request body larger than \(route.maxBodyBytes) bytes", close: true))
        }
        if exchange.requestHasBody, !exchange.requestEnded { startBodyDeadline() }
        exchange.route = route
        exchange.inbound = inbound
        exchange.target = target
        exchange.snapshot = snapshot
        phase = .awaitingVerdict
        let decision = route.requestGuard.admit(
            GuardRequest(wire: head, target: target, routeName: route.name, clientAddress: remoteAddress, host: inbound.host,
                         isWebSocketUpgrade: inbound.isWebSocketUpgrade, hasBearer: inbound.hasBearer), on: context.eventLoop)
        switch decision {
        case .verdict(let verdict):
            apply(verdict)
        case .pending(let future):
            let gen = generation
            let this = NIOLoopBound(self, eventLoop: context.eventLoop)
            future.hop(to: context.eventLoop).whenComplete { result in
                let handler = this.value
                guard handler.generation == gen, handler.phase == .awaitingVerdict else {
                    // Too late (the client left, or the request was answered meanwhile).
                    if case .success(let verdict) = result { Self.discard(verdict) }
                    return
                }
                switch result {
                case .success(let verdict): handler.apply(verdict)
                case .failure: handler.respondLocal(.error(.serviceUnavailable, "admission could not be decided"))
                }
            }
        }
    }

    private func apply(_ verdict: Verdict) {
        switch verdict {
        case .respond(let response):
            respondLocal(response)
        case .collectBody(let maxBytes, let respond):
            phase = .collecting
            collector = (maxBytes, respond)
            collected = context.channel.allocator.buffer(capacity: 0)
            let parts = buffered
            buffered.removeAll()
            for part in parts where phase == .collecting { collect(part) }
            resumeReading()
        case .forward(let addHeaders, let removeHeaders, let tunnel, let user):
            guard let inbound = exchange.inbound, let target = exchange.target, let route = exchange.route else { return Self.discard(verdict) }
            exchange.tunnel = tunnel
            exchange.user = user
            exchange.forwarded = true
            exchange.inbound = nil
            var head = UpstreamRequestHead(method: exchange.method, target: route.upstreamTarget(target), removing: removeHeaders.map { $0.lowercased() },
                                           replacesHost: route.upstreamHost != nil)
            head.adding.reserveCapacity(5 + addHeaders.count)
            head.adding.append(("X-Forwarded-For", inbound.forwardedFor.map { "\($0), \(peerString)" } ?? peerString))
            head.adding.append(("X-Forwarded-Proto", inbound.forwardedProto ?? shared.scheme))
            if let host = inbound.host?.authority { head.adding.append(("X-Forwarded-Host", host)) }
            if let host = route.upstreamHost {
                head.adding.append(("Host", host))
            } else if inbound.host == nil {
                head.adding.append(("Host", route.upstream.description))
            }
            head.adding.append(("X-Request-Id", exchange.requestID))
            for (name, value) in addHeaders where HTTPWire.isSafeValue(value) && HTTPWire.isSafeValue(name) {
                head.adding.append((name, value))
            }
            var bytes = context.channel.allocator.buffer(capacity: inbound.head.bytes.readableBytes + 256)
            head.write(inbound, into: &bytes)
            exchange.upstreamHead = bytes
            acquireUpstream()
        }
    }

    /// 405 with `Allow` (RFC 9110 §15.5.6), closing the connection.
    private static func methodNotAllowed(_ reason: String) -> LocalResponse {
        var response = LocalResponse.error(.methodNotAllowed, reason, close: true)
        response.headers.append(("allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"))
        return response
    }

    /// A verdict nobody will apply: a tunnel lease it carries is finished (it leaves its registry).
    private static func discard(_ verdict: Verdict) {
        if case .forward(_, _, let tunnel?, _) = verdict { tunnel.finish() }
    }

    /// A body part for one of the gateway's own endpoints.
    private func collect(_ part: RequestPart) {
        guard let collector else { return }
        switch part {
        case .head: break
        case .body(var buffer):
            guard collected.readableBytes + buffer.readableBytes <= collector.maxBytes else {
                self.collector = nil
                return respondLocal(.error(.payloadTooLarge, "request body larger than \(collector.maxBytes) bytes", close: true))
            }
            collected.writeBuffer(&buffer)
        case .end:
            finishCollecting()
        }
    }

    private func finishCollecting() {
        guard let collector else { return }
        self.collector = nil
        phase = .awaitingVerdict
        let body = collected
        collected = ByteBuffer()
        let gen = generation
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        collector.respond(body).hop(to: context.eventLoop).whenComplete { result in
            let handler = this.value
            guard handler.generation == gen, handler.phase == .awaitingVerdict else { return }
            switch result {
            case .success(let response): handler.respondLocal(response)
            case .failure: handler.respondLocal(.error(.serviceUnavailable, "the request could not be answered"))
            }
        }
    }

    /// Attaches a pooled connection, or opens one. `pooled: false` for the retry after a pooled
    /// connection died, and for WebSocket handshakes (never pooled).
    private func acquireUpstream(pooled: Bool = true) {
        guard let route = exchange.route else { return }
        phase = .connecting
        if exchange.upstreamStart == nil { exchange.upstreamStart = .now() }
        if pooled, !exchange.isWebSocket, let connection = pool.takeIdle(route.upstream) {
            attach(connection)
            return
        }
        let gen = generation
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        pool.connect(route.upstream).whenComplete { result in
            let handler = this.value
            switch result {
            case .success(let bound):
                let connection = bound.value
                guard handler.generation == gen, handler.phase == .connecting else {
                    connection.close()
                    return
                }
                handler.attach(connection)
            case .failure(let error):
                guard handler.generation == gen, handler.phase == .connecting else { return }
                if let channelError = error as? ChannelError, case .connectTimeout = channelError {
                    handler.upstreamFailure(.connectTimeout, .gatewayTimeout, "upstream did not accept the connection in time")
                } else if error is UpstreamTLSFailure {
                    handler.upstreamFailure(.tlsHandshake, .badGateway, "TLS handshake with the upstream failed")
                } else {
                    handler.upstreamFailure(.connectRefused, .badGateway, "upstream refused the connection")
                }
            }
        }
    }

    private func attach(_ connection: UpstreamConnection) {
        guard let head = exchange.upstreamHead else { return }
        upstream = connection
        connection.owner = self
        phase = .forwarding
        connection.writeHead(head, method: exchange.method, chunked: exchange.requestChunked)
        while let part = buffered.popFirst() {
            switch part {
            case .body(let buffer): connection.writeBody(buffer)
            case .end:
                connection.writeEnd()
                startResponseDeadline()
            case .head: break
            }
        }
        // Inside a read burst, channelReadComplete flushes once for the whole burst.
        if !inReadBurst { connection.flush() }
        resumeReading()
    }

    /// The request failed while its body was arriving (too large, too slow): answered with
    /// `status` and closed if no response byte went out yet; otherwise the connection is aborted.
    private func requestFailed(_ status: HTTPResponseStatus, _ reason: String) {
        bodyStart = nil
        collector = nil
        if let upstream { upstream.close(); self.upstream = nil }
        generation &+= 1
        guard !exchange.responseStarted else { return abort() }
        respondLocal(.error(status, reason, close: true))
    }

    private func upstreamFailure(_ kind: UpstreamErrorKind, _ status: HTTPResponseStatus, _ reason: String) {
        shared.observer.upstreamFailed(kind, route: exchange.route?.name ?? "-")
        respondLocal(.error(status, reason))
    }

    // MARK: responses from the upstream

    var clientIsWritable: Bool { context?.channel.isWritable ?? false }

    func upstreamWritabilityChanged(isWritable: Bool) {
        if isWritable { resumeReading() }
    }

    func upstreamRead(_ part: ResponseReader.Part) {
        lastActivity = .now()
        switch part {
        case .head(let head):
            responseHead(head)
        case .body(let buffer):
            exchange.bytesSent += buffer.readableBytes
            switch exchange.framing {
            case .raw, .untilClose: context.write(wrapOutboundOut(buffer), promise: nil)
            case .chunked: HTTPWire.writeChunk(buffer, context: context)
            case .noBody: break
            }
        case .end:
            // Response trailers are not relayed.
            if exchange.framing == .chunked {
                context.write(wrapOutboundOut(ByteBuffer(staticString: "0\r\n\r\n")), promise: nil)
            }
            finishExchange()
        }
    }

    func upstreamReadComplete() {
        context.flush()
    }

    private func responseHead(_ wire: WireHead) {
        let status = wire.status
        if let start = exchange.upstreamStart, exchange.upstreamNanoseconds == nil, status >= 200 || status == 101 {
            exchange.upstreamNanoseconds = Int64(NIODeadline.now().uptimeNanoseconds - start.uptimeNanoseconds)
        }
        if status == 101 {
            if exchange.isWebSocket, !exchange.responseStarted { return upgrade(ResponseHead(wire)) }
            upstream?.close()
            upstream = nil
            return upstreamFailure(.closedBeforeResponse, .badGateway, "upstream switched protocols unasked")
        }
        guard ExchangeRules.relaysStatus(status) else { return refuseResponse("upstream answered with an invalid status") }
        if status < 200 {
            // Interim (100 Continue, 103): the status line alone, to HTTP/1.1 clients.
            guard exchange.clientVersion.minor >= 1 else { return }
            var buffer = context.channel.allocator.buffer(capacity: 64)
            HTTPWire.writeStatusLine(HTTPResponseStatus(statusCode: status), into: &buffer)
            buffer.writeStaticString("\r\n")
            context.write(wrapOutboundOut(buffer), promise: nil)
            return
        }
        let head = ResponseHead(wire)
        responseDeadline = nil
        exchange.responseStarted = true
        exchange.status = status
        exchange.upstreamKeepAlive = ExchangeRules.upstreamKeepsAlive(version: wire.version, connectionTokens: head.connectionTokens)
        exchange.framing = ExchangeRules.responseFraming(requestMethod: exchange.method, status: status,
                                                         hasContentLength: head.hasContentLength, clientVersion: exchange.clientVersion)
        if exchange.framing == .untilClose { exchange.keepAlive = false }
        if quiescing || inputClosed { exchange.keepAlive = false }
        var buffer = context.channel.allocator.buffer(capacity: wire.bytes.readableBytes + 96)
        head.write(rules: exchange.snapshot?.rules,
                   .init(requestID: exchange.requestID, chunked: exchange.framing == .chunked, keepAlive: exchange.keepAlive,
                         clientVersion: exchange.clientVersion),
                   into: &buffer)
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    /// A response head the gateway will not relay: 502, and the connection is not reused.
    private func refuseResponse(_ reason: String) {
        upstream?.close()
        upstream = nil
        upstreamFailure(.invalidResponse, .badGateway, reason)
    }

    func upstreamClosed(_ error: (any Error)?) {
        guard phase == .forwarding, let connection = upstream else { return }
        upstream = nil
        if let invalid = error as? WireError {
            // Bytes that are not a response (framing two hops could read differently, a bad
            // status line, a truncated chunk): never relayed.
            guard exchange.responseStarted else { return upstreamFailure(.invalidResponse, .badGateway, "upstream response refused: \(invalid)") }
            shared.observer.upstreamFailed(.invalidResponse, route: exchange.route?.name ?? "-")
            return abort()
        }
        if !exchange.responseStarted {
            if ExchangeRules.mayRetry(method: exchange.method, connectionWasReused: connection.reused, requestHasBody: exchange.requestHasBody,
                                      requestEnded: exchange.requestEnded, alreadyRetried: exchange.retried) {
                // The pooled connection was closed by the upstream before answering: the request
                // never reached it. Retry once on a fresh connection (RFC 9110 §9.2.2).
                exchange.retried = true
                buffered.removeAll()
                buffered.append(.end(nil))
                responseDeadline = nil
                acquireUpstream(pooled: false)
                return
            }
            return upstreamFailure(.closedBeforeResponse, .badGateway, "upstream closed the connection before responding")
        }
        // Mid-response: never let a truncated response look complete.
        shared.observer.upstreamFailed(.resetDuringResponse, route: exchange.route?.name ?? "-")
        abort()
    }

    /// The response cannot be completed: what was written goes out, then the connection closes
    /// (the client sees a truncated response, never a complete-looking one).
    private func abort() {
        record(aborted: true)
        phase = .closed
        if let upstream { upstream.close(); self.upstream = nil }
        context.flush()
        context.close(promise: nil)
    }

    private func finishExchange() {
        // The upstream's readComplete will not reach us once the connection is back in the
        // pool: flush the response now (one flush per response in the common case).
        context.flush()
        record(aborted: false)
        if let connection = upstream {
            upstream = nil
            if exchange.requestEnded, exchange.upstreamKeepAlive, !exchange.isWebSocket {
                pool.release(connection)
            } else {
                connection.close()
            }
        }
        continueOrClose()
    }

    /// After a response is complete: next (pipelined) request, or close.
    private func continueOrClose() {
        responseDeadline = nil
        buffered.removeAll()
        if ExchangeRules.clientKeepsAlive(requested: exchange.keepAlive, requestComplete: exchange.requestEnded, quiescing: quiescing, inputClosed: inputClosed) {
            phase = .idle
            drainPipelined()
            if phase == .idle { resumeReading() }
            if quiescing, phase == .idle, pipelined.isEmpty { close() }
        } else {
            close()
        }
    }

    private func drainPipelined() {
        guard !drainingPipeline else { return }
        drainingPipeline = true
        defer { drainingPipeline = false }
        while phase != .closed, let part = pipelined.first {
            if phase == .idle, deferredError != nil, !pipelined.contains(where: { if case .end = $0 { return true } else { return false } }) {
                // A request cut short by the junk: its end will never come; only the error is left.
                pipelined.removeAll()
                break
            }
            if phase == .idle || !exchange.requestEnded {
                pipelined.removeFirst()
                receive(part)
            } else {
                break
            }
        }
        // Parts replayed from the queue were written outside a client read burst.
        if phase == .forwarding, !inReadBurst { upstream?.flush() }
        if phase == .idle, pipelined.isEmpty, let error = deferredError {
            // Everything before the junk is answered: now the junk.
            deferredError = nil
            exchange = Exchange()
            exchange.requestID = nextRequestID()
            drainingPipeline = false
            respondLocal(error)
        }
    }

    // MARK: local responses

    private func respondLocal(_ response: LocalResponse) {
        let requestDrained = exchange.requestEnded || !exchange.requestHasBody
        if response.close || !requestDrained || quiescing || inputClosed { exchange.keepAlive = false }
        exchange.status = Int(response.status.code)
        exchange.responseStarted = true
        let bytes = HTTPWire.localResponse(response, requestID: exchange.requestID, keepAlive: exchange.keepAlive,
                                           headRequest: exchange.method == .HEAD, allocator: context.channel.allocator)
        exchange.bytesSent = response.body.readableBytes
        context.write(wrapOutboundOut(bytes), promise: nil)
        record(aborted: false)
        if exchange.keepAlive {
            // A body-less request's `.end` may still follow in this read burst: in `.idle`
            // anything but a head is ignored, so it is dropped there.
            phase = .idle
            if !inReadBurst { context.flush() }
            drainPipelined()
            if phase == .idle { resumeReading() }
        } else {
            close()
        }
    }

    private func close() {
        guard !closing else { return }
        closing = true
        phase = .closed
        generation &+= 1
        if let upstream { upstream.close(); self.upstream = nil }
        let channel = context.channel
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            // Lingering close (RFC 9112 §9.6): send FIN, then keep reading and discarding what
            // the client still sends for a moment. Closing with unread input makes the kernel
            // answer with a reset, which can destroy the response (a 400, 413 or 504) before
            // the client has read it.
            channel.close(mode: .output).whenComplete { result in
                guard case .success = result else { return channel.close(promise: nil) }
                this.value.linger(channel)
            }
        }
    }

    private func linger(_ channel: any Channel) {
        lingering = true
        timer?.cancel()
        timer = nil
        context.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        context.read()
    }

    // MARK: upgrade

    /// The app accepted a WebSocket handshake: its 101 goes to the client, then both connections
    /// become a byte tunnel (`Upgrade`).
    private func upgrade(_ head: ResponseHead) {
        guard let connection = upstream, let upstreamChannel = connection.channel else { return }
        exchange.status = 101
        exchange.responseStarted = true
        var buffer = context.channel.allocator.buffer(capacity: head.head.bytes.readableBytes)
        head.writeUpgrade(rules: exchange.snapshot?.rules, into: &buffer)
        // What the app sent right behind its 101 is the tunnel's already.
        var early = connection.takeTunnelBytes()
        buffer.writeBuffer(&early)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        let tunnel = exchange.tunnel
        exchange.tunnel = nil
        record(aborted: false)
        phase = .closed
        upstream = nil
        Upgrade.splice(client: context, upstream: connection, upstreamChannel: upstreamChannel, clientBytes: reader.takeRemaining(), tunnel: tunnel)
    }

    // MARK: bookkeeping

    private func record(aborted: Bool) {
        if let tunnel = exchange.tunnel {
            // The exchange ended without becoming a tunnel.
            exchange.tunnel = nil
            tunnel.finish()
        }
        let duration = NIODeadline.now().uptimeNanoseconds - exchange.start.uptimeNanoseconds
        shared.observer.exchangeCompleted(ExchangeRecord(
            method: exchange.method.rawValue, path: exchange.path, status: exchange.status,
            route: exchange.route?.name, upstream: exchange.forwarded ? exchange.route?.upstream : nil, client: peerString,
            requestID: exchange.requestID, durationNanoseconds: Int64(duration), bytesSent: exchange.bytesSent,
            aborted: aborted, userAgent: exchange.userAgent, user: exchange.user, upstreamNanoseconds: exchange.upstreamNanoseconds))
    }

    private func nextRequestID() -> String {
        // xorshift64*: unique enough to correlate log lines; seeded per connection.
        idSeed ^= idSeed >> 12
        idSeed ^= idSeed << 25
        idSeed ^= idSeed >> 27
        var value = idSeed &* 2_685_821_657_736_338_717
        // 16 lower-case hex digits, written in place (String(_:radix:) and padding cost ~3 % of
        // a proxied request).
        return String(unsafeUninitializedCapacity: 16) { out in
            for i in stride(from: 15, through: 0, by: -1) {
                let digit = UInt8(truncatingIfNeeded: value & 0xF)
                out[i] = digit < 10 ? 0x30 + digit : 0x57 + digit
                value >>= 4
            }
            return 16
        }
    }

    // MARK: timers

    /// One lazily re-armed timer per connection: deadlines are plain values, so a request sets
    /// one without scheduling anything.
    private func armTimer(in amount: TimeAmount) {
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        timerDeadline = .now() + amount
        timer = context.eventLoop.scheduleTask(deadline: timerDeadline) { this.value.timerFired() }
    }

    /// A request body is expected: it has `request_body` (and its rate credit) to arrive.
    private func startBodyDeadline() {
        bodyStart = .now()
        bodyHeld = .zero
        heldSince = nil
        if let deadline = currentBodyDeadline, deadline < timerDeadline {
            timer?.cancel()
            armTimer(in: shared.timeouts.requestBody)
        }
    }

    /// nil while no body is arriving, or while the gateway holds the client back.
    private var currentBodyDeadline: NIODeadline? {
        guard let start = bodyStart, heldSince == nil, !exchange.requestEnded else { return nil }
        return ExchangeRules.bodyDeadline(start: start, allowance: shared.timeouts.requestBody, held: bodyHeld, bytesReceived: exchange.bodyBytes)
    }

    /// The request is fully sent: the upstream now has `upstream_response` to answer.
    private func startResponseDeadline() {
        let deadline = NIODeadline.now() + shared.timeouts.upstreamResponse
        responseDeadline = deadline
        if deadline < timerDeadline {
            timer?.cancel()
            armTimer(in: shared.timeouts.upstreamResponse)
        }
    }

    private func timerFired() {
        guard phase != .closed else { return }
        let now = NIODeadline.now()
        if let deadline = responseDeadline, deadline <= now, phase == .forwarding, !exchange.responseStarted {
            responseDeadline = nil
            upstream?.close()
            upstream = nil
            upstreamFailure(.responseTimeout, .gatewayTimeout, "upstream did not respond in time")
            if phase == .closed { return }
        }
        if let deadline = currentBodyDeadline, deadline <= now {
            return requestFailed(.requestTimeout, "the request body did not arrive within server.timeouts.request_body")
        }
        let idleDeadline = lastActivity + shared.timeouts.idle
        if idleDeadline <= now {
            if phase == .idle {
                close()
                return
            }
            if phase == .collecting {
                collector = nil
                respondLocal(.error(.requestTimeout, "the request body did not arrive within the idle timeout", close: true))
                return
            }
            if phase == .awaitingVerdict {
                respondLocal(.error(.serviceUnavailable, "admission could not be decided in time", close: true))
                return
            }
            if phase == .forwarding || phase == .connecting {
                shared.observer.upstreamFailed(.idleTimeout, route: exchange.route?.name ?? "-")
                if exchange.responseStarted {
                    abort()
                } else {
                    upstream?.close()
                    upstream = nil
                    respondLocal(.error(.gatewayTimeout, "no progress within the idle timeout", close: true))
                }
                return
            }
        }
        var next = idleDeadline
        if let deadline = responseDeadline, deadline < next { next = deadline }
        if let deadline = currentBodyDeadline, deadline < next { next = deadline }
        let wait = next - now
        armTimer(in: wait > .milliseconds(1) ? wait : .milliseconds(1))
    }
}
