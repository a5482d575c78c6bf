/// Where a route sends its requests.
public struct UpstreamAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// One route as the proxy sees it: match rule, upstream, and the guard that admits requests.
public struct ProxyRoute: Sendable {
    public var name: String
    /// Lower-case host name; `nil` answers any host.
    public var host: String?
    public var pathPrefix: String
    public var upstream: UpstreamAddress
    public var requestGuard: any RequestGuard

    public init(name: String, host: String? = nil, pathPrefix: String = "/", upstream: UpstreamAddress, requestGuard: any RequestGuard = PublicGuard()) {
        self.name = name
        self.host = host
        self.pathPrefix = pathPrefix
        self.upstream = upstream
        self.requestGuard = requestGuard
    }

    /// Whether `path` (canonical) is under this route's prefix, on a segment boundary:
    /// `/api` matches `/api` and `/api/x`, not `/apix`.
    func covers(_ path: String) -> Bool {
        guard path.utf8.starts(with: pathPrefix.utf8) else { return false }
        if pathPrefix.utf8.last == UInt8(ascii: "/") { return true }
        let rest = path.utf8.dropFirst(pathPrefix.utf8.count)
        return rest.isEmpty || rest.first == UInt8(ascii: "/")
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

    /// `host` is the raw `Host` header value (any case, optional port).
    public func match(host: String?, path: String) -> ProxyRoute? {
        if !byHost.isEmpty, let host, let candidates = byHost[Self.hostName(host)] {
            return candidates.first { $0.covers(path) }
        }
        return anyHost.first { $0.covers(path) }
    }

    /// `Example.COM:8080` → `example.com`; `[::1]:80` → `::1`.
    static func hostName(_ value: String) -> String {
        var name = Substring(value)
        if name.hasPrefix("[") {
            if let close = name.firstIndex(of: "]") { name = name[name.index(after: name.startIndex)..<close] }
        } else if let colon = name.lastIndex(of: ":") {
            name = name[..<colon]
        }
        if name.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5a }) { return name.lowercased() }
        return String(name)
    }
}
