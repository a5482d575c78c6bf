import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A Redis client on SwiftNIO: one pipelined connection per event loop, used from that loop
/// (no thread hop for callers already on it), AUTH and SELECT from the URL on every connect, a
/// timeout per command, and reconnection with exponential backoff — while disconnected, calls
/// fail at once with `.unavailable` so callers answer 503 without waiting.
public final class RedisClient: Sendable {
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        public var username: String?
        public var password: String?
        public var database: Int
        /// Per command (`store.timeout`).
        public var commandTimeout: TimeAmount
        public var connectTimeout: TimeAmount
        /// Backoff after a failed connection: doubles from `minimumBackoff` up to `maximumBackoff`.
        public var minimumBackoff: TimeAmount
        public var maximumBackoff: TimeAmount
        /// TLS (`rediss://`); nil: plain TCP.
        public var tls: RedisTLS? = nil
        /// Ask these sentinels for the master instead of dialling `host:port`.
        public var sentinel: RedisSentinelConfiguration? = nil
        /// What `host` stands for at each connect; nil: the system's resolver (tests move a name).
        public var resolver: RedisNameResolver? = nil

        public init(host: String, port: Int = 6379, username: String? = nil, password: String? = nil, database: Int = 0,
                    commandTimeout: TimeAmount = .milliseconds(250), connectTimeout: TimeAmount = .seconds(1),
                    minimumBackoff: TimeAmount = .milliseconds(50), maximumBackoff: TimeAmount = .seconds(5)) {
            self.host = host
            self.port = port
            self.username = username
            self.password = password
            self.database = database
            self.commandTimeout = commandTimeout
            self.connectTimeout = connectTimeout
            self.minimumBackoff = minimumBackoff
            self.maximumBackoff = maximumBackoff
        }

        /// The AUTH command for this configuration (nil without a password).
        var authCommand: [RedisArgument]? {
            guard let password else { return nil }
            return username.map { ["AUTH", .string($0), .string(password)] } ?? ["AUTH", .string(password)]
        }
    }

    let configuration: Configuration
    private let group: any EventLoopGroup
    private let connections: [ObjectIdentifier: NIOLoopBoundBox<LoopConnection>]
    private let recovered: RecoveryBroadcast
    private let logger: Logger

    /// Checks that the host (or the sentinels' hosts) resolves, here (blocking: not on an event
    /// loop); every connect resolves it again.
    public init(configuration: Configuration, group: MultiThreadedEventLoopGroup, logger: Logger) throws {
        self.configuration = configuration
        self.group = group
        self.logger = logger
        let dialer = try RedisDialer(configuration: configuration)
        var connections: [ObjectIdentifier: NIOLoopBoundBox<LoopConnection>] = [:]
        let recovered = RecoveryBroadcast()
        for loop in group.makeIterator() {
            connections[ObjectIdentifier(loop)] = NIOLoopBoundBox.makeBoxSendingValue(
                LoopConnection(loop: loop, dialer: dialer, configuration: configuration, logger: logger, recovered: recovered), eventLoop: loop)
        }
        self.connections = connections
        recovered.connections.withLockedValue { $0 = Array(connections.values) }
        self.recovered = recovered
    }

    /// Closes every connection and dials again at once, without backoff (the sentinels
    /// announced a new master) — except a connection already to `master` (`host:port`, as the
    /// sentinels name it): one that found the new master by itself keeps serving.
    public func reconnect(unlessConnectedTo master: String? = nil) {
        reconnect(unlessConnectedToAnyOf: master.map { [$0] })
    }

    /// The same, keeping a connection to any of `addresses` (`ip:port`; nil: none is kept). A
    /// dial under way is checked once it connects.
    func reconnect(unlessConnectedToAnyOf addresses: Set<String>?) {
        for (_, box) in connections {
            box.eventLoop.execute { box.value.reconnect(unlessConnectedToAnyOf: addresses) }
        }
    }

    /// Resolves the configured host again (off the event loops) and closes each connection that
    /// is to none of its addresses, to dial again at once: a name moved with no failover to
    /// force a reconnect (a reload asks). Answers the addresses (`ip:port`).
    public func followName() async throws -> Set<String> {
        let target = configuration.resolver?(RedisAddress(host: configuration.host, port: configuration.port))
            ?? RedisAddress(host: configuration.host, port: configuration.port)
        let addresses = try await NIOThreadPool.singleton.runIfActive { try RedisDialer.resolveAll(target) }
        reconnect(unlessConnectedToAnyOf: addresses)
        return addresses
    }

    /// Sends a command on `eventLoop`'s connection (default: the current loop, else any).
    public func send(_ arguments: [RedisArgument], on eventLoop: (any EventLoop)? = nil) -> EventLoopFuture<RESPValue> {
        let loop = eventLoop ?? (MultiThreadedEventLoopGroup.currentEventLoop.flatMap { connections[ObjectIdentifier($0)] != nil ? $0 : nil } ?? group.next())
        guard let box = connections[ObjectIdentifier(loop)] else { return loop.makeFailedFuture(RedisError.unavailable) }
        if loop.inEventLoop { return box.value.send(arguments) }
        return loop.flatSubmit { box.value.send(arguments) }
    }

    /// Sends commands back to back on one connection, nothing else between them (a MULTI/EXEC
    /// block stays one block even when callers on other threads send concurrently); the replies
    /// in order. Fails if any command fails.
    public func sendAll(_ commands: [[RedisArgument]], on eventLoop: (any EventLoop)? = nil) -> EventLoopFuture<[RESPValue]> {
        let loop = eventLoop ?? (MultiThreadedEventLoopGroup.currentEventLoop.flatMap { connections[ObjectIdentifier($0)] != nil ? $0 : nil } ?? group.next())
        guard let box = connections[ObjectIdentifier(loop)] else { return loop.makeFailedFuture(RedisError.unavailable) }
        if loop.inEventLoop { return box.value.sendAll(commands) }
        return loop.flatSubmit { box.value.sendAll(commands) }
    }

    /// Closes every connection.
    public func close() async {
        recovered.connections.withLockedValue { $0 = [] }
        for (_, box) in connections {
            try? await box.eventLoop.flatSubmit { box.value.close() }.get()
        }
    }
}

