import NIOHTTP1

/// Framing of a message body, decided from its headers.
enum BodyFraming: Equatable {
    case none
    case contentLength(Int)
    case chunked
}

/// What the one pass over a request's headers found (`docs/security.md`: framing, hop-by-hop,
/// identity headers, forwarding headers).
struct InboundRequest {
    /// The normalized `Host` (`RequestHost`); the upstream receives it in this form.
    var host: RequestHost?
    var framing: BodyFraming
    /// The client wants the connection kept after this exchange.
    var keepAlive: Bool
    /// `Upgrade: websocket` with `Connection: upgrade`.
    var isWebSocketUpgrade: Bool
    /// An `Authorization: Bearer` credential was sent (the guard decides whose it is).
    var hasBearer: Bool = false
    /// Headers for the upstream: hop-by-hop, Connection-named, identity and untrusted forwarding
    /// headers removed; forwarding headers and the request id not yet added.
    var upstreamHeaders: HTTPHeaders
    /// A trusted proxy's `X-Forwarded-For` chain, to append the peer to.
    var forwardedFor: String?
    var forwardedProto: String?
    var requestID: String?
}

enum RequestRejection: Error, Equatable {
    /// 400 and close: framing in doubt.
    case badRequest(String)
    /// 417: an `Expect` other than `100-continue` (RFC 9110 §10.1.1).
    case expectationFailed
}

/// The header rules of the proxy, fixed per route table.
struct RequestHeaderRules: Sendable {
    /// Identity header names, lower-case with `_` folded to `-`.
    let strippedNames: [String]
    /// Every client header whose name starts with this (folded like `strippedNames`) is removed:
    /// `x-auth-` by default, so an identity header the gateway does not set (`X-Auth-Role`)
    /// cannot be spoofed either. Empty: no prefix rule.
    let strippedPrefix: String
    /// The gateway's own cookies: removed from the `Cookie` header sent upstream, and from the
    /// upstream's `Set-Cookie` (an app must not fix a browser onto a session it chose).
    let hiddenCookies: [String]
    private let hiddenCookieMarkers: [String]
    private let hiddenCookiesLower: [String]
    private let maxIdentityNameLength: Int

    init(identityHeaders: [String], identityPrefix: String = "", hiddenCookies: [String] = []) {
        self.strippedNames = identityHeaders.map(HeaderName.normalize)
        self.strippedPrefix = HeaderName.normalize(identityPrefix)
        self.hiddenCookies = hiddenCookies
        self.hiddenCookieMarkers = hiddenCookies.map { $0 + "=" }
        self.hiddenCookiesLower = hiddenCookies.map { $0.lowercased() }
        self.maxIdentityNameLength = strippedNames.map(\.utf8.count).max() ?? 0
    }

    /// Whether a client header is an identity header: a configured name or under the prefix,
    /// in any case, `_` or `-`.
    @inline(__always)
    func isIdentityHeader(_ name: String) -> Bool {
        if !strippedPrefix.isEmpty, HeaderName.hasNormalizedPrefix(name, strippedPrefix) { return true }
        return name.utf8.count <= maxIdentityNameLength && strippedNames.contains { HeaderName.equalsNormalized(name, $0) }
    }

    /// Whether an upstream `Set-Cookie` value sets one of the gateway's cookies. Cookie names
    /// compare exactly, except that browsers treat the `__Host-`/`__Secure-` prefixes without
    /// regard to case: the whole name is compared without case, which covers both.
    func setsHiddenCookie(_ value: String) -> Bool {
        guard !hiddenCookies.isEmpty else { return false }
        let name = Substring(value).trimmingSpaces.prefix { $0 != "=" }.trimmingSpaces
        return hiddenCookiesLower.contains { HeaderName.equalsIgnoringCase(name, $0) }
    }

