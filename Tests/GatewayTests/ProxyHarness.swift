import TestSupport
import GatewayConfig
import HTTPProxy
import Logging
import NIOCore
import NIOPosix
import NIOSSL

/// A proxy in front of a `TestUpstream`, both real servers on loopback, on `group`'s loops.
struct ProxyHarness {
    let proxy: ProxyServer
    let upstream: TestUpstream
    var port: Int { proxy.localAddress!.port! }

    /// Runs `body` with a started proxy and upstream; both are stopped before this returns or
    /// rethrows.
    static func with<Result>(
        timeouts: ProxyConfiguration.Timeouts = .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .seconds(10)),
        limits: ProxyLimits = ProxyLimits(),
        trustedProxies: [CIDR] = [],
        upstreamPort: Int? = nil,
        upstreamHost: String = "127.0.0.1",
        extraAddressesFirst: [SocketAddress] = [],
        guard requestGuard: any RequestGuard = PublicGuard(),
        maxBodyBytes: Int = 0,
        hiddenCookies: [String] = [],
        origins: OriginPolicy = .sameHost,
        upstreamTLS: Bool = false,
        group: MultiThreadedEventLoopGroup = .singleton,
        observer: any ProxyObserver = SilentProxyObserver(),
        logger: Logger = Logger(label: "test"),
        routes makeRoutes: (@Sendable (UpstreamAddress) -> [ProxyRoute])? = nil,
        _ body: (ProxyHarness) async throws -> Result
    ) async throws -> Result {
        let harness = try await start(
            timeouts: timeouts, limits: limits, trustedProxies: trustedProxies, upstreamPort: upstreamPort, upstreamHost: upstreamHost,
            extraAddressesFirst: extraAddressesFirst, guard: requestGuard, maxBodyBytes: maxBodyBytes, hiddenCookies: hiddenCookies, origins: origins,
            upstreamTLS: upstreamTLS, group: group, observer: observer, logger: logger, routes: makeRoutes)
        return try await withTeardown(harness, stop: { await $0.stop() }, body)
    }

    private static func start(
        timeouts: ProxyConfiguration.Timeouts,
        limits: ProxyLimits,
        trustedProxies: [CIDR],
        upstreamPort: Int?,
        upstreamHost: String,
        extraAddressesFirst: [SocketAddress],
        guard requestGuard: any RequestGuard,
        maxBodyBytes: Int,
        hiddenCookies: [String],
        origins: OriginPolicy,
        upstreamTLS: Bool,
        group: MultiThreadedEventLoopGroup,
        observer: any ProxyObserver,
        logger: Logger,
        routes makeRoutes: (@Sendable (UpstreamAddress) -> [ProxyRoute])?
    ) async throws -> ProxyHarness {
        // The upstream on the proxy's loops: a test that gives the proxy loops of its own gives
        // them to its upstream too.
        let upstream = try await TestUpstream.start(tls: upstreamTLS ? try Self.upstreamCertificate.server : nil, group: group)
        var address = try Self.address(upstreamHost, upstreamPort ?? upstream.port, extraAddressesFirst)
        if upstreamTLS {
            // Verified by address: the certificate names 127.0.0.1 (and localhost).
            address.tls = UpstreamTLS(context: try Self.upstreamCertificate.client, serverName: nil)
        }
        let routes = makeRoutes?(address) ?? [
            ProxyRoute(name: "test", pathPrefix: "/", upstream: address, requestGuard: requestGuard, maxBodyBytes: maxBodyBytes),
        ]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: IdentityHeaderNames().all, identityPrefix: "X-Auth-", trustedProxies: trustedProxies,
                                       hiddenCookies: hiddenCookies, origins: origins)
        let proxy = ProxyServer(
            configuration: ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), timeouts: timeouts, limits: limits),
            routing: snapshot, group: group, observer: observer, logger: logger)
        try await proxy.start()
        return ProxyHarness(proxy: proxy, upstream: upstream)
    }

    /// An https upstream's certificate from a test CA, and a client context trusting only that CA.
    struct UpstreamCertificate: Sendable {
        let server: NIOSSLContext
        let client: NIOSSLContext
    }

    static let upstreamCertificateResult: Result<UpstreamCertificate, any Error> = Result {
        let ca = try TestCA()
        let leaf = try ca.issue("upstream")
        let server = try NIOSSLContext(configuration: .makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(leaf.certificateFile).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: leaf.privateKeyFile, format: .pem))))
        var client = TLSConfiguration.makeClientConfiguration()
        client.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(ca.certificateFile))
        let context = UpstreamCertificate(server: server, client: try NIOSSLContext(configuration: client))
        ca.remove()
        return context
    }

    static var upstreamCertificate: UpstreamCertificate { get throws { try upstreamCertificateResult.get() } }

    private static func address(_ host: String, _ port: Int, _ before: [SocketAddress]) throws -> UpstreamAddress {
        let resolved = try UpstreamAddress(host: host, port: port).resolved()
        return before.isEmpty ? resolved : UpstreamAddress(host: host, port: port, addresses: before + resolved.socketAddresses)
    }

    /// Sends `raw` on a new connection and reads one response.
    func request(_ raw: String, timeoutSeconds: Int = 10) async throws -> RawClient.Response {
        let port = self.port
        return try await blocking {
            let client = try RawClient(port: port, timeoutSeconds: timeoutSeconds)
            try client.send(raw)
            return try client.readResponse()
        }
    }

    private func stop() async {
        await proxy.shutdown(deadline: .seconds(1))
        await upstream.close()
    }
}

#if canImport(Glibc)
import Glibc
#endif
