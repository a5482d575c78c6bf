import Atomics
import GatewayConfig
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOExtras
import NIOHTTP1
import NIOPosix
import NIOTLS

/// Settings of the data path (typed values; the file format lives in `GatewayConfig`).
public struct ProxyConfiguration: Sendable {
    public var listen: ListenAddress
    public var timeouts: Timeouts
    public var limits: ProxyLimits
    /// TLS termination on `listen`; nil: plain HTTP.
    public var tls: TLSTermination? = nil
    /// Where HTTP/2 is spoken (ALPN on TLS, h2c on plain) and its bounds.
    public var http2 = HTTP2Settings()

    public struct Timeouts: Sendable {
        public var upstreamConnect: TimeAmount
        public var upstreamResponse: TimeAmount
        public var idle: TimeAmount
        /// A request body must arrive completely within this time of its head, plus the credit
        /// of `ExchangeRules.bodyDeadline` (nginx's `client_body_timeout` measures only gaps, so
        /// one byte per gap kept a request open forever).
        public var requestBody: TimeAmount
        /// From the first byte of a request to the end of its head; then 408 and close.
        public var requestHead: TimeAmount

        public init(upstreamConnect: TimeAmount = .seconds(5), upstreamResponse: TimeAmount = .seconds(60), idle: TimeAmount = .seconds(60),
                    requestBody: TimeAmount = .seconds(60), requestHead: TimeAmount = .seconds(30)) {
            self.upstreamConnect = upstreamConnect
            self.upstreamResponse = upstreamResponse
            self.idle = idle
            self.requestBody = requestBody
            self.requestHead = requestHead
        }
    }

    public init(listen: ListenAddress, timeouts: Timeouts = Timeouts(), limits: ProxyLimits = ProxyLimits()) {
        self.listen = listen
        self.timeouts = timeouts
        self.limits = limits
    }
}

/// What a reload swaps atomically: routes and the header rules that go with them.
public final class RoutingSnapshot: Sendable {
    public let table: RouteTable
    let rules: RequestHeaderRules
    let trustedProxies: [CIDR]
    let origins: OriginPolicy
    /// Requests are traced (`tracing`): how new traces are sampled. nil: not traced, and a
    /// client's `traceparent` passes untouched.
    let tracing: TraceSampler?

    /// - Parameters:
    ///   - identityHeaders: header names removed from every client request, in any spelling
    ///     (the gateway's own and `identity.strip_headers`); the names other authenticating
    ///     proxies set (`Remote-User`, …) are always removed besides.
    ///   - identityPrefix: every client header under this prefix is removed too (`X-Auth-`).
    ///   - trustedProxies: peers whose `X-Forwarded-*` and `X-Request-Id` are kept.
    ///   - hiddenCookies: cookie names removed from every `Cookie` header sent upstream and
    ///     from every upstream `Set-Cookie`.
    ///   - origins: who may open a WebSocket.
    ///   - tracing: how requests are sampled when they are traced.
    public init(routes: [ProxyRoute], identityHeaders: [String], identityPrefix: String = "", trustedProxies: [CIDR], hiddenCookies: [String] = [],
                origins: OriginPolicy = .sameHost, tracing: TraceSampler? = nil) {
        self.table = RouteTable(routes)
        self.rules = RequestHeaderRules(identityHeaders: identityHeaders, identityPrefix: identityPrefix, hiddenCookies: hiddenCookies,
                                        tracesRequests: tracing != nil)
        self.trustedProxies = trustedProxies
        self.origins = origins
        self.tracing = tracing
    }

    /// Whether `peer` is one of `server.trusted_proxies`.
    func trusts(_ peer: IPAddress?) -> Bool {
        guard let peer else { return false }
        return trustedProxies.contains { $0.contains(peer) }
    }
}

/// State every connection of one server shares.
final class ProxyShared: Sendable {
    private let current: NIOLockedValueBox<RoutingSnapshot>
    /// Counts `replace`s: a connection keeps the snapshot it read until this moves (an atomic
    /// load per request instead of the lock).
    private let generation = ManagedAtomic(0)
    let timeouts: ProxyConfiguration.Timeouts
    let limits: ProxyLimits
    let observer: any ProxyObserver
    /// `X-Forwarded-Proto` for requests from untrusted peers: the listener's own scheme.
    let scheme: String
    let limiter: ConnectionLimiter
    /// Set when the drain starts. A connection whose protocol is chosen later (its TLS
    /// handshake or h2c preface was under way when the quiesce event went by, and dropped it at
    /// the pipeline's end) is told then: GOAWAY, or `connection: close`, all the same.
    let quiescing = ManagedAtomic(false)