    /// Whether a response header from the app is withheld from the client: a `Set-Cookie` for
    /// one of the gateway's own cookies (no app may fix a browser onto a session it chose).
    @inline(__always)
    func withholdsResponseHeader(_ name: String, _ value: String) -> Bool {
        !hiddenCookies.isEmpty && HeaderName.equals(name, "set-cookie") && setsHiddenCookie(value)
    }

    /// A `Cookie` value without the hidden cookies; nil when nothing is left.
    func cookieWithoutHidden(_ value: String) -> String? {
        guard !hiddenCookies.isEmpty else { return value }
        // The common case of an API client: only our cookie, nothing to keep.
        if !value.utf8.contains(UInt8(ascii: ";")), hiddenCookieMarkers.contains(where: { value.hasPrefix($0) }) { return nil }
        let kept = value.split(separator: ";").filter { pair in
            let name = pair.drop { $0 == " " || $0 == "\t" }.prefix { $0 != "=" }
            return !hiddenCookies.contains { name == $0 }
        }
        let joined = kept.map { $0.drop { $0 == " " || $0 == "\t" } }.joined(separator: "; ")
        return joined.isEmpty ? nil : joined
    }

    /// One pass over the request head: validates framing and builds the upstream header list.
    func inspect(_ head: HTTPRequestHead, peerTrusted: Bool) -> Result<InboundRequest, RequestRejection> {
        var rawHost: String? = nil
        var hostCount = 0
        var unknownExpectation = false
        var hasBearer = false
        var contentLength: Int? = nil
        var contentLengthCount = 0
        var transferEncodingCount = 0
        var chunked = false
        var connectionTokens: [String] = []
        var upgradeValue: String? = nil
        var drop = false
        var forwardedFor: String? = nil
        var forwardedProto: String? = nil
        var requestID: String? = nil

        for (name, value) in head.headers {
            switch Self.classifyRequest(name) {
            case .host:
                hostCount += 1
                rawHost = value
            case .expect:
                // RFC 9110 §10.1.1: only 100-continue is defined; every Expect must be it.
                if !HeaderName.equals(Substring(value).trimmingSpaces, "100-continue") { unknownExpectation = true }
            case .authorization:
                let v = Substring(value).trimmingSpaces
                if v.utf8.count > 7, HeaderName.equals(v.prefix(7), "bearer ") { hasBearer = true }
            case .contentLength:
                contentLengthCount += 1
                guard !value.isEmpty, value.utf8.count <= 18, value.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int(value) else {
                    return .failure(.badRequest("invalid Content-Length"))
                }
                contentLength = n
            case .transferEncoding:
                transferEncodingCount += 1
                chunked = HeaderName.equals(value, "chunked")
                if !chunked { return .failure(.badRequest("unsupported Transfer-Encoding")) }
                // NIO's encoder frames the upstream body only for exactly `chunked`: any other
                // spelling would send the decoded chunks raw (request smuggling). Written anew.
                if value != "chunked" { drop = true }
            case .connection:
                connectionTokens += HeaderName.tokens(value)
                drop = true
            case .upgrade:
                upgradeValue = value
                drop = true
            case .hopByHop, .lookalike:
                drop = true
            case .forwarding(let which):
                if peerTrusted {
                    switch which {
                    case .forwardedFor: forwardedFor = forwardedFor.map { "\($0), \(value)" } ?? value
                    case .forwardedProto: forwardedProto = value
                    case .other: break
                    }
                }
                // always dropped here: the proxy writes the canonical ones back.
                drop = true
            case .requestID:
                if peerTrusted, Self.isValidRequestID(value) { requestID = value }
                drop = true
            case .cookie:
                if hiddenCookieMarkers.contains(where: { HeaderName.contains(value, $0) }) { drop = true }
            case .other:
                if isIdentityHeader(name) { drop = true }
            }
        }
        if hostCount > 1 { return .failure(.badRequest("duplicate Host")) }
        if hostCount == 0, head.version.major == 1, head.version.minor >= 1 { return .failure(.badRequest("missing Host")) }
        if contentLengthCount > 1 { return .failure(.badRequest("duplicate Content-Length")) }
        if transferEncodingCount > 1 { return .failure(.badRequest("duplicate Transfer-Encoding")) }
        if transferEncodingCount > 0, contentLengthCount > 0 { return .failure(.badRequest("both Content-Length and Transfer-Encoding")) }
        if transferEncodingCount > 0, head.version.minor == 0 { return .failure(.badRequest("Transfer-Encoding in HTTP/1.0")) }
        var host: RequestHost? = nil
        if let rawHost {
            switch RequestHost.parse(rawHost) {
            case .success(let parsed): host = parsed
            case .failure(let rejection): return .failure(.badRequest("invalid Host: \(rejection.rawValue)"))
            }
        }
        // An HTTP/1.0 client's Expect is ignored (RFC 9110 §10.1.1).
        if unknownExpectation, head.version.minor >= 1 { return .failure(.expectationFailed) }
        let rewriteHost = host.map { $0.authority != rawHost } ?? false

        let framing: BodyFraming = chunked ? .chunked : (contentLength.map { $0 > 0 ? .contentLength($0) : .none } ?? .none)
        var keepAlive = head.version.minor >= 1
        if connectionTokens.contains("close") { keepAlive = false }
        if head.version.minor == 0, connectionTokens.contains("keep-alive") { keepAlive = true }
        let isWebSocket = connectionTokens.contains("upgrade") && upgradeValue.map { HeaderName.equals($0, "websocket") } == true

        var headers: HTTPHeaders
        if drop || rewriteHost {
            // Remove hop-by-hop, Connection-named, identity and forwarding headers, then (for
            // a WebSocket handshake) put back exactly the hop-by-hop pair it needs.
            let named = connectionTokens.filter { $0 != "close" && $0 != "keep-alive" && $0 != "upgrade" }
            headers = HTTPHeaders()
            for (name, value) in head.headers {
                switch Self.classifyRequest(name) {
                case .connection, .upgrade, .hopByHop, .forwarding, .requestID, .lookalike: continue
                case .host:
                    if let host, rewriteHost { headers.add(name: name, value: host.authority); continue }
                case .other:
                    if isIdentityHeader(name) { continue }
                    if !named.isEmpty, named.contains(where: { HeaderName.equals(name, $0) }) { continue }
                case .cookie:
                    if let kept = cookieWithoutHidden(value) { headers.add(name: name, value: kept) }
                    continue
                case .transferEncoding:
                    headers.add(name: "Transfer-Encoding", value: "chunked")
                    continue
                case .contentLength, .expect, .authorization: break
                }
                headers.add(name: name, value: value)
            }
            if isWebSocket {
                headers.add(name: "Connection", value: "Upgrade")
                headers.add(name: "Upgrade", value: upgradeValue ?? "websocket")
            }
        } else {
            headers = head.headers
        }
        return .success(InboundRequest(
            host: host, framing: framing, keepAlive: keepAlive, isWebSocketUpgrade: isWebSocket, hasBearer: hasBearer,
            upstreamHeaders: headers, forwardedFor: forwardedFor, forwardedProto: forwardedProto,
            requestID: requestID))
    }

