import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

#if canImport(Glibc)
import Glibc
#endif

/// A route's upstream host name was never resolved (routes must come from `resolved()`).
struct UnresolvedUpstream: Error {
    let host: String
}

/// Every connection of the upstream's budget (`routes[].upstream_max_connections`) stayed in
/// use for `server.timeouts.upstream_connect`: 503 with `Retry-After`.
struct UpstreamBusy: Error {}

/// Whose requests an upstream connection carries over its whole life (`routes[].upstream_reuse`).
/// A connection is opened for one principal and only ever taken again by a request of the same
/// one, so that an app's framing mistake (late bytes, a body it did not read) can reach only the
/// principal who caused it.
enum UpstreamPrincipal: Hashable {
    /// `shared`: any request's.
    case anyone
    /// `echo`: any request's whose response must echo its `X-Request-Id` (a response that does
    /// not is refused and the connection closed). Never mixed with `shared` connections, whose
    /// late bytes nothing checks.
    case echoing
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
    /// A connection, on `loop` (the caller's), to serve `principal` (nil: this one request):
    /// `done` is called on `loop` once it is up, or failed. At most `limit` connections to
    /// `address` are open per instance (0: no bound); over it the request waits for one.
    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?, limit: Int, on loop: any EventLoop,
                 _ done: @escaping (Result<UpstreamConnection, any Error>) -> Void)
    /// A connection back after a complete exchange, to be kept alive or closed.
    func release(_ connection: UpstreamConnection)
    /// A number for a new client connection (its anonymous principal).
    func newClient() -> UInt64
    /// The client connection `id` closed: the connections kept for it are closed.
    func clientClosed(_ id: UInt64)
}

/// How many connections a pool keeps (README: "Upstream connections and users"). A pool is one
/// event loop's: the instance's budgets are split evenly across its loops.
struct UpstreamPoolLimits: Sendable {
    /// All upstreams and principals: idle connections beyond it close, least recently used
    /// first, so an app sees at most this many idle connections per core however many users come.
    var idleTotal = 256
    /// The event loops the instance's budgets are split across.
    var loops = 1

    /// This loop's share of an instance-wide budget (0: none).
    func share(_ perInstance: Int) -> Int { perInstance <= 0 ? 0 : max(1, (perInstance + loops - 1) / loops) }
}

/// Keep-alive connections to upstreams, one pool per event loop, used only on that loop: a
/// client's request goes upstream on the client's own event loop, without a thread hop.
///
/// Per upstream it counts the connections open (connecting, in use, idle) against the route's
/// budget: a request over it takes the place of the least recently used idle connection, or
/// waits (FIFO, within the connect timeout) for one to be released or closed. Per principal it
/// keeps idle as many connections as the principal had in flight at once lately (the peak of
/// this idle-timeout window and the last one): a browser's six connections keep six, an API
/// client's fifty keep fifty, and a user gone quiet keeps none for long. Connections the pool
/// closes end with a reset (`SO_LINGER` 0): an idle one holds nothing in flight, so neither side
/// is left with a `TIME_WAIT` socket per eviction.
final class UpstreamPool: UpstreamConnector {
    /// One principal's connections to one upstream. A class: a request's take and give-back
    /// read the entry from the dictionary and change it in place (a struct value there is
    /// changed through the dictionary's `_modify` accessor, which heap-allocates its coroutine
    /// frame: four allocations a request).
    final class Principal {
        var idle: [UpstreamConnection] = []
        var inUse = 0
        /// The most in use at once in this window, and in the last one (`sweepIdle` rolls them).
        var peak = 0
        var lastPeak = 0
        var budget: Int { max(peak, lastPeak) }
        var isDormant: Bool { idle.isEmpty && inUse == 0 && peak == 0 && lastPeak == 0 }

        /// One more in use (taken, or being opened).
        func took() {
            inUse += 1
            if inUse > peak { peak = inUse }
        }

        /// The most recently released idle connection, taken (in use from now on).
        func takeIdle() -> UpstreamConnection? {
            guard let connection = idle.popLast() else { return nil }
            took()
            return connection
        }