    init(snapshot: RoutingSnapshot, configuration: ProxyConfiguration, observer: any ProxyObserver) {
        self.current = NIOLockedValueBox(snapshot)
        self.timeouts = configuration.timeouts
        self.limits = configuration.limits
        self.observer = observer
        self.scheme = configuration.tls == nil ? "http" : "https"
        self.limiter = ConnectionLimiter(maxTotal: configuration.limits.maxConnections, maxPerClient: configuration.limits.maxConnectionsPerClient)
    }

    /// Counts a new client connection against the caps; its refusal if it is over one (then it
    /// was counted nowhere). Counted connections are uncounted when they close.
    func admitConnection(_ channel: any Channel) -> ConnectionRefusal? {
        guard limiter.isActive else { return nil }
        let peer = channel.remoteAddress?.ipAddress
        let client = snapshot.trusts(peer.flatMap(IPAddress.parse)) ? nil : peer
        if let refusal = limiter.open(client: client) { return refusal }
        let limiter = self.limiter
        channel.closeFuture.whenComplete { _ in limiter.close(client: client) }
        return nil
    }

    var snapshot: RoutingSnapshot { current.withLockedValue { $0 } }
    var routingGeneration: Int { generation.load(ordering: .acquiring) }
    func replace(_ snapshot: RoutingSnapshot) {
        current.withLockedValue {
            $0 = snapshot
            generation.wrappingIncrement(ordering: .releasing)
        }
    }
}

/// The gateway's public listener, HTTP/1.1 and (by ALPN on TLS, or h2c when configured)
/// HTTP/2: one event loop per core, each with its own upstream pool. Start with `start()`, swap
/// routes with `replaceRouting(_:)`, stop with `shutdown`.
public final class ProxyServer: Sendable {
    private let configuration: ProxyConfiguration
    private let group: any EventLoopGroup
    private let shared: ProxyShared
    private let pools: [ObjectIdentifier: NIOLoopBoundBox<UpstreamPool>]
    private let state = NIOLockedValueBox<(channel: (any Channel)?, quiesce: ServerQuiescingHelper?)>((nil, nil))
    /// Every client connection open now: the ones a drain's deadline cuts are closed by us, so
    /// that each exchange they carried is recorded (aborted) before the process ends.
    private let clients = NIOLockedValueBox<[ObjectIdentifier: any Channel]>([:])
    private let logger: Logger
    private let http2Streams: HTTP2StreamInitializer

    public convenience init(configuration: ProxyConfiguration, routing: RoutingSnapshot, group: MultiThreadedEventLoopGroup,
                            observer: any ProxyObserver = SilentProxyObserver(), logger: Logger) {
        self.init(configuration: configuration, routing: routing, group: group, observer: observer, logger: logger,
                  http2Streams: HTTP2StreamHandler.initializer)
    }

    /// - Parameter http2Streams: installs the handler of each HTTP/2 stream.
    init(configuration: ProxyConfiguration, routing: RoutingSnapshot, group: MultiThreadedEventLoopGroup, observer: any ProxyObserver = SilentProxyObserver(),
         logger: Logger, http2Streams: @escaping HTTP2StreamInitializer) {
        self.configuration = configuration
        self.group = group
        self.logger = logger
        self.http2Streams = http2Streams
        self.shared = ProxyShared(snapshot: routing, configuration: configuration, observer: observer)
        var pools: [ObjectIdentifier: NIOLoopBoundBox<UpstreamPool>] = [:]
        let loops = Array(group.makeIterator())
        var limits = UpstreamPoolLimits(loops: loops.count)
        limits.idleTotal = limits.share(configuration.limits.maxIdleUpstreamConnections)
        for loop in loops {
            pools[ObjectIdentifier(loop)] = NIOLoopBoundBox.makeBoxSendingValue(
                UpstreamPool(eventLoop: loop, connectTimeout: configuration.timeouts.upstreamConnect,
                             idleTimeout: configuration.timeouts.idle, limits: limits, observer: observer, logger: logger),
                eventLoop: loop)
        }
        self.pools = pools
    }