    /// The two forwarding headers a trusted proxy's value is kept for. `X-Forwarded-Host` is
    /// not one: the app always receives the host the request was routed by (a load balancer
    /// passing a client's `X-Forwarded-Host` through must not make the app serve another
    /// virtual host than the one that was checked).
    enum Forwarding { case forwardedFor, forwardedProto, other }

    enum Kind {
        case host, contentLength, transferEncoding, connection, upgrade, hopByHop, requestID, cookie, expect, authorization, other
        case forwarding(Forwarding)
        /// A spelling with `_` of a header the proxy interprets (`Content_Length`, `X_Request_Id`):
        /// never interpreted, always removed, because CGI-style apps read it as the real one.
        case lookalike
    }

    /// Forwarding headers outside `X-Forwarded-*` and `X-Original-*`: only `server.trusted_proxies`
    /// may send them, and even theirs are removed (the proxy writes its own `X-Forwarded-For`,
    /// `-Proto` and `-Host`). Apps and frameworks read each of these as the client's address,
    /// scheme, host or path. The README's "What the proxy does to every request" lists them.
    static let forwardingNames = [
        "forwarded", "x-real-ip", "x-client-ip", "true-client-ip", "x-cluster-client-ip", "cf-connecting-ip", "fastly-client-ip",
        "x-originating-ip", "x-remote-ip", "x-remote-addr", "x-proxyuser-ip", "x-rewrite-url", "x-http-destinationurl", "front-end-https",
        "x-scheme", "x-url-scheme", "x-host",
    ]
    /// Whole families of forwarding headers (`X-Forwarded-Uri`, `-Prefix`, `-Ssl`, `-Scheme`,
    /// `-Server`, `-Port`; `X-Original-URL`, `-URI`, `-Host`; Envoy's internal headers).
    static let forwardingPrefixes = ["x-forwarded-", "x-original-", "x-envoy-"]