/// Tells every loop's connection that Redis answers (again): one loop connected, so the others
/// that are backing off after a failure dial at their next command instead of waiting out their backoff (during which they answer
/// `.unavailable`, and a request on that loop 503, though Redis is back).
final class RecoveryBroadcast: Sendable {
    /// Set in `RedisClient.init`, emptied by `close()` (the connections hold this: a cycle until then).
    let connections = NIOLockedValueBox<[NIOLoopBoundBox<LoopConnection>]>([])

    func recovered(on loop: any EventLoop) {
        for box in connections.withLockedValue({ $0 }) where box.eventLoop !== loop {
            box.eventLoop.execute { box.value.retryNow() }
        }
    }
}

/// The connection of one event loop, and its connect/backoff state. Used only on that loop.
final class LoopConnection {
    private enum State {
        case idle
        case connecting(EventLoopFuture<NIOLoopBound<RedisConnectionHandler>>)
        case connected(any Channel, RedisConnectionHandler)
        case closed
    }

    private let loop: any EventLoop
    private let dialer: RedisDialer
    private let configuration: RedisClient.Configuration
    private let logger: Logger
    private var state: State = .idle
    private var backoff: TimeAmount
    private var retryAt: NIODeadline = .uptimeNanoseconds(0)
    /// The connection is being closed by `reconnect`.
    private var reconnecting = false
    /// A `reconnect` came while dialling: the connection made is kept only if it is to one of these.
    private var recheck: Set<String>? = nil
    private let recovered: RecoveryBroadcast

    init(loop: any EventLoop, dialer: RedisDialer, configuration: RedisClient.Configuration, logger: Logger, recovered: RecoveryBroadcast) {
        self.loop = loop
        self.dialer = dialer
        self.configuration = configuration
        self.logger = logger
        self.recovered = recovered
        self.backoff = configuration.minimumBackoff
    }

    /// Another loop reached Redis after a failure: dial at the next command, not after the backoff.
    func retryNow() {
        guard case .idle = state else { return }
        backoff = configuration.minimumBackoff
        retryAt = .uptimeNanoseconds(0)
    }