    /// Binds and starts accepting. Returns the bound address (port 0 picks a free port).
    @discardableResult
    public func start() async throws -> SocketAddress {
        let quiesce = ServerQuiescingHelper(group: group)
        let shared = self.shared
        let pools = self.pools
        let tls = configuration.tls
        let logger = self.logger
        let http2 = configuration.http2
        let streams = self.http2Streams
        let clients = self.clients
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(quiesce.makeServerChannelHandler(channel: channel))
                }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard let pool = pools[ObjectIdentifier(channel.eventLoop)]?.value else {
                        throw ChannelError.operationUnsupported
                    }
                    let sync = channel.pipeline.syncOperations
                    let id = ObjectIdentifier(channel)
                    clients.withLockedValue { $0[id] = channel }
                    channel.closeFuture.whenComplete { _ in clients.withLockedValue { _ = $0.removeValue(forKey: id) } }
                    try tls?.addHandlers(to: sync, observer: shared.observer, logger: logger)
                    if let refusal = shared.admitConnection(channel) {
                        shared.observer.clientConnectionRefused(refusal)
                        return try sync.addHandler(RefusedConnectionHandler())
                    }
                    let selector = ProtocolSelector(shared: shared, pool: pool, settings: http2, logger: logger, streams: streams)
                    switch (tls != nil, tls != nil ? http2.overTLS : http2.cleartext) {
                    case (_, false):
                        // HTTP/1.1 alone: the pipeline as it always was.
                        try sync.addHandler(ProxyServerHandler(shared: shared, connector: pool))
                    case (true, true):
                        try sync.addHandler(ApplicationProtocolNegotiationHandler { result, channel in
                            channel.eventLoop.makeCompletedFuture {
                                guard case .negotiated("h2") = result else { return try selector.configure(.http1, channel) }
                                try selector.configure(.http2, channel)
                            }
                        })
                    case (false, true):
                        try sync.addHandler(HTTP2PrefaceSniffer(timeout: shared.timeouts.requestHead) { choice, _ in
                            try selector.configure(choice, channel)
                        })
                    }
                }
            }
            .bind(host: configuration.listen.host, port: configuration.listen.port)
            .get()
        state.withLockedValue { $0 = (channel, quiesce) }
        return channel.localAddress!
    }

    public var localAddress: SocketAddress? { state.withLockedValue { $0.channel?.localAddress } }

    /// Client connections accepted and not yet closed (tests wait for an accept).
    var clientConnectionCount: Int { clients.withLockedValue { $0.count } }

    /// Swaps routes and header rules; requests already admitted keep the old ones.
    public func replaceRouting(_ snapshot: RoutingSnapshot) { shared.replace(snapshot) }

    /// Stops accepting, closes idle keep-alive connections, lets in-flight exchanges finish
    /// (with `connection: close`), and returns when they are done or after `deadline`,
    /// whichever is first; connections still open then are closed (their exchanges recorded as
    /// aborted). Pooled upstream connections are closed.
    public func shutdown(deadline: TimeAmount) async {
        guard let quiesce = state.withLockedValue({ $0.quiesce }) else { return }
        shared.quiescing.store(true, ordering: .sequentiallyConsistent)
        let promise = group.next().makePromise(of: Void.self)
        quiesce.initiateShutdown(promise: promise)
        let timeout = group.next().scheduleTask(in: deadline) { promise.succeed(()) }
        try? await promise.futureResult.get()
        timeout.cancel()
        // Past the deadline: what is still open is cut here, not by the process's end, so that
        // every exchange gets its access-log line (aborted) and its metrics.
        let cut = clients.withLockedValue { Array($0.values) }
        for channel in cut { channel.close(promise: nil) }
        for channel in cut { try? await channel.closeFuture.get() }
        for (_, pool) in pools {
            try? await pool.eventLoop.submit { pool.value.closeAll() }.get()
        }
    }
}

/// Adds the pipeline of the protocol a connection speaks, once it is known (ALPN, or the h2c
/// preface): HTTP/1.1's handler as it always was, or the HTTP/2 connection pipeline.
struct ProtocolSelector {
    let shared: ProxyShared
    let pool: UpstreamPool
    let settings: HTTP2Settings
    let logger: Logger
    let streams: HTTP2StreamInitializer

    func configure(_ choice: HTTP2PrefaceSniffer.Choice, _ channel: any Channel) throws {
        switch choice {
        case .http1:
            try channel.pipeline.syncOperations.addHandler(ProxyServerHandler(shared: shared, connector: pool))
        case .http2:
            // The connection's number is the anonymous principal of its streams' requests; the
            // upstream connections kept for it close with it.
            let clientID = pool.newClient()
            let loopPool = NIOLoopBound(pool, eventLoop: channel.eventLoop)
            channel.closeFuture.whenComplete { _ in loopPool.value.clientClosed(clientID) }
            var rng = SystemRandomNumberGenerator()
            let environment = HTTP2StreamEnvironment(shared: shared, connector: pool, settings: settings,
                                                     client: HTTP2Client(id: clientID, remoteAddress: channel.remoteAddress),
                                                     ids: HTTP2RequestIDs(seed: rng.next()))
            try HTTP2ConnectionPipeline.configure(channel, environment: environment, idle: shared.timeouts.idle, logger: logger, streams: streams)
        }
        // Late for the drain's event (the handlers above were not there to see it): told at
        // the next tick, after the bytes read while choosing (an h2c preface, a request sent
        // with TLS's last handshake flight) have reached them, so a request already sent is
        // answered (`connection: close`, or within the GOAWAY's last stream), not dropped.
        if shared.quiescing.load(ordering: .sequentiallyConsistent) {
            let pipeline = channel.pipeline
            channel.eventLoop.execute { pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent()) }
        }
    }
}