        /// `connection` back from use: kept idle (true) while fewer than `budget` are, at most
        /// `shared` when it is given (the shared principals' budget is the upstream's).
        func giveBack(_ connection: UpstreamConnection, sharedBudget: Int?) -> Bool {
            inUse -= 1
            guard idle.count < (sharedBudget ?? budget) else { return false }
            idle.append(connection)
            return true
        }
    }

    /// A request waiting for a place in its upstream's budget.
    struct Waiter {
        let principal: UpstreamPrincipal?
        let deadline: NIODeadline
        let done: (Result<UpstreamConnection, any Error>) -> Void
    }

    /// One upstream's connections on this loop.
    final class Upstream {
        /// Weak: a connection can outlive its pool (the app still holds a connection when the
        /// server that made the pool is gone: every test's server on the shared loops). It then
        /// closes without telling anyone; an unowned reference crashed the process there.
        weak var pool: UpstreamPool?
        let address: UpstreamAddress
        var principals: [UpstreamPrincipal: Principal] = [:]
        /// Connecting, in use, idle: what the budget counts.
        var open = 0
        var limit = 0
        var waiters = CircularBuffer<Waiter>()
        var waitTimer: Scheduled<Void>? = nil
        /// Connect failures since the last one logged (rate-limited: one line a second).
        var unloggedFailures = 0
        var lastFailureLogged: NIODeadline? = nil

        init(pool: UpstreamPool, address: UpstreamAddress) {
            self.pool = pool
            self.address = address
        }
    }

    let eventLoop: any EventLoop
    private var upstreams: [UpstreamAddress: Upstream] = [:]
    /// Idle connections in the order they were released (oldest first), with the stamp they got
    /// then; an entry whose connection was taken since (its stamp changed) is skipped.
    private var released = CircularBuffer<(connection: UpstreamConnection, stamp: UInt64)>()
    private var stamps: UInt64 = 0
    private(set) var idleCount = 0
    /// The upstreams holding connections of each anonymous client connection.
    private var clientUpstreams: [UInt64: [Upstream]] = [:]
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

    private func upstream(_ address: UpstreamAddress) -> Upstream {
        if let known = upstreams[address] { return known }
        let new = Upstream(pool: self, address: address)
        upstreams[address] = new
        return new
    }

    /// How many connections to `address` are open on this loop (connecting, in use, idle).
    func openCount(_ address: UpstreamAddress) -> Int { upstreams[address]?.open ?? 0 }

    // MARK: taking

    /// An idle pooled connection of `principal`, if one is alive.
    func takeIdle(_ address: UpstreamAddress, for principal: UpstreamPrincipal) -> UpstreamConnection? {
        // An emptied entry stays (with its list's storage) for the principal's next release:
        // a user's requests take and give back the same connection. The sweep drops dormant ones.
        guard let upstream = upstreams[address], let entry = upstream.principals[principal] else { return nil }
        while let connection = entry.takeIdle() {
            idleCount -= 1
            connection.poolState = .inUse
            guard connection.isActive else {
                markReleased(principal, upstream)
                retire(connection, upstream)
                continue
            }
            return connection
        }
        return nil
    }

