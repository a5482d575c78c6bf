import GatewayConfig
import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2

/// Who an HTTP/2 connection's client is, read once when the connection starts: every stream
/// on it shares it (the anonymous principal of its requests is the connection's, as on HTTP/1).
struct HTTP2Client: Sendable {
    let id: UInt64
    let socketAddress: SocketAddress?
    let address: IPAddress?
    /// The address as `X-Forwarded-For` and the access log write it.
    let string: String

    init(id: UInt64, remoteAddress: SocketAddress?) {
        self.id = id
        self.socketAddress = remoteAddress
        let ip = remoteAddress?.ipAddress
        self.address = ip.flatMap(IPAddress.parse)
        self.string = ip ?? "-"
    }
}

/// One HTTP/2 stream as one exchange: what happens is decided by `HTTP2StreamStateMachine` (the
/// header block checked by HTTP/2's rules, admission and the guard as on HTTP/1, the nested
/// `ExchangeStateMachine`, the stream's deadlines and end); this handler runs it and encodes what
/// it decides as HTTP/2 frames. Upstreams stay HTTP/1.1, through the event loop's user-bound pool.
///
/// Back-pressure: the stream is read only while the exchange can take what it sends
/// (`ExchangeRules.shouldReadClient`, as on HTTP/1), so NIOHTTP2 sends no WINDOW_UPDATE and the
/// client's window closes; the upstream is read only while the stream is writable (its flow
/// control window is open), so a slow stream holds back its own upstream and no other.
final class HTTP2StreamHandler: ChannelDuplexHandler, UpstreamConnectionOwner {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload
    typealias X = ExchangeStateMachine

    /// The `HTTP2StreamInitializer` that installs it.
    static let initializer: HTTP2StreamInitializer = { stream, environment in
        try stream.pipeline.syncOperations.addHandler(HTTP2StreamHandler(environment: environment))
    }

    private let environment: HTTP2StreamEnvironment
    private var shared: ProxyShared { environment.shared }
    private var context: ChannelHandlerContext!
    private var machine = HTTP2StreamStateMachine(now: .now())
    private var readPending = false
    private var timer: Scheduled<Void>? = nil
    private var timerDeadline: NIODeadline = .distantFuture

    init(environment: HTTP2StreamEnvironment) {
        self.environment = environment
    }

    private var now: NIODeadline { context?.eventLoop.now ?? .now() }

    // MARK: NIO events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        machine.lastActivity = context.eventLoop.now
        armTimer()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        machine.lastActivity = now
        switch unwrapInboundIn(data) {
        case .headers(let headers):
            if case .head = machine.state { return start(headers.headers, endStream: headers.endStream) }
            // Trailers: the body's end (trailers are not forwarded, as on HTTP/1).
            if headers.endStream { part(.end(nil)) }
        case .data(let data):
            if case .byteBuffer(let bytes) = data.data, bytes.readableBytes > 0 { part(.body(bytes)) }
            if data.endStream { part(.end(nil)) }
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        upstream?.flush()
        context.flush()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { upstream?.clientBecameWritable() }
        context.fireChannelWritabilityChanged()
    }

