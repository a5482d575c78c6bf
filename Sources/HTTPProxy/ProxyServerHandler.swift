import NIOCore
import NIOHTTP1

/// The client side of the proxy: one per client connection, last in the pipeline (after TLS,
/// if any). A shell over `ClientConnectionStateMachine`: it reads requests with the wire engine
/// (`RequestReader`), turns NIO's events (bytes, writability, half-close, the timer, answers
/// that come back) into the machine's events, and runs the actions the machine returns —
/// writes, upstream connections, the guard, the access log. What happens is decided there.
///
/// Read gating: `read()` is swallowed unless the machine allows it (`wantsRead`) — never while
/// a verdict or an upstream connection is pending, a body only as fast as the upstream takes
/// it. Parsed parts are handed in only while the machine accepts them, so a pipelined request
/// waits unparsed in the reader. Everything runs on the client's event loop, as does the
/// upstream connection.
final class ProxyServerHandler: ChannelDuplexHandler, RemovableChannelHandler, UpstreamConnectionOwner {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private typealias Machine = ClientConnectionStateMachine

    private let shared: ProxyShared
    private let connector: any UpstreamConnector
    private var context: ChannelHandlerContext!
    /// Not optional: a computed property read through an optional copies the whole struct.
    private var machine: Machine
    private var reader: RequestReader
    private var readPending = false
    private var inReadBurst = false
    /// Parsed parts are being handed in; `pumpAgain`: a response ended inside (a flush can
    /// re-enter), so the pump goes round once more instead of starting a nested one.
    private var pumping = false
    private var pumpAgain = false
    private var timer: Scheduled<Void>? = nil
    private var timerDeadline: NIODeadline = .distantFuture

    init(shared: ProxyShared, connector: any UpstreamConnector) {
        self.shared = shared
        self.connector = connector
        self.reader = RequestReader(maxHeadBytes: shared.limits.maxHeaderBytes, maxFields: shared.limits.maxHeaderCount)
        var rng = SystemRandomNumberGenerator()
        self.machine = Machine(shared: shared, seed: rng.next())
    }

    private var eventLoop: (any EventLoop)? = nil
    private var now: NIODeadline { eventLoop?.now ?? .now() }

