import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A Redis pub/sub subscription on its own connection. It reconnects with backoff after any
/// loss, subscribes again, and calls `onConnected` after every (re)subscription — the moment a
/// local cache must be flushed, since messages may have been missed while disconnected.
public final class RedisSubscriber: Sendable {
    public typealias MessageHandler = @Sendable (_ channel: String, _ payload: [UInt8]) -> Void

    private let state: NIOLoopBoundBox<SubscriberState>
    private let eventLoop: any EventLoop

    /// - Parameters:
    ///   - onMessage: called on the subscriber's event loop for every message.
    ///   - onConnected: called once all channels are subscribed, after every (re)connect.
    public convenience init(configuration: RedisClient.Configuration, channels: [String], eventLoop: any EventLoop, logger: Logger,
                            onMessage: @escaping MessageHandler, onConnected: @escaping @Sendable () -> Void) throws {
        self.init(dialer: try RedisDialer(configuration: configuration), configuration: configuration, channels: channels, eventLoop: eventLoop,
                  logger: logger, onMessage: onMessage, onConnected: onConnected)
    }

    /// Subscribed on any of `nodes` (a Redis Cluster's: classic pub/sub reaches every node),
    /// the next one after a loss.
    public convenience init(configuration: RedisClient.Configuration, anyOf nodes: [RedisAddress], channels: [String], eventLoop: any EventLoop,
                            logger: Logger, onMessage: @escaping MessageHandler, onConnected: @escaping @Sendable () -> Void) throws {
        var setup: [[RedisArgument]] = []
        if let auth = configuration.authCommand { setup.append(auth) }
        let dialer = RedisDialer(target: .anyOf(try Rotation(nodes)), tls: configuration.tls, connectTimeout: configuration.connectTimeout,
                                 commandTimeout: configuration.commandTimeout, setup: setup)
        self.init(dialer: dialer, configuration: configuration, channels: channels, eventLoop: eventLoop, logger: logger,
                  onMessage: onMessage, onConnected: onConnected)
    }

    init(dialer: RedisDialer, configuration: RedisClient.Configuration, channels: [String], eventLoop: any EventLoop, logger: Logger,
         onMessage: @escaping MessageHandler, onConnected: @escaping @Sendable () -> Void) {
        self.eventLoop = eventLoop
        self.state = NIOLoopBoundBox.makeBoxSendingValue(
            SubscriberState(loop: eventLoop, dialer: dialer, configuration: configuration, channels: channels, logger: logger,
                            onMessage: onMessage, onConnected: onConnected),
            eventLoop: eventLoop)
    }

    /// Drops the connection and subscribes again at once, without backoff (the sentinels
    /// announced a new master).
    /// Closes the subscription and subscribes again at once — unless it is to one of
    /// `addresses` (`ip:port`: the name still resolves to the server it listens on). A dial under
    /// way is checked once it connects.
    public func reconnect(unlessConnectedToAnyOf addresses: Set<String>? = nil) {
        let state = self.state
        eventLoop.execute { state.value.reconnectNow(unlessConnectedToAnyOf: addresses) }
    }

    public func start() {
        let state = self.state
        eventLoop.execute { state.value.connect() }
    }

    public func stop() async {
        let state = self.state
        try? await eventLoop.flatSubmit { state.value.stop() }.get()
    }
}

final class SubscriberState {
    private let loop: any EventLoop
    private let dialer: RedisDialer
    private let configuration: RedisClient.Configuration
    private let channels: [String]
    private let logger: Logger
    private let onMessage: RedisSubscriber.MessageHandler
    private let onConnected: @Sendable () -> Void
    private var channel: (any Channel)?
    private var stopped = false
    private var backoff: TimeAmount
    private var confirmed = 0

