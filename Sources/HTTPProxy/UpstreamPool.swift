import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A route's upstream host name was never resolved (routes must come from `resolved()`).
struct UnresolvedUpstream: Error {
    let host: String
}

/// Where a client connection gets its upstream connections: the pool in production; in the
/// handler's tests, connections on `EmbeddedChannel`s (forwarding, retries, timeouts and
/// pipelining without sockets).
protocol UpstreamConnector: AnyObject {
    /// An idle kept-alive connection, if one is alive.
    func takeIdle(_ address: UpstreamAddress) -> UpstreamConnection?
    /// A new connection, on the caller's event loop.
    func connect(_ address: UpstreamAddress) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    /// A connection back after a complete exchange, to be kept alive or closed.
    func release(_ connection: UpstreamConnection)
}

/// Keep-alive connections to upstreams, one pool per event loop, used only on that loop: a
/// client's request goes upstream on the client's own event loop, without a thread hop.
final class UpstreamPool: UpstreamConnector {
    let eventLoop: any EventLoop
    private var idle: [UpstreamAddress: [UpstreamConnection]] = [:]
    private let maxIdlePerUpstream: Int
    private let connectTimeout: TimeAmount
    private let idleTimeout: TimeAmount
    private let observer: ProxyObserver
    private let logger: Logger
    private var sweep: Scheduled<Void>? = nil

    init(eventLoop: any EventLoop, connectTimeout: TimeAmount, idleTimeout: TimeAmount, maxIdlePerUpstream: Int = 128, observer: ProxyObserver,
         logger: Logger = Logger(label: "sessiongate.upstream")) {
        self.eventLoop = eventLoop
        self.logger = logger
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
        self.maxIdlePerUpstream = maxIdlePerUpstream
        self.observer = observer
    }

    /// An idle pooled connection, if one is alive.
    func takeIdle(_ address: UpstreamAddress) -> UpstreamConnection? {
        while let connection = idle[address]?.popLast() {
            if connection.isActive {
                connection.idleSince = nil
                return connection
            }
        }
        return nil
    }

    /// Opens a new connection on this event loop (the future carries it loop-bound), trying each of the upstream's addresses in
    /// turn (a host name may have IPv6 and IPv4 addresses; the service may listen on one).
    func connect(_ address: UpstreamAddress) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>> {
        guard !address.socketAddresses.isEmpty else {
            // Host names are resolved when routes are built; resolving here would block the loop.
            return eventLoop.makeFailedFuture(UnresolvedUpstream(host: address.host))
        }
        return connect(address, candidates: address.socketAddresses[...])
    }

    private func connect(_ address: UpstreamAddress, candidates: ArraySlice<SocketAddress>) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>> {
        let target = candidates.first!
        let rest = candidates.dropFirst()
        let attempt = connect(address, to: target)
        guard !rest.isEmpty else { return attempt }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        let promise = eventLoop.makePromise(of: NIOLoopBound<UpstreamConnection>.self)
        attempt.whenComplete { result in
            switch result {
            case .success: promise.completeWith(attempt)
            case .failure: promise.completeWith(this.value.connect(address, candidates: rest))
            }
        }
        return promise.futureResult
    }

    private func connect(_ address: UpstreamAddress, to target: SocketAddress) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>> {
        let handler = UpstreamConnection(address: address)
        handler.pool = self
        let bound = NIOLoopBound(handler, eventLoop: eventLoop)
        let observer = self.observer
        let handshake = address.tls.map { _ in NIOLoopBound(UpstreamHandshakeWaiter(promise: eventLoop.makePromise()), eventLoop: eventLoop) }
        let connected = ClientBootstrap(group: eventLoop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelOption(.autoRead, value: true)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let tls = address.tls, let handshake {
                        try sync.addHandler(NIOSSLClientHandler(context: tls.context, serverHostname: tls.serverName))
                        try sync.addHandler(handshake.value)
                    }
                    try sync.addHandler(bound.value)
                }
            }
            .connect(to: target)
            .map { channel in
                observer.upstreamConnectionOpened()
                channel.closeFuture.whenComplete { _ in observer.upstreamConnectionClosed() }
                return channel
            }
        guard let handshake else { return connected.map { _ in bound } }
        // An https upstream is usable once its handshake is done, within the connect timeout.
        let logger = self.logger
        let timeout = connectTimeout
        return connected.flatMap { channel in
            let deadline = channel.eventLoop.scheduleTask(in: timeout) {
                handshake.value.complete(.failure(UpstreamTLSFailure(detail: "no handshake within \(timeout.nanoseconds / 1_000_000) ms")))
                channel.close(promise: nil)
            }
            return handshake.value.finished.always { _ in deadline.cancel() }.map { bound }
        }.flatMapErrorThrowing { error in
            if let failure = error as? UpstreamTLSFailure {
                logger.warning("upstream TLS handshake failed", metadata: ["upstream": "\(address)", "error": "\(failure.detail)"])
            }
            throw error
        }
    }

    /// Returns a connection after a complete exchange.
    func release(_ connection: UpstreamConnection) {
        guard connection.isActive, (idle[connection.address]?.count ?? 0) < maxIdlePerUpstream else {
            connection.close()
            return
        }
        connection.owner = nil
        connection.reused = true
        connection.idleSince = .now()
        idle[connection.address, default: []].append(connection)
        scheduleSweep()
    }

    func remove(_ connection: UpstreamConnection) {
        guard var list = idle[connection.address], let index = list.firstIndex(where: { $0 === connection }) else { return }
        list.remove(at: index)
        idle[connection.address] = list
    }

    /// Closes every idle connection (shutdown).
    func closeAll() {
        let all = idle.values.flatMap { $0 }
        idle.removeAll()
        sweep?.cancel()
        for connection in all { connection.close() }
    }

    private func scheduleSweep() {
        guard sweep == nil else { return }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        sweep = eventLoop.scheduleTask(in: idleTimeout) { this.value.sweepIdle() }
    }

    private func sweepIdle() {
            self.sweep = nil
            let cutoff = NIODeadline.now() - self.idleTimeout
            var anyLeft = false
            for (address, list) in self.idle {
                let (stale, fresh) = list.reduce(into: ([UpstreamConnection](), [UpstreamConnection]())) { acc, c in
                    if let since = c.idleSince, since <= cutoff { acc.0.append(c) } else { acc.1.append(c) }
                }
                self.idle[address] = fresh
                anyLeft = anyLeft || !fresh.isEmpty
                for connection in stale { connection.close() }
            }
            if anyLeft { self.scheduleSweep() }
    }
}
