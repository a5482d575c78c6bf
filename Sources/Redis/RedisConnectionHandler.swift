import NIOCore
import NIOSSL

/// One outstanding command; completed once, by its reply, its deadline or the connection's end.
final class PendingCommand {
    let promise: EventLoopPromise<RESPValue>
    /// nil: no deadline (a subscriber's commands are answered by pushes).
    let deadline: NIODeadline?
    private(set) var done = false

    init(promise: EventLoopPromise<RESPValue>, deadline: NIODeadline?) {
        self.promise = promise
        self.deadline = deadline
    }

    func complete(_ result: Result<RESPValue, RedisError>) {
        guard !done else { return }
        done = true
        promise.completeWith(result.mapError { $0 as any Error })
    }
}

/// Moves RESP between a channel and its commands: commands are written as they come
/// (pipelining) and replies complete them in order. With `onPush`, the connection is a
/// subscriber and every reply is a pushed message instead.
///
/// Deadlines: one timer per connection, not one per command. It is armed for the earliest
/// deadline when a command arrives and none is armed; when it fires it fails the commands whose
/// deadline has passed (they keep their place, so that a late reply still finds its command)
/// and re-arms for the earliest left. A healthy connection's timer fires about once per
/// command timeout and finds nothing due.
final class RedisConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var reader = RESPReader()
    /// Bytes of a reply not yet whole (nil between replies: a read buffer is then read in place).
    private(set) var unread: ByteBuffer?
    /// Redis sent what is not RESP (the error every command gets from now on): the connection
    /// is closing. Until it is closed (TLS sends close_notify first and may read on), no byte
    /// is read and no command written: a late reply must never complete a command it does not
    /// belong to.
    private var broken: RedisError? = nil
    private var pending = CircularBuffer<PendingCommand>()
    private var context: ChannelHandlerContext?
    private var timer: Scheduled<Void>?
    var onPush: ((RESPValue) -> Void)?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    /// The context holds this handler: dropped here, or both outlive the connection.
    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        timer?.cancel()
        timer = nil
    }

    /// Writes one command; its reply completes `command`. Flushing is the caller's.
    func write(_ bytes: ByteBuffer, _ command: PendingCommand?) {
        guard let context, context.channel.isActive, broken == nil else {
            command?.complete(.failure(broken ?? .unavailable))
            return
        }
        if let command {
            pending.append(command)
            if timer == nil, let deadline = command.deadline { arm(deadline, on: context.eventLoop) }
        }
        context.write(wrapOutboundOut(bytes), promise: nil)
    }

    private func arm(_ deadline: NIODeadline, on loop: any EventLoop) {
        let this = NIOLoopBound(self, eventLoop: loop)
        timer = loop.scheduleTask(deadline: deadline) { this.value.deadlinePassed(on: loop) }
    }

    private func deadlinePassed(on loop: any EventLoop) {
        timer = nil
        let now = NIODeadline.now()
        var next: NIODeadline? = nil
        for command in pending where !command.done {
            guard let deadline = command.deadline else { continue }
            if deadline <= now {
                command.complete(.failure(.timeout))
            } else if next.map({ deadline < $0 }) ?? true {
                next = deadline
            }
        }
        if let next { arm(next, on: loop) }
    }

    func flush() { context?.flush() }

    /// Encodes and writes one command, due within `timeout`; the reply completes the future.
    func send(_ arguments: [RedisArgument], timeout: TimeAmount, on loop: any EventLoop, flush: Bool = true) -> EventLoopFuture<RESPValue> {
        var buffer = ByteBufferAllocator().buffer(capacity: 64)
        RESPCodec.encode(arguments, into: &buffer)
        let command = PendingCommand(promise: loop.makePromise(), deadline: .now() + timeout)
        write(buffer, command)
        if flush { self.flush() }
        return command.promise.futureResult
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard broken == nil else { return }
        var bytes = unwrapInboundIn(data)
        if var held = unread {
            unread = nil
            held.writeBuffer(&bytes)
            bytes = held
        }
        do {
            while let reply = try reader.read(from: &bytes) { deliver(reply, context: context) }
        } catch {
            let failure = error as? RedisError ?? .protocolError("\(error)")
            broken = failure
            failAll(failure)
            context.close(promise: nil)
            return
        }
        guard bytes.readableBytes > 0 else { return }
        // The rest of a reply: a slice, so that the next read's bytes are appended to these
        // alone; copied when it is a small part of a large buffer, which it would keep.
        if bytes.capacity > 65_536 && bytes.readableBytes < bytes.capacity / 4 {
            var rest = context.channel.allocator.buffer(capacity: bytes.readableBytes)
            rest.writeImmutableBuffer(bytes)
            unread = rest
        } else {
            unread = bytes.slice()
        }
    }

    private func deliver(_ reply: RESPValue, context: ChannelHandlerContext) {
        if let onPush {
            onPush(reply)
            return
        }
        guard let command = pending.popFirst() else { return }
        if case .error(let message) = reply {
            let error = RedisErrorReply(message)
            command.complete(.failure(.server(error)))
            // A master demoted to replica (a failover while connected): dial again, which
            // finds the new master.
            if error.kind == .readOnly { context.close(promise: nil) }
        } else {
            command.complete(.success(reply))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        failAll(.unavailable)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // NIOSSLExtraError: a certificate that does not name the host, and the like.
        if error is NIOSSLError || error is BoringSSLError || error is NIOSSLExtraError {
            failAll(.tls("\(error)"))
        } else {
            failAll(.unavailable)
        }
        context.close(promise: nil)
    }

    private func failAll(_ error: RedisError) {
        while let command = pending.popFirst() { command.complete(.failure(error)) }
    }
}