    /// The stream closed (the client reset it, the connection went, or it ended): an exchange
    /// still open is the client's abort.
    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        let (ending, upstream) = machine.streamClosed()
        switch ending {
        case .nothing: break
        case .record(let x): record(x, aborted: true)
        case .release(let lease): lease.release()
        }
        upstream?.close()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A stream error NIOHTTP2 found (and answered with RST_STREAM): the stream is over.
        context.close(promise: nil)
    }

    func read(context: ChannelHandlerContext) {
        if wantsRead {
            readPending = false
            withExchange { $0.readResumed(now: self.now) }
            context.read()
        } else {
            readPending = true
            withExchange { $0.readHeld(now: self.now) }
        }
    }

    private var wantsRead: Bool { machine.wantsRead() }

    private func resumeReading() {
        guard readPending, context != nil, wantsRead else { return }
        readPending = false
        withExchange { $0.readResumed(now: self.now) }
        context.read()
    }

    // MARK: the exchange

    private var upstream: UpstreamConnection? {
        withExchange { $0.upstream } ?? nil
    }

    @discardableResult
    private func withExchange<R>(_ event: (inout X) -> R) -> R? { machine.withExchange(event) }

    private func start(_ headers: HPACKHeaders, endStream: Bool) {
        let environment = self.environment
        perform(machine.start(headers, endStream: endStream, now: now, shared: shared, maxHeaderListSize: environment.settings.maxHeaderListSize,
                              client: environment.client.address, requestID: environment.requestID(), nextID: environment.nextID))
    }

    private func part(_ part: X.Part) {
        perform(machine.requestPart(part, now: now, responseTimeout: shared.timeouts.upstreamResponse))
    }

    /// Runs what the stream machine decided.
    private func perform(_ action: HTTP2StreamStateMachine.Action) {
        switch action {
        case .none: break
        case .exchange(let action): run(action)
        case .askGuard: askGuard()
        case .reset(let code):
            context.writeAndFlush(wrapOutboundOut(.rstStream(code)), promise: nil)
            context.close(promise: nil)
        }
    }

    private func askGuard() {
        let address = environment.client.socketAddress
        let asked = withExchange { x -> (GuardRequest, any RequestGuard)? in
            guard case .awaitingVerdict(let admitted, _) = x.state else { return nil }
            return (admitted.guardRequest(clientAddress: address, trace: x.log.trace?.spans), admitted.route.requestGuard)
        }
        guard let (request, requestGuard) = asked ?? nil else { return }
        switch requestGuard.admit(request, on: context.eventLoop) {
        case .verdict(let decided):
            verdict(.success(decided))
        case .pending(let future):
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            future.deliver(on: context.eventLoop, unless: { bound.value.context == nil }) { bound.value.verdict($0) }
        }
    }

    private func verdict(_ result: Result<Verdict, any Error>) {
        let client = X.Client(id: environment.client.id, address: environment.client.string, trusted: machine.peerTrusted, scheme: shared.scheme)
        let allocator = context.channel.allocator
        guard let action = withExchange({ $0.verdict(result, client: client, allocator: allocator, now: self.now) }) else {
            if case .success(let verdict) = result { verdict.discard() }
            return
        }
        deliver(action)
    }

    /// Runs an action that came from an answer (not from a read): reading may resume after it.
    private func deliver(_ action: X.Action) {
        run(action)
        upstream?.flush()
        resumeReading()
        armTimer()
    }

    private func run(_ action: X.Action) {
        guard context != nil else {
            switch action {
            case .closeUpstream(let connection): connection.close()
            case .discard(let verdict): verdict.discard()
            default: break
            }
            return
        }
        switch action {
        case .none:
            break
        case .askGuard:
            askGuard()
        case .answer(let body, let respond):
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            respond(body).hop(to: context.eventLoop).whenComplete { result in
                let handler = bound.value
                guard handler.context != nil, let action = handler.withExchange({ $0.answered(result) }) else { return }
                handler.deliver(action)
            }
        case .connect(let route, let principal, let pooled):
            if pooled, let principal, let connection = environment.connector.takeIdle(route.upstream, for: principal) {
                return connected(.success(connection))
            }
            environment.connector.connect(route.upstream, for: principal, limit: route.upstreamMaxConnections, on: context.eventLoop) { result in
                guard self.context != nil else {
                    if case .success(let connection) = result { connection.close() }
                    return
                }
                self.connected(result)
            }
        case .startForwarding(let connection, let head, let chunked, let body):
            guard let method = withExchange({ $0.log.method }) else { return connection.close() }
            connection.owner = self
            connection.writeHead(head, method: method, chunked: chunked)
            for part in body {
                switch part {
                case .body(let bytes): connection.writeBody(bytes)
                case .end: connection.writeEnd()
                case .head: break
                }
            }
            connection.flush()
        case .forwardBody(let connection, let bytes):
            connection.writeBody(bytes)
        case .forwardEnd(let connection):
            connection.writeEnd()
            connection.flush()
        case .respond(let response, let upstream, let failure):
            upstream?.close()
            guard let x = end() else { return }
            if let failure { shared.observer.upstreamFailed(failure, route: x.log.route?.name ?? "-") }
            let (headers, body) = HTTP2ResponseHeaders.local(response, requestID: x.log.requestID, headRequest: x.log.method == .HEAD)
            record(x, aborted: false)
            context.write(wrapOutboundOut(.headers(.init(headers: headers, endStream: body == nil))), promise: nil)
            if let body { context.write(wrapOutboundOut(.data(.init(data: .byteBuffer(body), endStream: true))), promise: nil) }
            context.flush()
        case .interim(let status):
            var headers = HPACKHeaders()
            headers.add(name: ":status", value: String(status))
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
        case .relayHead(let head, _, let rules):
            let headers = HTTP2ResponseHeaders.relayed(head, rules: rules, requestID: withExchange { $0.log.requestID })
            context.write(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
        case .relayBody(let bytes, _):
            context.write(wrapOutboundOut(.data(.init(data: .byteBuffer(bytes)))), promise: nil)
        case .finish(_, let upstream, let reuse):
            // Recorded first: the stream's end closes its channel at once.
            if let x = end() { record(x, aborted: false) }
            if reuse { environment.connector.release(upstream) } else { upstream.close() }
            context.writeAndFlush(wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer()), endStream: true))), promise: nil)
        case .abort(let upstream, let failure):
            upstream?.close()
            guard let x = end() else { return }
            if let failure { shared.observer.upstreamFailed(failure, route: x.log.route?.name ?? "-") }
            // A truncated response must never look complete: the stream is reset, not ended.
            record(x, aborted: true)
            context.writeAndFlush(wrapOutboundOut(.rstStream(.internalError)), promise: nil)
            context.close(promise: nil)
        case .upgrade(let connection, _, _):
            // No WebSocket over HTTP/2 (RFC 8441 is not offered): a 101 cannot be asked for.
            connection.close()
            run(withExchange { $0.abort(failure: .closedBeforeResponse) } ?? .none)
        case .closeUpstream(let connection):
            connection.close()
        case .discard(let verdict):
            verdict.discard()
        }
    }

    private func connected(_ result: Result<UpstreamConnection, any Error>) {
        let timeout = shared.timeouts.upstreamResponse
        guard let action = withExchange({ $0.connected(result, now: self.now, responseTimeout: timeout) }) else {
            if case .success(let connection) = result { connection.close() }
            return
        }
        deliver(action)
    }

    /// The exchange ended: taken out of the stream (moved, not copied), which takes nothing
    /// more; the caller records it.
    private func end() -> X? {
        timer?.cancel()
        timer = nil
        return machine.end()
    }

    private func record(_ x: X, aborted: Bool) {
        x.lease.release()
        shared.observer.exchangeCompleted(x.log.record(aborted: aborted, client: environment.client.string, now: now))
    }

    // MARK: UpstreamConnectionOwner

    var clientIsWritable: Bool { context?.channel.isWritable ?? false }

    func upstreamRead(_ part: ResponseReader.Part) {
        guard let action = withExchange({ $0.upstreamPart(part, now: self.now) }) else { return }
        run(action)
    }

    func upstreamReadComplete() {
        machine.lastActivity = now
        context?.flush()
    }

    func upstreamClosed(_ error: (any Error)?) {
        guard let action = withExchange({ $0.upstreamClosed(error) }) else { return }
        deliver(action)
    }

    func upstreamWritabilityChanged(isWritable: Bool) {
        if isWritable { resumeReading() }
    }

    // MARK: the timer

    /// One lazily re-armed timer per stream, as on HTTP/1: a deadline later than the armed one
    /// schedules nothing (the armed one fires, finds nothing due, and re-arms for what is); only
    /// an earlier one re-arms it. Scheduling and cancelling a task on every answer cost a lock,
    /// an allocation and two heap operations each.
    private func armTimer() {
        guard let context else { return }
        if case .done = machine.state { return }
        let deadline = machine.deadline(shared.timeouts)
        guard timer == nil || deadline < timerDeadline else { return }
        timer?.cancel()
        timerDeadline = deadline
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(deadline: max(deadline, now + .milliseconds(1))) { bound.value.timerFired() }
    }

    private func timerFired() {
        guard context != nil else { return }
        timer = nil
        switch machine.timerFired(now: now, shared.timeouts) {
        case .none: armTimer()
        case .exchange(let action): deliver(action)
        case let other: perform(other)
        }
    }
}
