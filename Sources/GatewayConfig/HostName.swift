/// The one rule for a host name written in the configuration: RFC 1123 §2.1 — labels of 1 to 63
/// ASCII letters, digits and `-`, neither beginning nor ending with `-`, joined by single dots;
/// at most 253 characters (RFC 1035 §2.3.4). A dotted IPv4 address passes as well.
///
/// `_` is the one thing uses differ on, so each says:
/// - a route's `host` is compared with a request's `Host`, whose parser (`RequestHost` in
///   HTTPProxy) admits `_` because internal and container names carry it
///   (`under_score.internal`): the route must be able to name every host a request can;
/// - a name sent out (SNI: `upstream_server_name`, `store.tls.server_name`), a host `rd` may
///   name (`allowed_redirect_hosts`, whose check admits no `_`) and an email domain
///   (`allow.email_domains`, RFC 5321) refuse it.
///
/// The name is checked as written: no port, no scheme, no trailing dot. A caller that accepts
/// the fully qualified form (`example.com.`) drops the dot first, as `RequestHost` does.
///
/// `host:port` values (`listen`, `upstream`, `upstream_host`, `redis_url`, the sentinels, the
/// origins) are read by `ListenAddress.parse` instead: an address parser that other modules
/// call at run time too (the https redirect, the command line), so its name check (letters,
/// digits, `.`, `-`) stays its own.
enum HostName {
    static let maximumLength = 253
    static let maximumLabelLength = 63

    static func isValid(_ name: some StringProtocol, allowingUnderscore: Bool) -> Bool {
        guard !name.isEmpty, name.utf8.count <= maximumLength else { return false }
        return name.split(separator: ".", omittingEmptySubsequences: false).allSatisfy { label in
            !label.isEmpty && label.utf8.count <= maximumLabelLength && !label.hasPrefix("-") && !label.hasSuffix("-")
                && label.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || (allowingUnderscore && $0 == "_")) }
        }
    }
}
