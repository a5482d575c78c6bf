/// Reads one entry of `routes`, key by key, in the order its problems are listed.
struct RouteReader {
    typealias Route = GatewayConfiguration.Route
    typealias Key = Route.Key

    /// What the routes read so far hold: each name, and each host and path prefix, belongs to one
    /// route (by index).
    struct Claims {
        var names: [String: Int] = [:]
        var matches: [String: Int] = [:]
    }

    let r: ConfigReader
    let s: ConfigReader.Section<Key>
    let index: Int
    /// `identity.link_url`, which `require_link` needs.
    let linkURL: String?

    /// The route, or nil when it has no valid upstream (every problem reported either way).
    func read(_ claims: inout Claims) -> Route? {
        let name = name(&claims)
        let host = host()
        let prefix = pathPrefix()
        let upstream = upstream()
        let auth = r.enumeration(s, .auth, as: GatewayConfiguration.AuthMode.self) ?? .required
        let unauthenticated = r.enumeration(s, .unauthenticated, as: GatewayConfiguration.UnauthenticatedAction.self) ?? .redirect
        let allow = allow(auth: auth)
        claim(host: host, prefix: prefix, &claims)
        let maxBody = r.int(s, .maxBodyBytes, range: 0...Int(Int64.max))
        let allowTrace = r.bool(s, .allowTrace) ?? false
        let stripPrefix = r.bool(s, .stripPrefix) ?? false
        if stripPrefix, prefix == "/" { r.warn(s, .stripPrefix, "has no effect with path_prefix /") }
        let upstreamHost = upstreamHost()
        let postLogout = postLogoutRedirect()
        let caFile = r.path(s, .upstreamCAFile)
        let serverName = upstreamServerName()
        let requireLink = requireLink(auth: auth)
        let reuse = r.enumeration(s, .upstreamReuse, as: GatewayConfiguration.UpstreamReuse.self) ?? .principal
        let maxInFlight = r.int(s, .maxInFlight, range: 0...10_000_000) ?? 0
        let maxConnections = r.int(s, .upstreamMaxConnections, range: 0...1_000_000) ?? Route.defaultUpstreamMaxConnections
        let preflight = r.enumeration(s, .preflight, as: GatewayConfiguration.Preflight.self) ?? .authenticate
        if preflight == .pass, auth == .public { r.report(s, .preflight, "has no effect on a public route (it forwards every request)") }
        let skipVerify = skipVerify()
        checkTLSKeys(upstream: upstream, skipVerify: skipVerify, caFile: caFile)
        guard let upstream else { return nil }
        var route = Route(name: name, host: host, pathPrefix: prefix, upstream: upstream, auth: auth, allow: allow, unauthenticated: unauthenticated)
        route.maxBodyBytes = maxBody
        route.allowTrace = allowTrace
        route.stripPrefix = stripPrefix
        route.upstreamHost = upstreamHost
        route.postLogoutRedirect = postLogout
        route.upstreamCAFile = caFile
        route.upstreamServerName = serverName
        route.upstreamInsecureSkipVerify = skipVerify
        route.requireLink = requireLink
        route.upstreamReuse = reuse
        route.maxInFlight = maxInFlight
        route.upstreamMaxConnections = maxConnections
        route.preflight = preflight
        return route
    }

