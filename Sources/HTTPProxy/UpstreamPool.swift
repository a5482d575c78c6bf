import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A route's upstream host name was never resolved (routes must come from `resolved()`).
struct UnresolvedUpstream: Error {
    let host: String
}

/// Whose requests an upstream connection carries over its whole life (`routes[].upstream_reuse`).
/// A connection is opened for one principal and only ever taken again by a request of the same
/// one, so that an app's framing mistake (late bytes, a body it did not read) can reach only the
/// principal who caused it.
enum UpstreamPrincipal: Hashable {
    /// `shared`: any request's.
    case anyone
    /// `principal`, signed in: one user (their `sub`).
    case user(String)
    /// `principal`, anonymous: the one client connection the requests came on (a number no
    /// other client connection of the event loop gets).
    case client(UInt64)
}

/// Where a client connection gets its upstream connections: the pool in production; in the
/// handler's tests, connections on `EmbeddedChannel`s (forwarding, retries, timeouts and
/// pipelining without sockets).
protocol UpstreamConnector: AnyObject {
    /// An idle kept-alive connection to `address` that served `principal`, if one is alive.
    func takeIdle(_ address: UpstreamAddress, for principal: UpstreamPrincipal) -> UpstreamConnection?
    /// A new connection, on the caller's event loop, to serve `principal` (nil: this one request).
    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    /// A connection back after a complete exchange, to be kept alive or closed.
    /// `keeping`: the releasing client's own bound on its principal's idle connections, when it
    /// is above `perPrincipal` (an HTTP/2 connection multiplexes up to its concurrent streams).
    func release(_ connection: UpstreamConnection, keeping: Int)
    /// A number for a new client connection (its anonymous principal).
    func newClient() -> UInt64
    /// The client connection `id` closed: the connections kept for it are closed.
    func clientClosed(_ id: UInt64)
}

extension UpstreamConnector {
    func release(_ connection: UpstreamConnection) { release(connection, keeping: 0) }

    /// A new connection to `address` for `principal`: `done` is called on `loop` when it is up or
    /// failed. (Taking an idle one, `takeIdle`, is the caller's: it needs no callback.)
    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?, on loop: any EventLoop,
                 _ done: @escaping (Result<UpstreamConnection, any Error>) -> Void) {
        let bound = NIOLoopBound(done, eventLoop: loop)
        connect(address, for: principal).whenComplete { result in bound.value(result.map { $0.value }) }
    }
}

/// How many idle connections a pool keeps (README: "Upstream connections and users").
struct UpstreamPoolLimits: Sendable {
    /// Per upstream and principal, `principal` mode: an HTTP/1.1 browser rarely has more than two
    /// requests of one user in flight to one app at once. A client multiplexing its requests
    /// (HTTP/2) asks for more when it releases one (`release(_:keeping:)`), up to its concurrent
    /// streams: with two kept, eight of ten concurrent streams opened and closed a connection
    /// each (12,000 in 5 s under h2load -m10). `total` still bounds them all.
    var perPrincipal = 2
    /// Per upstream, `shared` mode.
    var perSharedUpstream = 128
    /// Per event loop, all upstreams and principals: beyond it the least recently used closes,
    /// so an app sees at most this many idle connections per core however many users come.
    var total = 256
}

/// Keep-alive connections to upstreams, one pool per event loop, used only on that loop: a
/// client's request goes upstream on the client's own event loop, without a thread hop. Idle
/// connections are kept per upstream and principal, bounded per principal and in total (least
/// recently used first out), and closed after the idle timeout.
final class UpstreamPool: UpstreamConnector {
    struct Key: Hashable {
        let address: UpstreamAddress
        let principal: UpstreamPrincipal
    }

    let eventLoop: any EventLoop
    private var idle: [Key: [UpstreamConnection]] = [:]
    /// Idle connections in the order they were released (oldest first), with the stamp they got
    /// then; an entry whose connection was taken since (its stamp changed) is skipped.
    private var released = CircularBuffer<(connection: UpstreamConnection, stamp: UInt64)>()
    private var stamps: UInt64 = 0
    private(set) var idleCount = 0
    /// The keys holding connections of each anonymous client connection.
    private var clientKeys: [UInt64: Set<Key>] = [:]
    private var clients: UInt64 = 0
    private let limits: UpstreamPoolLimits
    private let connectTimeout: TimeAmount
    private let idleTimeout: TimeAmount
    private let observer: ProxyObserver
    private let logger: Logger
    private var sweep: Scheduled<Void>? = nil

    init(eventLoop: any EventLoop, connectTimeout: TimeAmount, idleTimeout: TimeAmount, limits: UpstreamPoolLimits = .init(), observer: ProxyObserver,
         logger: Logger = Logger(label: "sessiongate.upstream")) {
        self.eventLoop = eventLoop
        self.logger = logger
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
        self.limits = limits
        self.observer = observer
    }

    func newClient() -> UInt64 {
        clients &+= 1
        return clients
    }