    init(loop: any EventLoop, dialer: RedisDialer, configuration: RedisClient.Configuration, channels: [String], logger: Logger,
         onMessage: @escaping RedisSubscriber.MessageHandler, onConnected: @escaping @Sendable () -> Void) {
        self.loop = loop
        self.dialer = dialer
        self.configuration = configuration
        self.channels = channels
        self.logger = logger
        self.onMessage = onMessage
        self.onConnected = onConnected
        self.backoff = configuration.minimumBackoff
    }

    /// Why the last attempt failed, for the log line of the retry.
    private var lastError: (any Error)? = nil

    private var pendingRetry: Scheduled<Void>? = nil
    private var connecting = false
    /// A `reconnect` came while dialling: the subscription made is kept only if it is to one of these.
    private var recheck: Set<String>? = nil

    func connect() {
        guard !stopped, !connecting else { return }
        connecting = true
        pendingRetry = nil
        let handler = RedisConnectionHandler()
        let bound = NIOLoopBound(handler, eventLoop: loop)
        let this = NIOLoopBound(self, eventLoop: loop)
        // AUTH (and, behind sentinels, ROLE) are ordinary commands, run by the dialer; the
        // connection becomes a subscriber after them.
        dialer.dial(on: loop, handler: handler).whenComplete { result in
            let state = this.value
            state.connecting = false
            switch result {
            case .failure(let error):
                state.lastError = error
                state.retry()
            case .success(let channel):
                guard !state.stopped else { channel.close(promise: nil); return }
                state.channel = channel
                channel.closeFuture.whenComplete { _ in this.value.retry() }
                if let addresses = state.recheck {
                    state.recheck = nil
                    if channel.redisPeer.map({ !addresses.contains($0) }) ?? true {
                        state.backoff = state.configuration.minimumBackoff
                        channel.close(promise: nil)
                        return
                    }
                }
                state.startSubscription(bound.value)
            }
        }
    }

    func reconnectNow(unlessConnectedToAnyOf addresses: Set<String>?) {
        if connecting {
            if let addresses { recheck = addresses }
            return
        }
        if let addresses, let peer = channel?.redisPeer, addresses.contains(peer) { return }
        backoff = configuration.minimumBackoff
        if let channel {
            channel.close(promise: nil)
        } else if let pending = pendingRetry {
            pending.cancel()
            connect()
        }
    }

    private func startSubscription(_ handler: RedisConnectionHandler) {
        let this = NIOLoopBound(self, eventLoop: loop)
        confirmed = 0
        handler.onPush = { reply in this.value.push(reply) }
        var buffer = ByteBufferAllocator().buffer(capacity: 64)
        RESPCodec.encode(["SUBSCRIBE"] + channels.map { RedisArgument($0) }, into: &buffer)
        handler.write(buffer, nil)
        handler.flush()
    }

    private func push(_ reply: RESPValue) {
        guard case .array(let parts?) = reply, let kind = parts.first?.string else { return }
        switch kind {
        case "subscribe":
            confirmed += 1
            if confirmed == channels.count {
                backoff = configuration.minimumBackoff
                onConnected()
            }
        case "message":
            guard parts.count == 3, let name = parts[1].string, let payload = parts[2].bytes else { return }
            onMessage(name, payload)
        default:
            break
        }
    }

    private func retry() {
        channel = nil
        guard !stopped else { return }
        let delay = backoff
        backoff = min(backoff * 2, configuration.maximumBackoff)
        let cause = lastError.map { "\($0)" } ?? "connection closed"
        lastError = nil
        logger.warning("redis subscription lost; reconnecting", metadata: [
            "redis": "\(dialer.label)", "error": "\(cause)", "retry_in_ms": .stringConvertible(delay.nanoseconds / 1_000_000),
        ])
        let this = NIOLoopBound(self, eventLoop: loop)
        pendingRetry = loop.scheduleTask(in: delay) { this.value.connect() }
    }

    func stop() -> EventLoopFuture<Void> {
        stopped = true
        return channel?.close().recover { _ in } ?? loop.makeSucceededVoidFuture()
    }
}
