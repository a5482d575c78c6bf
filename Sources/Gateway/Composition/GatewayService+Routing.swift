import GatewayConfig
import HTTPProxy
import NIOCore
import NIOPosix

/// What the proxy is given from a configuration: its listener settings, and the routes with
/// their guards (built again, as one value, on every reload).
extension GatewayService {
    static func proxyConfiguration(_ c: GatewayConfiguration) -> ProxyConfiguration {
        var configuration = ProxyConfiguration(
            listen: c.server.listen,
            timeouts: .init(upstreamConnect: .init(c.server.timeouts.upstreamConnect),
                            upstreamResponse: .init(c.server.timeouts.upstreamResponse),
                            idle: .init(c.server.timeouts.idle), requestBody: .init(c.server.timeouts.requestBody),
                            requestHead: .init(c.server.timeouts.requestHead)),
            limits: ProxyLimits(maxHeaderBytes: c.server.limits.maxHeaderBytes, maxHeaderCount: c.server.limits.maxHeaderCount,
                                maxConnections: c.server.limits.maxConnections, maxConnectionsPerClient: c.server.limits.maxConnectionsPerClient,
                                maxIdleUpstreamConnections: c.server.limits.maxIdleUpstreamConnections))
        configuration.http2 = HTTP2Settings(
            overTLS: c.server.tls?.alpn.contains(.h2) == true,
            cleartext: c.server.http2Cleartext,
            maxConcurrentStreams: c.server.http2.maxConcurrentStreams, maxHeaderListSize: c.server.http2.headerListSize(c.server.limits),
            maxStreamResets: c.server.http2.maxStreamResets, streamResetWindow: .init(GatewayConfiguration.HTTP2.streamResetWindow))
        return configuration
    }

    /// Each route's upstream as `sessiongate_upstream_connects_total` labels it (`host:port`).
    static func upstreamLabels(_ c: GatewayConfiguration) -> [String] {
        c.routes.map { UpstreamAddress(host: $0.upstream.host, port: $0.upstream.port).description }
    }

    /// Routes as the proxy sees them, upstream names resolved, each with its session guard; the
    /// auth endpoints (`server.auth_prefix`) come first for every host.
    static func routing(_ c: GatewayConfiguration, _ auth: Authenticator) throws -> RoutingSnapshot {
        let routes = try c.routes.enumerated().map { index, route in
            var address: UpstreamAddress
            do {
                address = try UpstreamAddress(host: route.upstream.host, port: route.upstream.port).resolved()
            } catch {
                throw StartupFailure(key: "routes[\(index)].upstream", "the host '\(route.upstream.host)' does not resolve")
            }
            address.tls = try TLSContexts.upstream(route, index: index)
            return ProxyRoute(name: route.name, host: route.host, pathPrefix: route.pathPrefix, upstream: address,
                              requestGuard: SessionGuard(auth: auth, route: route),
                              maxBodyBytes: route.maxBodyBytes ?? c.server.limits.maxBodyBytes, allowTrace: route.allowTrace,
                              stripPrefix: route.stripPrefix, upstreamHost: route.upstreamHost, upstreamReuse: route.upstreamReuse,
                              maxInFlight: route.maxInFlight, upstreamMaxConnections: route.upstreamMaxConnections)
        }
        // The endpoints answer locally; their upstream address is never dialled.
        let endpoints = AuthEndpointGuard(auth: auth, origins: origins(c), trustedProxies: c.server.trustedProxies)
        let hosts = Set(c.routes.map(\.host))
        let authRoutes = hosts.map { host in
            ProxyRoute(name: "auth", host: host, pathPrefix: c.server.authPrefix + "/", upstream: UpstreamAddress(host: "127.0.0.1", port: 9),
                       requestGuard: endpoints)
        }
        return RoutingSnapshot(routes: authRoutes + routes, identityHeaders: c.identity.headers.all + c.identity.stripHeaders, identityPrefix: c.identity.headerPrefix,
                               trustedProxies: c.server.trustedProxies, hiddenCookies: [auth.cookieName, auth.loginCookieName, auth.legacyLoginCookieName, auth.nameCookieName, auth.ticketCookieName],
                               origins: origins(c), tracing: c.tracing.map { TraceSampler(ratio: $0.sampleRatio) })
    }

    /// Who may open WebSockets and post to the gateway's endpoints besides the request's own host.
    static func origins(_ c: GatewayConfiguration) -> OriginPolicy {
        OriginPolicy(allowedOrigins: (c.server.publicURL.map { [$0] } ?? []) + c.server.allowedOrigins)
    }
}