    private func markInUse(_ principal: UpstreamPrincipal?, _ upstream: Upstream) {
        guard let principal else { return }
        if let entry = upstream.principals[principal] { return entry.took() }
        if case .client(let id) = principal { clientUpstreams[id, default: []].append(upstream) }
        let entry = Principal()
        upstream.principals[principal] = entry
        entry.took()
    }

    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?, limit: Int, on loop: any EventLoop,
                 _ done: @escaping (Result<UpstreamConnection, any Error>) -> Void) {
        let upstream = self.upstream(address)
        upstream.limit = limits.share(limit)
        if upstream.limit > 0, upstream.open >= upstream.limit {
            // Full: the least recently used idle connection of another principal gives way;
            // with none idle, the request waits its turn.
            if let victim = leastRecentlyIdle(of: upstream) {
                remove(victim)
                retire(victim, upstream)
            } else {
                upstream.waiters.append(Waiter(principal: principal, deadline: eventLoop.now + connectTimeout, done: done))
                armWaitTimer(upstream)
                return
            }
        }
        open(upstream, for: principal, done)
    }

    /// Opens a new connection for `principal`, counted in `upstream`'s budget from now on.
    private func open(_ upstream: Upstream, for principal: UpstreamPrincipal?, _ done: @escaping (Result<UpstreamConnection, any Error>) -> Void) {
        upstream.open += 1
        markInUse(principal, upstream)
        let bound = NIOLoopBound((pool: self, upstream: upstream, done: done), eventLoop: eventLoop)
        newConnection(upstream.address, principal).whenComplete { result in
            let (pool, upstream, done) = bound.value
            switch result {
            case .success(let connection):
                connection.value.poolUpstream = upstream
                connection.value.poolState = .inUse
                done(.success(connection.value))
            case .failure(let error):
                upstream.open -= 1
                pool.markReleased(principal, upstream)
                pool.connectFailed(upstream, error)
                done(.failure(error))
                pool.serveWaiter(upstream)
            }
        }
    }

    /// A new connection on this event loop (the future carries it loop-bound), trying each of
    /// the upstream's addresses in turn (a host name may have IPv6 and IPv4 addresses; the
    /// service may listen on one).
    private func newConnection(_ address: UpstreamAddress, _ principal: UpstreamPrincipal?) -> EventLoopFuture<NIOLoopBound<UpstreamConnection>> {
        guard !address.socketAddresses.isEmpty else {
            // Host names are resolved when routes are built; resolving here would block the loop.
            return eventLoop.makeFailedFuture(UnresolvedUpstream(host: address.host))
        }
        return newConnection(address, principal, candidates: address.socketAddresses[...])
    }

    private func newConnection(_ address: UpstreamAddress, _ principal: UpstreamPrincipal?, candidates: ArraySlice<SocketAddress>)
        -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    {
        let target = candidates.first!
        let rest = candidates.dropFirst()
        let attempt = newConnection(address, principal, to: target)
        guard !rest.isEmpty else { return attempt }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        let promise = eventLoop.makePromise(of: NIOLoopBound<UpstreamConnection>.self)
        attempt.whenComplete { result in
            switch result {
            case .success: promise.completeWith(attempt)
            case .failure: promise.completeWith(this.value.newConnection(address, principal, candidates: rest))
            }
        }
        return promise.futureResult
    }

    private func newConnection(_ address: UpstreamAddress, _ principal: UpstreamPrincipal?, to target: SocketAddress)
        -> EventLoopFuture<NIOLoopBound<UpstreamConnection>>
    {
        let handler = UpstreamConnection(address: address, principal: principal)
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
                observer.upstreamConnectionOpened(address)
                channel.closeFuture.whenComplete { _ in observer.upstreamConnectionClosed() }
                // The gateway closes a connection only when nothing of an exchange is left on
                // it (idle, after a complete response, or abandoning one): a reset loses
                // nothing and leaves no TIME_WAIT socket behind (README: "Upstream connections
                // and users"). A tunnel turns this off (`Upgrade.splice`).
                UpstreamConnection.setAbortiveClose(channel, true)
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

    /// One line a second per upstream and loop, with the count of those not logged since.
    private func connectFailed(_ upstream: Upstream, _ error: any Error) {
        if error is UpstreamTLSFailure { return }  // logged where it happened
        let now = eventLoop.now
        if let last = upstream.lastFailureLogged, now - last < .seconds(1) {
            upstream.unloggedFailures += 1
            return
        }
        var metadata: Logger.Metadata = ["upstream": "\(upstream.address)", "error": "\(Self.describe(error))"]
        if upstream.unloggedFailures > 0 { metadata["failures_not_logged"] = "\(upstream.unloggedFailures)" }
        upstream.unloggedFailures = 0
        upstream.lastFailureLogged = now
        logger.warning("upstream connect failed", metadata: metadata)
    }

    /// What a failed connect says: the errno's name and text, or the timeout.
    static func describe(_ error: any Error) -> String {
        if let io = error as? IOError { return "errno \(io.errnoCode) (\(String(cString: strerror(io.errnoCode))))" }
        if let failure = error as? NIOConnectionError, let first = failure.connectionErrors.first {
            return describe(first.error)
        }
        if let channel = error as? ChannelError, case .connectTimeout = channel { return "no connection within the connect timeout" }
        if error is UnresolvedUpstream { return "host name not resolved" }
        return "\(error)"
    }

    /// A connection opened without `connect` (the pool's tests, which have no sockets) joins
    /// the budget in use, as one that `connect` opened does.
    func adopt(_ connection: UpstreamConnection) {
        let upstream = self.upstream(connection.address)
        upstream.open += 1
        markInUse(connection.principal, upstream)
        connection.poolUpstream = upstream
        connection.poolState = .inUse
    }

    // MARK: giving back

    /// Returns a connection after a complete exchange: handed to the first waiting request, kept
    /// for its principal while it may serve another request and there is room, otherwise closed.
    func release(_ connection: UpstreamConnection) {
        guard connection.poolState == .inUse, let upstream = connection.poolUpstream else { return connection.close() }
        guard connection.isActive, connection.reusable, let principal = connection.principal, upstream.waiters.isEmpty else {
            return releaseSlowly(connection, upstream)
        }
        connection.owner = nil
        connection.reused = true
        // The shared principals keep what the idle total allows (the upstream's budget bounds the rest).
        let shared = principal == .anyone || principal == .echoing ? limits.idleTotal : nil
        guard let entry = upstream.principals[principal], entry.giveBack(connection, sharedBudget: shared) else {
            retire(connection, upstream)
            return
        }
        stamps &+= 1
        connection.poolState = .idle(since: eventLoop.now, stamp: stamps)
        idleCount += 1
        released.append((connection, stamps))
        while idleCount > limits.idleTotal, let oldest = released.popFirst() {
            guard oldest.connection.isIdle(stamp: oldest.stamp) else { continue }
            remove(oldest.connection)
            retire(oldest.connection, oldest.connection.poolUpstream)
        }
        // Entries of connections taken since accumulate; drop them once they outnumber the rest.
        if released.count > 2 * limits.idleTotal + 64 {
            released = CircularBuffer(released.filter { $0.connection.isIdle(stamp: $0.stamp) })
        }
        scheduleSweep()
    }

    /// A connection back that is not kept (no longer reusable) or that a waiting request
    /// takes: handed to the first waiting request when it is the same principal's, else closed
    /// and its place given to the first waiting request.
    private func releaseSlowly(_ connection: UpstreamConnection, _ upstream: Upstream) {
        markReleased(connection.principal, upstream)
        if connection.isActive, connection.reusable, let principal = connection.principal, let first = upstream.waiters.first,
           first.principal == principal
        {
            connection.owner = nil
            connection.reused = true
            _ = upstream.waiters.removeFirst()
            markInUse(principal, upstream)
            return first.done(.success(connection))
        }
        retire(connection, upstream)
        serveWaiter(upstream)
    }

    private func markReleased(_ principal: UpstreamPrincipal?, _ upstream: Upstream) {
        guard let principal, let entry = upstream.principals[principal] else { return }
        entry.inUse -= 1
    }

    /// The least recently released idle connection to `upstream` (to give way to a new one).
    private func leastRecentlyIdle(of upstream: Upstream) -> UpstreamConnection? {
        for entry in released where entry.connection.isIdle(stamp: entry.stamp) && entry.connection.poolUpstream === upstream {
            return entry.connection
        }
        return nil
    }

    /// Closes a connection the pool holds (idle or just given back), out of the budget now.
    private func retire(_ connection: UpstreamConnection, _ upstream: Upstream?) {
        if connection.poolState != .gone, let upstream {
            upstream.open -= 1
        }
        connection.poolState = .gone
        connection.close()
    }

    /// An idle connection leaves its principal's list (it closed, or is being evicted).
    func remove(_ connection: UpstreamConnection) {
        guard case .idle = connection.poolState, let principal = connection.principal, let upstream = connection.poolUpstream,
              let entry = upstream.principals[principal], let index = entry.idle.firstIndex(where: { $0 === connection })
        else { return }
        entry.idle.remove(at: index)
        idleCount -= 1
        connection.poolState = .inUse
    }

    /// A connection of this pool closed (the app closed it, or it failed): out of the budget,
    /// and a waiting request gets its place.
    func closed(_ connection: UpstreamConnection) {
        guard connection.poolState != .gone, let upstream = connection.poolUpstream else { return }
        if case .idle = connection.poolState {
            remove(connection)
        } else {
            markReleased(connection.principal, upstream)
        }
        connection.poolState = .gone
        upstream.open -= 1
        serveWaiter(upstream)
    }

    /// The connection became a WebSocket tunnel: it leaves the pool and the budget (a tunnel
    /// may stay open for hours; the budget bounds the connections requests take turns on).
    func tunnelled(_ connection: UpstreamConnection) {
        guard connection.poolState == .inUse, let upstream = connection.poolUpstream else { return }
        markReleased(connection.principal, upstream)
        connection.poolState = .gone
        connection.poolUpstream = nil
        upstream.open -= 1
        serveWaiter(upstream)
    }

    /// A place in `upstream`'s budget came free: the first waiting request connects.
    private func serveWaiter(_ upstream: Upstream) {
        while upstream.limit <= 0 || upstream.open < upstream.limit, let waiter = upstream.waiters.popFirst() {
            open(upstream, for: waiter.principal, waiter.done)
        }
        if upstream.waiters.isEmpty {
            upstream.waitTimer?.cancel()
            upstream.waitTimer = nil
        }
    }

    private func armWaitTimer(_ upstream: Upstream) {
        guard upstream.waitTimer == nil, let first = upstream.waiters.first else { return }
        let bound = NIOLoopBound((pool: self, upstream: upstream), eventLoop: eventLoop)
        upstream.waitTimer = eventLoop.scheduleTask(deadline: first.deadline) { bound.value.pool.waitTimedOut(bound.value.upstream) }
    }

    private func waitTimedOut(_ upstream: Upstream) {
        upstream.waitTimer = nil
        let now = eventLoop.now
        while let first = upstream.waiters.first, first.deadline <= now {
            _ = upstream.waiters.removeFirst()
            first.done(.failure(UpstreamBusy()))
        }
        armWaitTimer(upstream)
    }

    func clientClosed(_ id: UInt64) {
        guard let held = clientUpstreams.removeValue(forKey: id) else { return }
        for upstream in held {
            guard let entry = upstream.principals.removeValue(forKey: .client(id)) else { continue }
            for connection in entry.idle {
                idleCount -= 1
                retire(connection, upstream)
            }
            serveWaiter(upstream)
        }
    }

    /// Closes every idle connection (shutdown).
    func closeAll() {
        sweep?.cancel()
        for upstream in upstreams.values {
            for entry in upstream.principals.values {
                let idle = entry.idle
                entry.idle = []
                for connection in idle { retire(connection, upstream) }
            }
        }
        clientUpstreams.removeAll()
        released.removeAll()
        idleCount = 0
    }

    private func scheduleSweep() {
        guard sweep == nil else { return }
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        sweep = eventLoop.scheduleTask(in: idleTimeout) { this.value.sweepIdle() }
    }

    /// Every idle timeout: connections idle that long close, each principal's window of peaks
    /// rolls, and dormant entries go.
    private func sweepIdle() {
        sweep = nil
        let cutoff = eventLoop.now - idleTimeout
        var anyLeft = false
        for upstream in upstreams.values {
            for (principal, entry) in upstream.principals {
                var stale: [UpstreamConnection] = []
                entry.idle.removeAll { connection in
                    guard let since = connection.idleSince, since > cutoff else { stale.append(connection); return true }
                    return false
                }
                idleCount -= stale.count
                entry.lastPeak = entry.peak
                entry.peak = entry.inUse
                if entry.isDormant {
                    upstream.principals.removeValue(forKey: principal)
                    if case .client(let id) = principal { forgetClient(id, upstream) }
                } else {
                    anyLeft = true
                }
                for connection in stale { retire(connection, upstream) }
            }
        }
        if anyLeft { scheduleSweep() }
    }

    private func forgetClient(_ id: UInt64, _ upstream: Upstream) {
        clientUpstreams[id]?.removeAll { $0 === upstream }
        if clientUpstreams[id]?.isEmpty == true { clientUpstreams.removeValue(forKey: id) }
    }
}
