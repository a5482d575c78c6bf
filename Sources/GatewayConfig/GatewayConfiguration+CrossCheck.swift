extension GatewayConfiguration {
    /// What no section can check alone: listeners that share a port, and what sign-in needs once
    /// a route asks for it. Each problem is located at the section that holds (or lacks) the key.
    func crossCheck(_ r: ConfigReader, _ root: ConfigReader.Section<Key>) {
        let serverMark = root[.server]?.mark
        let wildcard = ["0.0.0.0", "::"]
        if let redirect = server.redirectHTTPListen {
            if server.tls == nil {
                r.report(Self.path(.server, Server.Key.redirectHTTPListen), serverMark, "needs server.tls: it sends clients to the https listener")
            }
            for (key, other) in [(Server.Key.listen, server.listen), (.adminListen, server.adminListen)]
            where redirect.port != 0 && redirect.port == other.port && (redirect.host == other.host || wildcard.contains(redirect.host) || wildcard.contains(other.host)) {
                r.report(Self.path(.server, Server.Key.redirectHTTPListen), serverMark, "\(redirect) is also \(Self.path(.server, key)) (\(other)); give it its own port")
            }
        }
        if server.listen.port != 0, server.listen.port == server.adminListen.port,
           server.listen.host == server.adminListen.host || wildcard.contains(server.listen.host) || wildcard.contains(server.adminListen.host) {
            r.report(Self.path(.server, Server.Key.adminListen), "\(server.adminListen) is the public listener's address (server.listen \(server.listen)); give the admin listener its own port")
        }
        if server.http2Cleartext, server.tls != nil {
            r.report(Self.path(.server, Server.Key.http2Cleartext), "is for a listener without server.tls; with TLS, HTTP/2 is offered by server.tls.alpn")
        }
        checkAppleReturnURL(r)
        guard routes.contains(where: { $0.auth != .public }) else { return }
        checkSignIn(r, root)
    }

    /// Apple's return URL is `public_url` + `auth_prefix` + `/callback`, and Apple accepts only
    /// https to a domain name (no IP address, no `localhost`: apple-sign-in.md §1.1, §11.7). With
    /// Apple's own `base_url` any other is an error here rather than Apple's error page at every
    /// sign-in. With another `base_url` (the Apple ID simulator) the simulator judges: it takes
    /// loopback http only behind its explicit `--allow-http-loopback`.
    private func checkAppleReturnURL(_ r: ConfigReader) {
        guard let apple, Self.isApplesOwn(baseURL: apple.baseURL), let url = server.publicURL,
              let problem = Self.appleReturnURLProblem(publicURL: url) else { return }
        r.report(Self.path(.server, Server.Key.publicURL),
                 "\(problem): Apple refuses the return URL \(url)\(server.authPrefix)/callback (https and a domain name only); with the Apple ID simulator, set apple.base_url to it")
    }

    /// Whether `base_url` (an origin) is Apple's own `appleid.apple.com`.
    static func isApplesOwn(baseURL: String) -> Bool {
        let authority = baseURL.lowercased().split(separator: "/").dropFirst().first.map(String.init) ?? ""
        let host = authority.prefix { $0 != ":" }
        return host == "appleid.apple.com" || host == "appleid.apple.com."
    }

    /// Why Apple would refuse `public_url` (an origin) as the base of its return URL, or nil.
    static func appleReturnURLProblem(publicURL: String) -> String? {
        let lower = publicURL.lowercased()
        guard lower.hasPrefix("https://") else { return "not https" }
        let authority = String(lower.dropFirst("https://".count))
        if authority.hasPrefix("[") { return "an IP address" }
        let host = authority.prefix { $0 != ":" }
        let name = host.hasSuffix(".") ? host.dropLast() : host
        if name == "localhost" || name.hasSuffix(".localhost") { return "localhost" }
        if IPAddress.parse(String(name)) != nil || name.allSatisfy({ $0.isNumber || $0 == "." }) { return "an IP address" }
        if !name.contains(".") { return "not a domain name" }  // as the simulator's `Team.isDomainName`
        return nil
    }

    /// A route that needs sign-in needs Apple, a public URL and a session secret.
    private func checkSignIn(_ r: ConfigReader, _ root: ConfigReader.Section<Key>) {
        let which = "a route has auth 'required' or 'optional'"
        if apple == nil { r.report(root.child(.apple), nil, "is required: \(which) and sign-in needs Sign in with Apple") }
        if server.publicURL == nil {
            r.report(Self.path(.server, Server.Key.publicURL), root[.server]?.mark,
                     "is required: \(which); Apple's redirect_uri is public_url + auth_prefix + /callback")
        }
        let sessionMark = root[.session]?.mark
        if session.secretFile == nil {
            if store.redisURL != nil {
                r.report(Self.path(.session, Session.Key.secretFile), sessionMark, "is required with store.redis_url: every instance must sign and read the same cookies")
            } else {
                r.warn(Self.path(.session, Session.Key.secretFile), sessionMark, "not set: a random secret is made at start, so sessions end when the gateway restarts")
            }
        }
        if let domain = session.cookieDomain {
            let path = Self.path(.session, Session.Key.cookieDomain)
            if session.cookieName.hasPrefix("__Host-") {
                r.report(path, sessionMark, "a __Host- cookie (session.cookie_name '\(session.cookieName)') cannot have a Domain; name it like __Secure-sessiongate")
            }
            if let url = server.publicURL {
                let host = Self.hostName(ofOrigin: url)
                if host != domain, !host.hasSuffix("." + domain) {
                    r.report(path, sessionMark, "'\(domain)' does not hold server.public_url's host \(host): that host sets the cookie, so it must be the domain or under it")
                }
            }
        }
        if session.cookieName.hasPrefix("__Host-"), let url = server.publicURL, !url.hasPrefix("https://"), !Self.isLoopbackOrigin(url) {
            r.warn(Self.path(.session, Session.Key.cookieName), sessionMark,
                   "a __Host- cookie is only kept by browsers over https (or on localhost); server.public_url is \(url)")
        }
    }

    /// `section.key`, the path of a key of a top-level section.
    private static func path(_ section: Key, _ key: some ConfigKey) -> String { "\(section.rawValue).\(key.rawValue)" }
}