    /// Required, a metric label (letters, digits, `-`, `_`), and one route's only.
    private func name(_ claims: inout Claims) -> String {
        let name = r.string(s, .name) ?? ""
        if s[.name] == nil { r.reportMissing(s, .name, "is required") }
        else if name.isEmpty || !name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) {
            r.report(s, .name, "'\(name)' must be letters, digits, - or _ (it labels metrics)")
        } else if let first = claims.names[name] {
            r.report(s, .name, "'\(name)' is already the name of routes[\(first)]")
        } else { claims.names[name] = index }
        return name
    }

    /// Normalized as requests' hosts are (`RequestHost`): lower case, one trailing dot removed.
    private func host() -> String? {
        guard let v = r.string(s, .host) else { return nil }
        var name = v.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        guard HostName.isValid(name, allowingUnderscore: true) else {
            r.report(s, .host, "'\(v)' is not a host name (no port, no scheme)")
            return nil
        }
        return name
    }

    private func pathPrefix() -> String {
        guard let v = r.string(s, .pathPrefix) else { return "/" }
        guard GatewayConfiguration.isCanonicalPrefix(v) else {
            r.report(s, .pathPrefix, "'\(v)' must be a canonical path starting with / (no dot segments, no %, no //, no query)")
            return "/"
        }
        return v
    }

    private func upstream() -> UpstreamURL? {
        if s[.upstream] == nil {
            r.reportMissing(s, .upstream, "is required (e.g. http://127.0.0.1:9000)")
            return nil
        }
        guard let v = r.string(s, .upstream) else { return nil }
        switch UpstreamURL.parse(v) {
        case .success(let u): return u
        case .failure(.scheme): r.report(s, .upstream, "'\(v)': an upstream is http://host:port or https://host:port")
        case .failure(.path): r.report(s, .upstream, "'\(v)': an upstream is an origin (http://host:port), without path or query")
        case .failure(.authority): r.report(s, .upstream, "'\(v)' has no valid host:port")
        }
        return nil
    }

    private func allow(auth: GatewayConfiguration.AuthMode) -> GatewayConfiguration.Allow {
        guard let a = r.section(s, .allow, keys: GatewayConfiguration.Allow.Key.self) else { return GatewayConfiguration.Allow() }
        let allow = GatewayConfiguration.Allow(a, r)
        if auth == .public, !allow.isEmpty {
            r.report(s, .allow, "an allow list has no effect on a public route")
        }
        return allow
    }

    /// No two routes answer the same host and path prefix.
    private func claim(host: String?, prefix: String, _ claims: inout Claims) {
        let match = "\(host ?? "*") \(prefix)"
        if let first = claims.matches[match] {
            r.report(s, .pathPrefix, "routes[\(first)] already matches host \(host ?? "(any)") and path_prefix \(prefix)")
        } else { claims.matches[match] = index }
    }

    /// A `Host` value: a name or address, an optional port; nothing else.
    private func upstreamHost() -> String? {
        guard let v = r.string(s, .upstreamHost) else { return nil }
        guard ListenAddress.parse(v) != nil || ListenAddress.parse(v + ":80") != nil else {
            r.report(s, .upstreamHost, "'\(v)' is not a host or host:port")
            return nil
        }
        return v
    }

    /// A path on our origin, or an absolute http(s) URL whose origin parses.
    private func postLogoutRedirect() -> String? {
        guard let v = r.string(s, .postLogoutRedirect) else { return nil }
        let isPath = v.hasPrefix("/") && !v.hasPrefix("//") && !v.contains("\\")
        let scheme = v.hasPrefix("https://") ? "https://" : v.hasPrefix("http://") ? "http://" : nil
        let isURL = scheme.map { GatewayConfiguration.parseOrigin($0 + v.dropFirst($0.count).prefix { $0 != "/" && $0 != "?" }) != nil } ?? false
        guard isPath || isURL, v.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f }) else {
            r.report(s, .postLogoutRedirect, "'\(v)' is not a path (/bye) or an http(s) URL")
            return nil
        }
        return v
    }

    private func upstreamServerName() -> String? {
        guard let v = r.string(s, .upstreamServerName) else { return nil }
        guard HostName.isValid(v, allowingUnderscore: false) else {
            r.report(s, .upstreamServerName, "'\(v)' is not a host name")
            return nil
        }
        return v
    }

    /// Only a route that knows its user can require a link, and only with somewhere to send them.
    private func requireLink(auth: GatewayConfiguration.AuthMode) -> Bool {
        let requireLink = r.bool(s, .requireLink) ?? false
        if requireLink, auth == .public {
            r.report(s, .requireLink, "needs auth: required or optional (a public route knows no user)")
        }
        if requireLink, linkURL == nil {
            r.report(s, .requireLink, "needs identity.link_url: where an unlinked user is sent")
        }
        return requireLink
    }

    private func skipVerify() -> Bool {
        let skipVerify = r.bool(s, .upstreamInsecureSkipVerify) ?? false
        if skipVerify {
            r.warn(s, .upstreamInsecureSkipVerify,
                   "INSECURE: the upstream's certificate is not verified, so anyone on the network path can read and change this route's traffic, identity headers included; for tests only, never in production")
        }
        return skipVerify
    }

    /// The upstream TLS keys apply to an https:// upstream, and verification is either skipped
    /// or given a CA, not both.
    private func checkTLSKeys(upstream: UpstreamURL?, skipVerify: Bool, caFile: String?) {
        if let upstream, !upstream.tls {
            for key in Key.tlsOnly where s[key] != nil {
                r.report(s, key, "applies only to an https:// upstream")
            }
        }
        if skipVerify, caFile != nil {
            r.report(s, .upstreamInsecureSkipVerify, "contradicts upstream_ca_file; keep one")
        }
    }
}