    // MARK: NIO events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.eventLoop = context.eventLoop
        machine.connectionStarted(remoteAddress: context.channel.remoteAddress, clientID: connector.newClient(), now: context.eventLoop.now)
        shared.observer.clientConnectionOpened()
        armTimer(at: now + shared.timeouts.idle)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        // No upstream may call back into a handler without a pipeline (closing it clears its
        // owner); normally channelInactive or the upgrade has let it go already.
        machine.upstream?.close()
        machine.gone()
        // The context holds this handler: keeping it would keep both, and the connection's
        // every buffer, for the life of the process (measured: ~2 KiB per closed connection).
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        run(machine.clientClosed())
        connector.clientClosed(machine.peer.clientID)
        shared.observer.clientConnectionClosed()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if machine.isClosed { return }  // closing or lingering: discarded
        machine.activity(now: now)
        inReadBurst = true
        reader.receive(unwrapInboundIn(data))
        pump()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        inReadBurst = false
        machine.upstream?.flush()
        context.flush()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            machine.upstream?.clientBecameWritable()
            resumeReading()
        }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard !machine.isClosed else { return }
        // The transport failed (a reset, TLS ended without close_notify): nothing can be
        // answered; channelInactive records what was in flight.
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            return run(machine.quiesce())
        }
        if let event = event as? ChannelEvent, event == .inputClosed {
            if machine.isLingering { return context.close(promise: nil) }  // the client is done too
            return run(machine.clientInputClosed(unparsedBytes: reader.holdsUnparsedRequest))
        }
        context.fireUserInboundEventTriggered(event)
    }

    func read(context: ChannelHandlerContext) {
        if wantsRead {
            readPending = false
            machine.readResumed(now: now)
            context.read()
        } else {
            readPending = true
            machine.readHeld(now: now)
        }
    }

    private var wantsRead: Bool {
        machine.wantsRead(clientWritable: context.channel.isWritable, unparsedBytes: reader.holdsUnparsedRequest)
    }

    private func resumeReading() {
        guard readPending, context != nil, wantsRead else { return }
        readPending = false
        machine.readResumed(now: now)
        armEagerDeadline()
        context.read()
    }

    /// Hands parsed parts to the machine while it takes them.
    private func pump() {
        guard !pumping else {
            pumpAgain = true
            return
        }
        pumping = true
        defer { pumping = false }
        repeat {
            pumpAgain = false
            do {
                while machine.acceptsParts, let part = try reader.next() {
                    run(machine.requestPart(part, now: now))
                }
                // Bytes behind an upgrade request are held for the tunnel: a flood is answered
                // (431) at once, not when the app answers the handshake.
                if !machine.isClosed { try reader.checkHeldBytes() }
            } catch {
                run(machine.requestUnreadable(error, now: now))
            }
            // After the client's FIN, a request the reader could not complete never will be.
            run(machine.readerDrained())
            // Parts handed on outside a client read burst: channelReadComplete will not flush
            // them. The flush may fail at once and end the exchange (then: round again).
            if !inReadBurst { machine.upstream?.flush() }
        } while pumpAgain && context != nil && !machine.isClosed
        machine.headPending(reader.holdsUnparsedRequest, now: now)
        noteHeldRead()
        armEagerDeadline()
    }

    /// A read NIO asked for and the gateway held back counts as the gateway's time, not the
    /// body's, from the moment the body's clock runs (it may start after the read was held).
    private func noteHeldRead() {
        if readPending, context != nil, !wantsRead { machine.readHeld(now: now) }
    }

    /// Runs what an answer that came back later (a verdict, an endpoint's response, a
    /// connection) made of the state.
    private func deliver(_ action: Machine.Action) {
        guard context != nil else {
            if case .closeUpstream(let connection) = action { connection.close() }
            if case .discard(let verdict) = action { verdict.discard() }
            if case .drop(let lease) = action { lease.release() }
            return
        }
        run(action)
        resumeReading()
        noteHeldRead()
        armEagerDeadline()
    }

    // MARK: UpstreamConnectionOwner

    var clientIsWritable: Bool { context?.channel.isWritable ?? false }

    func upstreamRead(_ part: ResponseReader.Part) {
        run(machine.upstreamPart(part, now: now))
    }

    func upstreamReadComplete() {
        machine.activity(now: now)  // once per upstream read burst
        context.flush()
    }

    func upstreamClosed(_ error: (any Error)?) {
        deliver(machine.upstreamClosed(error))
    }

    func upstreamWritabilityChanged(isWritable: Bool) {
        if isWritable { resumeReading() }
    }

    // MARK: actions

    private func run(_ action: consuming Machine.Action) {
        // Consumed: the payloads move into the bindings instead of being copied (retained) out.
        switch consume action {
        case .none:
            break
        case .admit(let exchange, let route):
            guard let request = machine.guardRequest(for: exchange) else {
                // Cannot happen (`.admit` follows a parsed head): answered 503, never left hanging.
                return run(machine.verdict(.failure(ChannelError.inappropriateOperationForState), for: exchange, now: now))
            }
            switch route.requestGuard.admit(request, on: context.eventLoop) {
            case .verdict(let verdict):
                run(machine.verdict(.success(verdict), for: exchange, now: now))
            case .pending(let future):
                let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
                future.deliver(on: context.eventLoop, unless: { bound.value.context == nil }) { result in
                    let handler = bound.value
                    handler.deliver(handler.machine.verdict(result, for: exchange, now: handler.now))
                }
            }
        case .answer(let exchange, let body, let respond):
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            respond(body).hop(to: context.eventLoop).whenComplete { result in
                let handler = bound.value
                guard handler.context != nil else { return }
                handler.deliver(handler.machine.answered(result, for: exchange))
            }
        case .connect(let exchange, let route, let principal, let pooled):
            if pooled, let principal, let connection = connector.takeIdle(route.upstream, for: principal) {
                return run(machine.connected(.success(connection), for: exchange, now: now))
            }
            connector.connect(route.upstream, for: principal, limit: route.upstreamMaxConnections, on: context.eventLoop) { result in
                guard self.context != nil else {
                    if case .success(let connection) = result { connection.close() }
                    return
                }
                self.deliver(self.machine.connected(result, for: exchange, now: self.now))
            }
        case .startForwarding(let connection, let head, let method, let chunked, let body):
            connection.owner = self
            connection.writeHead(head, method: method, chunked: chunked)
            for part in body { write(part, to: connection) }
            // Inside a read burst, channelReadComplete flushes once for the whole burst; inside
            // a pump, the pump flushes when the parts it hands on are written.
            if !inReadBurst, !pumping { connection.flush() }
        case .forwardBody(let connection, let bytes):
            connection.writeBody(bytes)
        case .forwardEnd(let connection):
            connection.writeEnd()
        case .write(let bytes):
            context.write(wrapOutboundOut(bytes), promise: nil)
        case .writeBody(let bytes, let chunked):
            if chunked { HTTPWire.writeChunk(bytes, context: context) } else { context.write(wrapOutboundOut(bytes), promise: nil) }
        case .respond(let bytes, let ended, let upstream, let failure, let after):
            upstream?.close()
            if let failure { shared.observer.upstreamFailed(failure, route: ended.log.route?.name ?? "-") }
            context.write(wrapOutboundOut(bytes), promise: nil)
            record(ended, aborted: false)
            then(after)
        case .finish(let ended, let lastChunk, let upstream, let reuse, let after):
            if lastChunk { context.write(wrapOutboundOut(ByteBuffer(staticString: "0\r\n\r\n")), promise: nil) }
            // The upstream's readComplete will not reach us once the connection is back in the
            // pool: flush the response now (one flush per response in the common case).
            context.flush()
            record(ended, aborted: false)
            if reuse { connector.release(upstream) } else { upstream.close() }
            then(after)
        case .abort(let ended, let upstream, let failure):
            // What was written goes out, then the connection closes: the client sees a
            // truncated response, never a complete-looking one.
            if let failure { shared.observer.upstreamFailed(failure, route: ended?.log.route?.name ?? "-") }
            if let ended { record(ended, aborted: true) }
            upstream?.close()
            context.flush()
            context.close(promise: nil)
        case .close(let upstream):
            upstream?.close()
            closeGracefully()
        case .upgrade(let ended, let connection, let head):
            upgrade(ended, connection, head)
        case .closeUpstream(let connection):
            connection.close()
        case .discard(let verdict):
            verdict.discard()
        case .drop(let lease):
            lease.release()
        }
    }

    private func write(_ part: RequestReader.Part, to connection: UpstreamConnection) {
        switch part {
        case .body(let bytes): connection.writeBody(bytes)
        case .end: connection.writeEnd()
        case .head: break
        }
    }

    /// After a complete response: the next (pipelined) request, or a graceful close.
    private func then(_ after: Machine.After) {
        switch after {
        case .nextRequest:
            // A body-less request's `.end` may still follow in this read burst: the machine
            // ignores anything but a head between requests.
            if !inReadBurst { context.flush() }
            pump()
            resumeReading()
        case .close:
            closeGracefully()
        }
    }

    private func record(_ ended: Machine.Ended, aborted: Bool) {
        ended.lease.release()
        shared.observer.exchangeCompleted(ended.log.record(aborted: aborted, client: machine.peer.string, now: now))
    }

    /// Lingering close (RFC 9112 §9.6): what was written goes out, then FIN, then what the client
    /// still sends is read and discarded for a moment. Closing with unread input makes the
    /// kernel answer with a reset, which can destroy the response (a 400, 413 or 504) before the
    /// client has read it.
    private func closeGracefully() {
        let channel = context.channel
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        // A client that never reads would keep the last write, and so the connection, pending
        // forever (the idle timer stops with the machine): closed after the idle timeout. The
        // task is cancelled when the channel closes (else every closed connection would stay
        // in memory for that long).
        let hardClose = context.eventLoop.scheduleTask(in: shared.timeouts.idle) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in hardClose.cancel() }
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(mode: .output).whenComplete { result in
                guard case .success = result else { return channel.close(promise: nil) }
                this.value.linger(channel)
            }
        }
    }

    private func linger(_ channel: any Channel) {
        guard let context else { return channel.close(promise: nil) }
        machine.lingering()
        timer?.cancel()
        timer = nil
        let lingerEnd = context.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in lingerEnd.cancel() }
        context.read()
    }

    /// The app accepted a WebSocket handshake: its 101 goes to the client, then both connections
    /// become a byte tunnel (`Upgrade`).
    private func upgrade(_ ended: Machine.Ended, _ connection: UpstreamConnection, _ head: ByteBuffer) {
        guard let upstreamChannel = connection.channel else {
            return run(.abort(ended, upstream: connection, failure: .resetDuringResponse))
        }
        var buffer = head
        // What the app sent right behind its 101 is the tunnel's already.
        var early = connection.takeTunnelBytes()
        buffer.writeBuffer(&early)
        let clientChannel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        guard let context, clientChannel.isActive else {
            // The client left while the 101 was written (the failed write closed it, and its
            // channelInactive found nothing to close): no tunnel, and the app's side closes.
            connection.close()
            return record(ended, aborted: true)
        }
        // The tunnel takes the lease; the in-flight place is given back now.
        var withoutTunnel = ended
        withoutTunnel.lease.tunnel = nil
        record(withoutTunnel, aborted: false)
        timer?.cancel()
        timer = nil
        Upgrade.splice(client: context, upstream: connection, upstreamChannel: upstreamChannel, clientBytes: reader.takeRemaining(),
                       clientInputClosed: machine.inputClosed, tunnel: ended.lease.tunnel)
    }

    // MARK: the timer

    /// One lazily re-armed timer per connection: deadlines are plain values in the machine, so
    /// a request sets one without scheduling anything; only one earlier than the armed one
    /// (a body's, the upstream's answer) re-arms it.
    private func armTimer(at deadline: NIODeadline) {
        timer?.cancel()
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        timerDeadline = deadline
        timer = context.eventLoop.scheduleTask(deadline: deadline) { this.value.timerFired() }
    }

    private func armEagerDeadline() {
        if let deadline = machine.eagerDeadline, deadline < timerDeadline, !machine.isClosed { armTimer(at: deadline) }
    }

    private func timerFired() {
        guard context != nil, !machine.isClosed else { return }
        timer = nil
        timerDeadline = .distantFuture
        deliver(machine.timerFired(now: now))
        if context != nil, !machine.isClosed { armTimer(at: machine.nextDeadline(now: now)) }
    }
}
