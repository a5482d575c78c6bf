/// The rules for values more than one section uses: origins, URLs, tokens, path prefixes.
/// Host names have their own: `HostName`.
extension GatewayConfiguration {
    /// `scheme://host[:port]` with an optional trailing `/`; returns it without the slash.
    static func parseOrigin(_ text: String) -> String? {
        var t = Substring(text)
        if t.hasSuffix("/") { t = t.dropLast() }
        let scheme: String
        if t.hasPrefix("https://") { scheme = "https://" } else if t.hasPrefix("http://") { scheme = "http://" } else { return nil }
        let authority = t.dropFirst(scheme.count)
        guard !authority.isEmpty, !authority.contains(where: { "/?#@ ".contains($0) }) else { return nil }
        if ListenAddress.parse(String(authority)) == nil, ListenAddress.parse(String(authority) + ":1") == nil { return nil }
        return String(t)
    }

    static func isLoopbackOrigin(_ origin: String) -> Bool {
        originAddress(origin)?.isLoopback ?? false
    }

    /// The host name of an origin as a request's `Host` names it (`RequestHost.name`): lower
    /// case, no port, an IPv6 literal bracketed (`https://App.example.com:8443` → `app.example.com`).
    public static func hostName(ofOrigin origin: String) -> String {
        guard let host = originAddress(origin)?.host.lowercased() else { return "" }
        return host.contains(":") ? "[" + host + "]" : host
    }

    /// An origin's authority as an address (a port of 1 when it names none).
    private static func originAddress(_ origin: String) -> ListenAddress? {
        let authority = origin.split(separator: "/").last.map(String.init) ?? ""
        return ListenAddress.parse(authority) ?? ListenAddress.parse(authority + ":1")
    }

    /// `http://` or `https://`, a host, then an optional port and path: no credentials, no
    /// fragment, no spaces or control characters.
    public static func isWebURL(_ value: String) -> Bool {
        let lower = value.lowercased()
        guard let rest = ["http://", "https://"].first(where: lower.hasPrefix).map({ value.dropFirst($0.count) }) else { return false }
        guard !value.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7f }), !value.contains("#") else { return false }
        let authority = rest.prefix { $0 != "/" && $0 != "?" }
        guard !authority.contains("@") else { return false }
        let host = authority.hasPrefix("[") ? authority.prefix { $0 != "]" } : authority.prefix { $0 != ":" }
        return !host.isEmpty && host != "["
    }

    /// RFC 9110 token characters (header and cookie names).
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }

    /// A path prefix as routing compares it: `/`, or segments without dot segments, `%`, `?`,
    /// `#`, `\` or `;`, with an optional trailing `/`.
    static func isCanonicalPrefix(_ text: String) -> Bool {
        guard text.hasPrefix("/") else { return false }
        if text == "/" { return true }
        let body = text.hasSuffix("/") ? String(text.dropFirst().dropLast()) : String(text.dropFirst())
        return body.split(separator: "/", omittingEmptySubsequences: false).allSatisfy { segment in
            !segment.isEmpty && segment != "." && segment != ".."
                && segment.utf8.allSatisfy { b in b > 0x20 && b < 0x7f && !"%?#\\;".utf8.contains(b) }
        }
    }
}

extension GatewayConfiguration.Apple {
    /// An Apple Team ID or key id: ten upper-case letters and digits.
    public static func isIdentifier(_ text: String) -> Bool {
        text.count == 10 && text.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber) }
    }
}