    /// RFC 9110 §7.6.1 hop-by-hop fields and the framing and routing fields, compared without
    /// case and with `_` as `-`. Only the `-` spelling is interpreted.
    static func classify(_ name: String) -> Kind {
        let kind = classifyFolded(name)
        switch kind {
        case .other: return kind
        case .forwarding: return name.utf8.contains(UInt8(ascii: "_")) ? .forwarding(.other) : kind
        default: return name.utf8.contains(UInt8(ascii: "_")) ? .lookalike : kind
        }
    }

    /// `classify` plus the whole forwarding family (a request's headers only: responses never
    /// need the family checked).
    static func classifyRequest(_ name: String) -> Kind {
        let kind = classify(name)
        if case .other = kind, isForwardingFamily(name) { return .forwarding(.other) }
        return kind
    }

    private static func isForwardingFamily(_ name: String) -> Bool {
        let count = name.utf8.count
        // Every name in the family starts with x, f, t or c (any case).
        guard count >= 6, let first = name.utf8.first.map({ $0 | 0x20 }),
              first == UInt8(ascii: "x") || first == UInt8(ascii: "f") || first == UInt8(ascii: "t") || first == UInt8(ascii: "c") else { return false }
        for prefix in forwardingPrefixes where count > prefix.utf8.count && HeaderName.hasNormalizedPrefix(name, prefix) { return true }
        for known in forwardingNames where HeaderName.equalsNormalized(name, known) { return true }
        return false
    }

    private static func classifyFolded(_ name: String) -> Kind {
        @inline(__always) func eq(_ literal: String) -> Bool { HeaderName.equalsNormalized(name, literal) }
        switch name.utf8.count {
        case 2: if eq("te") { return .hopByHop }
        case 4: if eq("host") { return .host }
        case 6:
            if eq("cookie") { return .cookie }
            if eq("expect") { return .expect }
        case 7:
            if eq("upgrade") { return .upgrade }
            if eq("trailer") { return .hopByHop }
        case 10:
            if eq("connection") { return .connection }
            if eq("keep-alive") { return .hopByHop }
        case 12: if eq("x-request-id") { return .requestID }
        case 13: if eq("authorization") { return .authorization }
        case 14: if eq("content-length") { return .contentLength }
        case 15: if eq("x-forwarded-for") { return .forwarding(.forwardedFor) }
        case 16:
            if eq("proxy-connection") { return .hopByHop }
            if eq("x-forwarded-host") { return .forwarding(.other) }
        case 17:
            if eq("transfer-encoding") { return .transferEncoding }
            if eq("x-forwarded-proto") { return .forwarding(.forwardedProto) }
        case 18: if eq("proxy-authenticate") { return .hopByHop }
        case 19: if eq("proxy-authorization") { return .hopByHop }
        default: break
        }
        return .other
    }

    static func isValidRequestID(_ value: String) -> Bool {
        !value.isEmpty && value.utf8.count <= 128 && value.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_") || b == UInt8(ascii: ".")
        }
    }
}
