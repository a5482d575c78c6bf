import HTTPProxy

/// Where a user goes after signing in (`rd`), validated by the rules of `docs/security.md`
/// "Redirects": a path on our own origin, or an https URL on an allow-listed host (exact, or
/// a `.example.com` suffix). Everything else — `//x`, `/\x`, encoded variants, control
/// characters, userinfo, other schemes — is refused and the user lands on `/`.
public struct ReturnURLPolicy: Sendable {
    /// Our own origin (`server.public_url`); an absolute URL on it is reduced to its path.
    public var origin: String?
    /// Lower-case host names; an entry starting with `.` matches any subdomain.
    public var allowedHosts: [String]
    /// Hosts an `http://` URL may name: the gateway's own routed hosts while `public_url` is
    /// plain http itself (a loopback or private setup), so that a sign-in started on one of them
    /// can return there. Every other absolute URL is https.
    public var plainHTTPHosts: Set<String>

    public static let maximumLength = 2048

    public init(origin: String?, allowedHosts: [String], plainHTTPHosts: Set<String> = []) {
        self.origin = origin
        self.allowedHosts = allowedHosts.map { $0.lowercased() }
        self.plainHTTPHosts = Set(plainHTTPHosts.map { $0.lowercased() })
    }

    /// The validated return URL, or nil when `rd` must not be followed.
    public func validate(_ rd: String) -> String? {
        guard !rd.isEmpty, rd.utf8.count <= Self.maximumLength else { return nil }
        // Raw or encoded, no control character, space or backslash anywhere.
        guard let decoded = FormBody.decode(Array(rd.utf8)[...], plusIsSpace: false), Self.isClean(rd), Self.isClean(decoded) else { return nil }
        if rd.hasPrefix("/") {
            return Self.isSafePath(rd) && Self.isSafePath(decoded) ? rd : nil
        }
        let lower = rd.lowercased()
        if let origin, lower.hasPrefix(origin.lowercased() + "/") {
            let path = String(rd.dropFirst(origin.utf8.count))
            return validate(path)
        }
        let plain = lower.hasPrefix("http://")
        guard lower.hasPrefix("https://") || plain && !plainHTTPHosts.isEmpty else { return nil }
        let afterScheme = rd.dropFirst(plain ? "http://".count : "https://".count)
        let authority = afterScheme.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.isEmpty, !authority.contains("@"), !authority.contains("%") else { return nil }
        var host = authority.lowercased()
        if let colon = host.lastIndex(of: ":"), !host.hasSuffix("]") {
            guard host[host.index(after: colon)...].allSatisfy(\.isNumber) else { return nil }
            host = String(host[..<colon])
        }
        guard host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }) else { return nil }
        let rest = afterScheme.dropFirst(authority.count)
        guard rest.isEmpty || rest.hasPrefix("/") && Self.isSafePath(String(rest)) || rest.hasPrefix("?") else { return nil }
        if plain { return plainHTTPHosts.contains(host) ? rd : nil }
        let allowed = allowedHosts.contains { entry in
            entry.hasPrefix(".") ? host.hasSuffix(entry) && host.count > entry.count : host == entry
        }
        return allowed ? rd : nil
    }

    private static func isClean(_ text: String) -> Bool {
        text.utf8.allSatisfy { $0 > 0x20 && $0 != 0x7f && $0 != UInt8(ascii: "\\") }
    }

    /// A path that stays on our origin: one leading `/`, never `//` (a scheme-relative URL once
    /// dot segments or a browser's normalization are applied).
    private static func isSafePath(_ path: String) -> Bool {
        let pathPart = path.prefix { $0 != "?" && $0 != "#" }
        guard pathPart.hasPrefix("/"), !pathPart.contains("//") else { return false }
        let segments = pathPart.split(separator: "/", omittingEmptySubsequences: false)
        // `/./` and `/../` reshape the path (`/.//x`); a return URL has no reason to hold them.
        return !segments.contains { $0 == "." || $0 == ".." }
    }
}
