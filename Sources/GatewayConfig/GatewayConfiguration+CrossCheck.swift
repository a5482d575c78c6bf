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
        guard routes.contains(where: { $0.auth != .public }) else { return }
        checkSignIn(r, root)
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
        if session.cookieName.hasPrefix("__Host-"), let url = server.publicURL, !url.hasPrefix("https://"), !Self.isLoopbackOrigin(url) {
            r.warn(Self.path(.session, Session.Key.cookieName), sessionMark,
                   "a __Host- cookie is only kept by browsers over https (or on localhost); server.public_url is \(url)")
        }
    }

    /// `section.key`, the path of a key of a top-level section.
    private static func path(_ section: Key, _ key: some ConfigKey) -> String { "\(section.rawValue).\(key.rawValue)" }
}
