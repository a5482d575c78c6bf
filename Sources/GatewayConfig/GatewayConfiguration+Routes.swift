extension GatewayConfiguration.Route {
    enum Key: String, ConfigKey {
        case name, host, pathPrefix = "path_prefix", upstream, auth, allow, unauthenticated
        case maxBodyBytes = "max_body_bytes", allowTrace = "allow_trace", stripPrefix = "strip_prefix"
        case upstreamHost = "upstream_host", postLogoutRedirect = "post_logout_redirect"
        case upstreamCAFile = "upstream_ca_file", upstreamServerName = "upstream_server_name"
        case upstreamInsecureSkipVerify = "upstream_insecure_skip_verify", requireLink = "require_link"
        case upstreamReuse = "upstream_reuse", maxInFlight = "max_in_flight", preflight
        case upstreamMaxConnections = "upstream_max_connections"

        /// The keys that mean something only to an https:// upstream.
        static let tlsOnly: [Key] = [.upstreamCAFile, .upstreamServerName, .upstreamInsecureSkipVerify]
    }

    /// Reads `routes`: at least one, each read by a `RouteReader`; a route whose entry is not
    /// a mapping, or has no valid upstream, is left out (its problems reported).
    /// - Parameter linkURL: `identity.link_url`, which `require_link` needs.
    static func readAll(_ root: ConfigReader.Section<GatewayConfiguration.Key>, _ r: ConfigReader, linkURL: String?) -> [Self] {
        guard let list = r.sequence(root, .routes) else {
            if root[.routes] == nil { r.report(root.child(.routes), nil, "at least one route is required") }
            return []
        }
        if list.isEmpty { r.report(root.child(.routes), root[.routes]?.mark, "at least one route is required") }
        var claims = RouteReader.Claims()
        return list.enumerated().compactMap { index, node in
            guard let s = r.section(node, path: "\(root.child(.routes))[\(index)]", keys: Key.self) else { return nil }
            return RouteReader(r: r, s: s, index: index, linkURL: linkURL).read(&claims)
        }
    }
}

extension GatewayConfiguration.Allow {
    enum Key: String, ConfigKey {
        case users, emails, emailDomains = "email_domains"
    }

    /// Reads a route's `allow`.
    init(_ a: ConfigReader.Section<Key>, _ r: ConfigReader) {
        self.init()
        users = r.list(a, .users, what: "an Apple user id (sub)", parse: { $0.isEmpty ? nil : $0 }) ?? []
        emails = r.list(a, .emails, what: "an email address", parse: { e in
            e.filter { $0 == "@" }.count == 1 && !e.hasPrefix("@") && !e.hasSuffix("@") ? e.lowercased() : nil
        }) ?? []
        emailDomains = r.list(a, .emailDomains, what: "a domain (example.com)", parse: { d in
            HostName.isValid(d, allowingUnderscore: false) ? d.lowercased() : nil
        }) ?? []
    }

    var isEmpty: Bool { users.isEmpty && emails.isEmpty && emailDomains.isEmpty }
}
