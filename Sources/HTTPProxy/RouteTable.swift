import GatewayConfig
import Synchronization
import NIOCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where a route sends its requests.
public struct UpstreamAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    /// The addresses tried, in order, for each new connection. Known at once for an IP literal;
    /// a host name is resolved by `resolved()` when the configuration is loaded — never on an
    /// event loop, where `getaddrinfo` would block every connection of that loop.
    public private(set) var socketAddresses: [SocketAddress]
    /// https: how connections to it speak TLS; nil: plain HTTP.
    public var tls: UpstreamTLS? = nil

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
        self.socketAddresses = (try? SocketAddress(ipAddress: host, port: port)).map { [$0] } ?? []
    }

    /// The connection pools look an upstream up per request: its name and port are hash enough
    /// (equality still compares everything), not its addresses and TLS settings.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(host)
        hasher.combine(port)
    }

    /// An upstream with its addresses already known (tried in this order).
    public init(host: String, port: Int, addresses: [SocketAddress]) {
        self.host = host
        self.port = port
        self.socketAddresses = addresses
    }

    /// This address with its host name resolved to every IPv4 and IPv6 address it has
    /// (blocking: call it off the event loops).
    public func resolved() throws -> UpstreamAddress {
        guard socketAddresses.isEmpty else { return self }
        var copy = self
        copy.socketAddresses = try Self.resolve(host, port: port)
        return copy
    }

    struct ResolutionFailed: Error {}

    private static func resolve(_ host: String, port: Int) throws -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var list: UnsafeMutablePointer<addrinfo>? = nil
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let first = list else { throw ResolutionFailed() }
        defer { freeaddrinfo(first) }
        var addresses: [SocketAddress] = []
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let info = entry {
            if let raw = info.pointee.ai_addr {
                switch info.pointee.ai_family {
                case AF_INET:
                    addresses.append(SocketAddress(raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee }, host: host))
                case AF_INET6:
                    addresses.append(SocketAddress(raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee }, host: host))
                default: break
                }
            }
            entry = info.pointee.ai_next
        }
        guard !addresses.isEmpty else { throw ResolutionFailed() }
        var unique: [SocketAddress] = []
        for address in addresses where !unique.contains(address) { unique.append(address) }
        return unique
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// One route as the proxy sees it: match rule, upstream, and the guard that admits requests.
/// A route, fixed for the life of a routing snapshot. A class: every proxied request holds its
/// route from routing to the access log, and a struct of this size was copied (and each of its
/// strings retained) several times per request.
public final class ProxyRoute: Sendable {
    public let name: String
    /// Lower-case host name; `nil` answers any host.
    public let host: String?
    public let pathPrefix: String
    public let upstream: UpstreamAddress
    public let requestGuard: any RequestGuard
    /// Largest request body forwarded, in bytes (0: unlimited); beyond it: 413.
    public let maxBodyBytes: Int
    /// `TRACE` is forwarded only when a route opts in (otherwise 405, as nginx answers).
    public let allowTrace: Bool
    /// The upstream sees the path without `pathPrefix` (`/static/index.html` → `/index.html`).
    public let stripPrefix: Bool
    /// The `Host` the upstream receives instead of the client's (`X-Forwarded-Host` keeps it).
    public let upstreamHost: String?
    /// Which requests an upstream connection may carry over its life.
    public let upstreamReuse: GatewayConfiguration.UpstreamReuse
    /// Forwarded requests not yet answered, per instance, beyond which the next is refused 503
    /// at once (0: no bound).
    public let maxInFlight: Int
    /// Connections to `upstream` per instance, in use and idle (0: no bound).
    public let upstreamMaxConnections: Int
    private let inFlight = Atomic<Int>(0)

    public init(name: String, host: String? = nil, pathPrefix: String = "/", upstream: UpstreamAddress, requestGuard: any RequestGuard = PublicGuard(),
                maxBodyBytes: Int = 0, allowTrace: Bool = false, stripPrefix: Bool = false, upstreamHost: String? = nil,
                upstreamReuse: GatewayConfiguration.UpstreamReuse = .principal, maxInFlight: Int = 0,
                upstreamMaxConnections: Int = 0) {
        self.name = name
        self.host = host
        self.pathPrefix = pathPrefix
        self.upstream = upstream
        self.requestGuard = requestGuard
        self.maxBodyBytes = maxBodyBytes
        self.allowTrace = allowTrace
        self.stripPrefix = stripPrefix
        self.upstreamHost = upstreamHost
        self.upstreamReuse = upstreamReuse
        self.maxInFlight = maxInFlight
        self.upstreamMaxConnections = upstreamMaxConnections
    }

    /// Takes one of the route's `maxInFlight` places; false when all are taken. Every place
    /// taken is given back with `leaveInFlight()`.
    func enterInFlight() -> Bool {
        let now = inFlight.wrappingAdd(1, ordering: .relaxed).newValue
        guard now > maxInFlight else { return true }
        inFlight.wrappingSubtract(1, ordering: .relaxed)
        return false
    }

    func leaveInFlight() { inFlight.wrappingSubtract(1, ordering: .relaxed) }

    /// Whether `path` (canonical) is under this route's prefix, on a segment boundary:
    /// `/api` matches `/api` and `/api/x`, not `/apix`.
    func covers(_ path: String) -> Bool { Self.covers(prefix: pathPrefix, path: path) }

    public static func covers(prefix: String, path: String) -> Bool {
        guard path.utf8.starts(with: prefix.utf8) else { return false }
        if prefix.utf8.last == UInt8(ascii: "/") { return true }
        let rest = path.utf8.dropFirst(prefix.utf8.count)
        return rest.isEmpty || rest.first == UInt8(ascii: "/")
    }

    /// The target the upstream receives: the canonical one, or with `strip_prefix` the part
    /// after the prefix, always starting with `/` (`/static/a?b` → `/a?b`, `/static` → `/`).
    public func upstreamTarget(_ target: RequestTarget) -> String {
        guard stripPrefix, pathPrefix != "/", covers(target.path) else { return target.forwarded }
        let kept = pathPrefix.hasSuffix("/") ? pathPrefix.dropLast() : Substring(pathPrefix)
        var path = String(target.path.dropFirst(kept.count))
        if path.isEmpty { path = "/" }
        return target.query.map { "\(path)?\($0)" } ?? path
    }
}

/// Routes by host, then longest path prefix.
///
/// Host first, as nginx server blocks do: when any route names the request's host, only those
/// routes are considered; otherwise the routes without a host. Immutable; a reload builds a new one.
public final class RouteTable: Sendable {
    public let routes: [ProxyRoute]
    private let byHost: [String: [ProxyRoute]]
    private let anyHost: [ProxyRoute]

    public init(_ routes: [ProxyRoute]) {
        self.routes = routes
        let longestFirst = routes.sorted { $0.pathPrefix.utf8.count > $1.pathPrefix.utf8.count }
        var byHost: [String: [ProxyRoute]] = [:]
        for route in longestFirst { if let host = route.host { byHost[host, default: []].append(route) } }
        self.byHost = byHost
        self.anyHost = longestFirst.filter { $0.host == nil }
    }

    /// `host` is the request's normalized host (`RequestHost`): a route's host matches its name
    /// whatever the port.
    public func match(host: RequestHost?, path: String) -> ProxyRoute? {
        if !byHost.isEmpty, let host, let candidates = byHost[host.name] {
            return candidates.first { $0.covers(path) }
        }
        return anyHost.first { $0.covers(path) }
    }
}