    func send(_ arguments: [RedisArgument]) -> EventLoopFuture<RESPValue> {
        switch state {
        case .connected(_, let handler):
            return write(arguments, to: handler)
        case .connecting(let future):
            let this = NIOLoopBound(self, eventLoop: loop)
            return future.flatMap { handler in this.value.write(arguments, to: handler.value) }
        case .idle:
            guard NIODeadline.now() >= retryAt else { return loop.makeFailedFuture(RedisError.unavailable) }
            let future = connect()
            state = .connecting(future)
            let this = NIOLoopBound(self, eventLoop: loop)
            return future.flatMap { handler in this.value.write(arguments, to: handler.value) }
        case .closed:
            return loop.makeFailedFuture(RedisError.unavailable)
        }
    }

    func sendAll(_ commands: [[RedisArgument]]) -> EventLoopFuture<[RESPValue]> {
        let this = NIOLoopBound(self, eventLoop: loop)
        let loop = self.loop
        @Sendable func writeAll(_ handler: RedisConnectionHandler) -> EventLoopFuture<[RESPValue]> {
            let replies = commands.map { this.value.write($0, to: handler, flush: false) }
            handler.flush()
            return EventLoopFuture.whenAllSucceed(replies, on: loop)
        }
        switch state {
        case .connected(_, let handler):
            return writeAll(handler)
        case .connecting(let future):
            return future.flatMap { writeAll($0.value) }
        case .idle:
            guard NIODeadline.now() >= retryAt else { return loop.makeFailedFuture(RedisError.unavailable) }
            let future = connect()
            state = .connecting(future)
            return future.flatMap { writeAll($0.value) }
        case .closed:
            return loop.makeFailedFuture(RedisError.unavailable)
        }
    }

    private func write(_ arguments: [RedisArgument], to handler: RedisConnectionHandler, flush: Bool = true) -> EventLoopFuture<RESPValue> {
        handler.send(arguments, timeout: configuration.commandTimeout, on: loop, flush: flush)
    }

    /// Connects (asking the sentinels where, if configured), authenticates and selects the
    /// database; the connection is usable when done.
    private func connect() -> EventLoopFuture<NIOLoopBound<RedisConnectionHandler>> {
        let handler = RedisConnectionHandler()
        let boundHandler = NIOLoopBound(handler, eventLoop: loop)
        let this = NIOLoopBound(self, eventLoop: loop)
        let configuration = self.configuration
        return dialer.dial(on: loop, handler: handler).map { channel -> NIOLoopBound<RedisConnectionHandler> in
            let connection = this.value
            connection.state = .connected(channel, boundHandler.value)
            connection.backoff = configuration.minimumBackoff
            connection.recovered.recovered(on: connection.loop)
            channel.closeFuture.whenComplete { _ in this.value.connectionClosed() }
            if let addresses = connection.recheck {
                connection.recheck = nil
                connection.close(channel, unlessConnectedToAnyOf: addresses)
            }
            return boundHandler
        }.flatMapErrorThrowing { error in
            this.value.connectFailed(error)
            throw (error as? RedisError) ?? RedisError.unavailable
        }
    }

    private func connectFailed(_ error: any Error) {
        if case .closed = state { return }
        state = .idle
        retryAt = .now() + backoff
        logger.warning("redis connection failed", metadata: [
            "redis": "\(dialer.label)", "error": "\(error)", "retry_in_ms": .stringConvertible(backoff.nanoseconds / 1_000_000),
        ])
        backoff = min(backoff * 2, configuration.maximumBackoff)
    }

    private func connectionClosed() {
        if case .closed = state { return }
        state = .idle
        // Closed on purpose to follow a new master: dial again at once, not after a backoff.
        retryAt = reconnecting ? .uptimeNanoseconds(0) : .now() + configuration.minimumBackoff
        reconnecting = false
    }

    func reconnect(unlessConnectedToAnyOf addresses: Set<String>?) {
        backoff = configuration.minimumBackoff
        retryAt = .uptimeNanoseconds(0)
        switch state {
        case .connecting:
            if let addresses { recheck = addresses }
        case .connected(let channel, _):
            close(channel, unlessConnectedToAnyOf: addresses)
        case .idle, .closed:
            break
        }
    }

    private func close(_ channel: any Channel, unlessConnectedToAnyOf addresses: Set<String>?) {
        if let addresses, let peer = channel.redisPeer, addresses.contains(peer) { return }
        reconnecting = true
        channel.close(promise: nil)
    }

    func close() -> EventLoopFuture<Void> {
        let previous = state
        state = .closed
        if case .connected(let channel, _) = previous { return channel.close().recover { _ in } }
        return loop.makeSucceededVoidFuture()
    }
}
