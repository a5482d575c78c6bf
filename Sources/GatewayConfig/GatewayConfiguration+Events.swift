extension GatewayConfiguration.Events {
    enum Key: String, ConfigKey {
        case url, urls, timeout
    }

    /// The kinds of event, each a key of `events.urls`.
    enum Kind: String, ConfigKey {
        case userRevoked = "user.revoked", userDeleted = "user.deleted", userEmailChanged = "user.email_changed"
        case sessionEnded = "session.ended", userTransferred = "user.transferred"
    }

    /// Reads `events`: URLs and timeout; events are signed, so they need the assertion key.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader, assertion: GatewayConfiguration.Identity.Assertion) {
        if let v = r.string(s, .url) { url = Self.webURL(v, s, .url, r) }
        if let u = r.section(s, .urls, keys: Kind.self) {
            for kind in Kind.allCases {
                if let v = r.string(u, kind), let url = Self.webURL(v, u, kind, r) { urls[kind.rawValue] = url }
            }
        }
        if let v = r.duration(s, .timeout, atLeast: .milliseconds(100)) { timeout = v }
        if isEnabled, !assertion.enabled {
            r.report(s.path, s.mark, "needs identity.assertion (enabled, with key_file): events are signed with that key, and the app verifies them with /_auth/jwks.json")
        }
    }

    private static func webURL<K>(_ value: String, _ s: ConfigReader.Section<K>, _ key: K, _ r: ConfigReader) -> String? {
        guard GatewayConfiguration.isWebURL(value) else {
            r.report(s, key, "'\(value)' is not an http:// or https:// URL with a host")
            return nil
        }
        return value
    }
}
