/// Which `Origin`s may open a WebSocket through the proxy or post to the gateway's own
/// state-changing endpoints (cross-site WebSocket hijacking and login/logout CSRF).
///
/// A browser sends `Origin` on every WebSocket handshake and every cross-origin POST. Admitted:
/// no `Origin` at all (native apps, curl — no browser to trick); the request's own host
/// (`Origin`'s host and port equal the normalized `Host`, http or https — a TLS terminator in
/// front changes the scheme); and the configured origins (`server.public_url`,
/// `server.allowed_origins`), compared exactly after normalization. Everything else is refused,
/// `Origin: null` (sandboxed frames, some redirects) and anything that does not parse included.
/// A sibling subdomain is a different origin even though it is the same *site*, which is
/// exactly the case `SameSite=Lax` does not protect.
public struct OriginPolicy: Sendable, Equatable {
    /// Normalized `scheme://host[:port]` (default ports dropped).
    public let allowed: Set<String>

    public init(allowedOrigins: [String]) {
        allowed = Set(allowedOrigins.compactMap { Self.parse($0.hasSuffix("/") ? String($0.dropLast()) : $0).map(\.normalized) })
    }

    /// Only the request's own host (and requests without `Origin`).
    public static let sameHost = OriginPolicy(allowedOrigins: [])

    /// Whether a request with this `Origin` (nil: none sent) to `host` is admitted.
    public func admits(origin: String?, host: RequestHost?) -> Bool {
        guard let origin else { return true }
        guard let parsed = Self.parse(origin) else { return false }
        if allowed.contains(parsed.normalized) { return true }
        guard let host else { return false }
        return parsed.host.name == host.name && parsed.effectivePort == (host.port ?? parsed.defaultPort)
    }

    struct Parsed {
        var scheme: String
        var host: RequestHost
        var defaultPort: Int { scheme == "https" ? 443 : 80 }
        var effectivePort: Int { host.port ?? defaultPort }
        var normalized: String {
            effectivePort == defaultPort ? "\(scheme)://\(host.name)" : "\(scheme)://\(host.name):\(effectivePort)"
        }
    }

    /// `http(s)://host[:port]` with nothing after the authority (RFC 6454 serialization).
    static func parse(_ text: String) -> Parsed? {
        let lower = text.lowercased()
        let scheme: String
        if lower.hasPrefix("https://") { scheme = "https" } else if lower.hasPrefix("http://") { scheme = "http" } else { return nil }
        let authority = String(lower.dropFirst(scheme.count + 3))
        guard !authority.contains("/"), !authority.contains("@"), case .success(let host) = RequestHost.parse(authority) else { return nil }
        return Parsed(scheme: scheme, host: host)
    }
}