    /// An idle pooled connection of `principal`, if one is alive.
    func takeIdle(_ address: UpstreamAddress, for principal: UpstreamPrincipal) -> UpstreamConnection? {
        // An emptied list stays (with its storage) for the principal's next release: a user's
        // requests take and give back the same connection, and removing and re-adding the entry
        // each time cost an allocation and two more hashes per request. The sweep drops lists
        // that stay empty.
        let key = Key(address: address, principal: principal)
        while let connection = idle[key]?.popLast() {
            idleCount -= 1
            connection.idleSince = nil
            if connection.isActive { return connection }
        }
        return nil
    }

    /// Opens a new connection on this event loop (the future carries it loop-bound), trying each of the upstream's addresses in
    /// turn (a host name may have IPv6 and IPv4 addresses; the service may listen on one).
    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>> {
        guard !address.socketAddresses.isEmpty else {
            // Host names are resolved when routes are built; resolving here would block the loop.
            return eventLoop.makeFailedFuture(UnresolvedUpstream(host: address.host))
        }
        return connect(address, principal, candidates: address.socketAddresses[...])
    }

    private func connect(_ address: UpstreamAddress, _ principal: UpstreamPrincipal?, candidates: ArraySlice<SocketAddress>)
        -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    {
        let target = candidates.first!
        let rest = candidates.dropFirst()
        let attempt = connect(address, principal, to: target)
        guard !rest.isEmpty else { return attempt }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        let promise = eventLoop.makePromise(of: NIOLoopBound<UpstreamConnection>.self)
        attempt.whenComplete { result in
            switch result {
            case .success: promise.completeWith(attempt)
            case .failure: promise.completeWith(this.value.connect(address, principal, candidates: rest))
            }
        }
        return promise.futureResult
    }

    private func connect(_ address: UpstreamAddress, _ principal: UpstreamPrincipal?, to target: SocketAddress)
        -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    {
        let handler = UpstreamConnection(address: address, principal: principal)
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

    /// Returns a connection after a complete exchange: kept for its principal while it may serve
    /// another request and there is room, otherwise closed.
    func release(_ connection: UpstreamConnection, keeping: Int) {
        guard connection.isActive, connection.reusable, let principal = connection.principal else {
            connection.close()
            return
        }
        let key = Key(address: connection.address, principal: principal)
        let cap = principal == .anyone ? limits.perSharedUpstream : max(limits.perPrincipal, keeping)
        let kept = idle[key]?.count
        guard (kept ?? 0) < cap else {
            connection.close()
            return
        }
        connection.owner = nil
        connection.reused = true
        connection.idleSince = .now()
        stamps &+= 1
        connection.idleStamp = stamps
        if kept == nil, case .client(let id) = principal { clientKeys[id, default: []].insert(key) }
        idle[key, default: []].append(connection)
        idleCount += 1
        released.append((connection, stamps))
        while idleCount > limits.total, let oldest = released.popFirst() {
            guard oldest.connection.idleStamp == oldest.stamp, oldest.connection.idleSince != nil else { continue }
            remove(oldest.connection)
            oldest.connection.close()
        }
        // Entries of connections taken since accumulate; drop them once they outnumber the rest.
        if released.count > 2 * limits.total + 64 {
            released = CircularBuffer(released.filter { $0.connection.idleStamp == $0.stamp && $0.connection.idleSince != nil })
        }
        scheduleSweep()
    }

    /// An idle connection closed (or is being evicted): it leaves the pool.
    func remove(_ connection: UpstreamConnection) {
        guard connection.idleSince != nil, let principal = connection.principal else { return }
        let key = Key(address: connection.address, principal: principal)
        guard let index = idle[key]?.firstIndex(where: { $0 === connection }) else { return }
        idle[key]?.remove(at: index)
        idleCount -= 1
        connection.idleSince = nil
    }

    func clientClosed(_ id: UInt64) {
        guard let keys = clientKeys.removeValue(forKey: id) else { return }
        for key in keys {
            for connection in idle.removeValue(forKey: key) ?? [] {
                idleCount -= 1
                connection.idleSince = nil
                connection.close()
            }
        }
    }

    private func forgetKey(_ key: Key) {
        idle.removeValue(forKey: key)
        if case .client(let id) = key.principal {
            clientKeys[id]?.remove(key)
            if clientKeys[id]?.isEmpty == true { clientKeys.removeValue(forKey: id) }
        }
    }

    /// Closes every idle connection (shutdown).
    func closeAll() {
        let all = idle.values.flatMap { $0 }
        idle.removeAll()
        clientKeys.removeAll()
        released.removeAll()
        idleCount = 0
        sweep?.cancel()
        for connection in all {
            connection.idleSince = nil
            connection.close()
        }
    }

    private func scheduleSweep() {
        guard sweep == nil else { return }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        sweep = eventLoop.scheduleTask(in: idleTimeout) { this.value.sweepIdle() }
    }

    private func sweepIdle() {
        sweep = nil
        let cutoff = NIODeadline.now() - idleTimeout
        var stale: [UpstreamConnection] = []
        for list in idle.values {
            for connection in list {
                if let since = connection.idleSince, since <= cutoff { stale.append(connection) }
            }
        }
        for connection in stale {
            remove(connection)
            connection.close()
        }
        for (key, list) in idle where list.isEmpty { forgetKey(key) }
        if !idle.isEmpty { scheduleSweep() }
    }
}
