import NIOHTTP1

/// Framing of a message body, decided from its headers.
enum BodyFraming: Equatable {
    case none
    case contentLength(Int)
    case chunked
}

/// What the one pass over a request's headers found (`docs/security.md`: framing, hop-by-hop,
/// identity headers, forwarding headers), and what of the head goes upstream: the client's
/// field lines as received, less those the rules remove or rewrite (`edits`).
struct InboundRequest {
    /// The head as received.
    var head: WireHead
    /// The normalized `Host` (`RequestHost`); the upstream receives it in this form.
    var host: RequestHost?
    var framing: BodyFraming
    /// The client wants the connection kept after this exchange.
    var keepAlive: Bool
    /// `Upgrade: websocket` with `Connection: upgrade`.
    var isWebSocketUpgrade: Bool
    /// An `Authorization: Bearer` credential was sent (the guard decides whose it is).
    var hasBearer: Bool = false
    /// Field lines not sent upstream as received, in order: removed (hop-by-hop, Connection-
    /// named, identity, forwarding) or rewritten (`Host`, `Cookie`, `Transfer-Encoding`).
    /// Empty in the common case: the fields are copied in one piece.
    var edits: [FieldEdit] = []
    /// A WebSocket handshake's `Upgrade` value: it and `Connection: Upgrade` are written anew.
    var upgrade: String? = nil
    /// A trusted proxy's `X-Forwarded-For` chain, to append the peer to.
    var forwardedFor: String?
    var forwardedProto: String?
    var requestID: String?
    /// A trusted proxy's W3C trace context (when the gateway traces): its `traceparent`, if it
    /// sent exactly one, and its `tracestate` lines joined.
    var traceParent: String? = nil
    var traceState: String? = nil

    struct FieldEdit: Equatable {
        /// Index into `head.fields`.
        var index: Int
        /// nil: removed; otherwise the value written instead (with the field's name as sent).
        var value: String?
    }

    /// The fields as the upstream receives them before the proxy adds its own (diagnostics and
    /// tests; forwarding writes bytes, `UpstreamRequestHead`).
    var upstreamHeaders: HTTPHeaders {
        var headers = HTTPHeaders()
        var edits = self.edits[...]
        for (index, field) in head.fields.enumerated() {
            if let edit = edits.first, edit.index == index {
                edits = edits.dropFirst()
                if let value = edit.value { headers.add(name: head.name(field), value: value) }
                continue
            }
            headers.add(name: head.name(field), value: head.value(field))
        }
        if let upgrade {
            headers.add(name: "Connection", value: "Upgrade")
            headers.add(name: "Upgrade", value: upgrade)
        }
        return headers
    }
}

enum RequestRejection: Error, Equatable {
    /// 400 and close: framing in doubt.
    case badRequest(String)
    /// 417: an `Expect` other than `100-continue` (RFC 9110 §10.1.1).
    case expectationFailed
}

/// The header rules of the proxy, fixed per route table.
/// A class: one per routing snapshot, read by every request (a struct of five arrays was copied,
/// and each retained, on every request).
final class RequestHeaderRules: Sendable {
    /// Identity header names, lower-case with `_` folded to `-`: the configured ones, then
    /// `foreignIdentityNames`.
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
    /// The gateway traces requests: a client's `traceparent` and `tracestate` are removed (the
    /// proxy sends its own), and a trusted proxy's are read. Otherwise they pass untouched.
    let tracesRequests: Bool

    init(identityHeaders: [String], identityPrefix: String = "", hiddenCookies: [String] = [], tracesRequests: Bool = false) {
        self.tracesRequests = tracesRequests
        self.strippedNames = (identityHeaders + Self.foreignIdentityNames).map(HeaderName.normalize)
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

    /// One pass over the request head: validates framing and decides which field lines go
    /// upstream. Values are read as `String`s only for the fields the rules interpret.
    func inspect(_ head: WireHead, peerTrusted: Bool) -> Result<InboundRequest, RequestRejection> {
        // Framing is the wire engine's one rule (the reader already framed the body by it).
        let framing: BodyFraming
        do {
            switch try MessageFraming.request(head) {
            case .chunked: framing = .chunked
            case .contentLength(let length): framing = length > 0 ? .contentLength(length) : .none
            case .untilClose: framing = .none  // never for a request
            }
        } catch {
            return .failure(.badRequest(error.description))
        }
        var rawHost: String? = nil
        var hostIndex = 0
        var hostCount = 0
        var unknownExpectation = false
        var hasBearer = false
        var connectionTokens: [String] = []
        var upgradeValue: String? = nil
        var forwardedFor: String? = nil
        var forwardedProto: String? = nil
        var requestID: String? = nil
        var traceParents: [String] = []
        var traceState: String? = nil
        var edits: [InboundRequest.FieldEdit] = []
        /// Fields whose fate depends on `Connection` (read to the end first).
        var others: [Int] = []

        for (index, field) in head.fields.enumerated() {
            let name = head.name(field)
            switch Self.classifyRequest(name) {
            case .host:
                hostCount += 1
                rawHost = head.value(field)
                hostIndex = index
            case .expect:
                // RFC 9110 §10.1.1: only 100-continue is defined; every Expect must be it.
                if !head.valueIs(field, "100-continue") { unknownExpectation = true }
            case .authorization:
                let value = head.value(field)
                if value.utf8.count > 7, HeaderName.equals(value.prefix(7), "bearer ") { hasBearer = true }
            case .contentLength:
                break
            case .transferEncoding:
                // `chunked` in any case (framing checked it), written as exactly `chunked`: a
                // backend must frame the body as the proxy did.
                if !head.valueIsExactly(field, "chunked") { edits.append(.init(index: index, value: "chunked")) }
            case .connection:
                HeaderName.appendTokens(of: head.value(field), to: &connectionTokens)
                edits.append(.init(index: index, value: nil))
            case .upgrade:
                upgradeValue = head.value(field)
                edits.append(.init(index: index, value: nil))
            case .hopByHop, .lookalike:
                edits.append(.init(index: index, value: nil))
            case .forwarding(let which):
                if peerTrusted {
                    let value = head.value(field)
                    switch which {
                    case .forwardedFor: forwardedFor = forwardedFor.map { "\($0), \(value)" } ?? value
                    case .forwardedProto: forwardedProto = value
                    case .other: break
                    }
                }
                // always removed: the proxy writes the canonical ones.
                edits.append(.init(index: index, value: nil))
            case .requestID:
                if peerTrusted {
                    let value = head.value(field)
                    if Self.isValidRequestID(value) { requestID = value }
                }
                edits.append(.init(index: index, value: nil))
            case .cookie:
                guard !hiddenCookies.isEmpty else { break }
                // The common case of a browser or app of ours: the session cookie alone, removed
                // without decoding the value.
                if head.valueIsOnePair(field, startingWithAnyOf: hiddenCookieMarkers) {
                    edits.append(.init(index: index, value: nil))
                    break
                }
                let value = head.value(field)
                if hiddenCookieMarkers.contains(where: { HeaderName.contains(value, $0) }) {
                    edits.append(.init(index: index, value: cookieWithoutHidden(value)))
                }
            case .other:
                if tracesRequests, let trace = Self.traceField(name) {
                    if peerTrusted {
                        let value = head.value(field)
                        switch trace {
                        case .parent: traceParents.append(value)
                        case .state: traceState = traceState.map { $0 + "," + value } ?? value
                        }
                    }
                    edits.append(.init(index: index, value: nil))
                } else if isIdentityHeader(name) {
                    edits.append(.init(index: index, value: nil))
                } else {
                    others.append(index)
                }
            }
        }
        if hostCount > 1 { return .failure(.badRequest("duplicate Host")) }
        if hostCount == 0, head.version.major == 1, head.version.minor >= 1 { return .failure(.badRequest("missing Host")) }
        var host: RequestHost? = nil
        if let rawHost {
            switch RequestHost.parse(rawHost) {
            case .success(let parsed): host = parsed
            case .failure(let rejection): return .failure(.badRequest("invalid Host: \(rejection.rawValue)"))
            }
            if let host, host.authority != rawHost { edits.append(.init(index: hostIndex, value: host.authority)) }
        }
        // An HTTP/1.0 client's Expect is ignored (RFC 9110 §10.1.1).
        if unknownExpectation, head.version.minor >= 1 { return .failure(.expectationFailed) }

        // Fields the client named in `Connection` are hop-by-hop too (RFC 9110 §7.6.1).
        let named = connectionTokens.filter { $0 != "close" && $0 != "keep-alive" && $0 != "upgrade" }
        if !named.isEmpty {
            for index in others where named.contains(where: { head.nameEquals(head.fields[index], $0) }) {
                edits.append(.init(index: index, value: nil))
            }
        }
        edits.sort { $0.index < $1.index }

        var keepAlive = head.version.minor >= 1
        if connectionTokens.contains("close") { keepAlive = false }
        if head.version.minor == 0, connectionTokens.contains("keep-alive") { keepAlive = true }
        let isWebSocket = connectionTokens.contains("upgrade") && upgradeValue.map { HeaderName.equals($0, "websocket") } == true
        return .success(InboundRequest(
            head: head, host: host, framing: framing, keepAlive: keepAlive, isWebSocketUpgrade: isWebSocket, hasBearer: hasBearer,
            edits: edits, upgrade: isWebSocket ? (upgradeValue ?? "websocket") : nil, forwardedFor: forwardedFor,
            forwardedProto: forwardedProto, requestID: requestID, traceParent: traceParents.count == 1 ? traceParents[0] : nil,
            traceState: traceState))
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

    /// Identity headers other authenticating proxies set and apps trust, removed from every
    /// client request on every route (public ones too) whatever `identity.*` says: an app moved
    /// behind SessionGate from one of those proxies still believes them, and a client could
    /// otherwise send `Remote-User: admin`. Authelia sends `Remote-User`, `-Groups`, `-Email` and
    /// `-Name`; Authentik's outposts send the user's `X-authentik-*` headers (not the `-meta-`
    /// ones, which name the outpost); Apache front ends pass `REMOTE_USER` on as `X-Remote-User`
    /// (and siblings); Grafana's auth proxy mode reads `X-WEBAUTH-USER` by default. oauth2-proxy's `X-Forwarded-User`, `-Email`, `-Groups` and
    /// `-Preferred-Username` are not listed: the whole `X-Forwarded-*` family is removed from
    /// every peer, trusted or not (`forwardingPrefixes`). The README's "What the proxy does to
    /// every request" shows this table; `identity.strip_headers` adds names.
    static let foreignIdentityNames = [
        "remote-user", "remote-groups", "remote-email", "remote-name",
        "x-authentik-username", "x-authentik-groups", "x-authentik-entitlements", "x-authentik-email", "x-authentik-name",
        "x-authentik-uid", "x-authentik-jwt",
        "x-remote-user", "x-remote-groups", "x-remote-email", "x-remote-name",
        "x-webauth-user",
    ]

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
    static func classify(_ name: String) -> Kind { classify(bytes: name.utf8) }

    /// `classify` for a name's bytes: one classifier for request and response fields, whether
    /// the name is a `String` or a field of a received head (`WireHead.kind(of:)`).
    static func classify<Name: Collection<UInt8>>(bytes name: Name) -> Kind {
        let kind = classifyFolded(name)
        switch kind {
        case .other: return kind
        case .forwarding: return name.contains(UInt8(ascii: "_")) ? .forwarding(.other) : kind
        default: return name.contains(UInt8(ascii: "_")) ? .lookalike : kind
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

    private static func classifyFolded<Name: Collection<UInt8>>(_ name: Name) -> Kind {
        @inline(__always) func eq(_ literal: StaticString) -> Bool { HeaderName.equalsNormalized(bytes: name, literal) }
        switch name.count {
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

    enum TraceField { case parent, state }

    /// `traceparent` or `tracestate`, in any case.
    static func traceField(_ name: String) -> TraceField? {
        switch name.utf8.count {
        case 11: return HeaderName.equals(name, "traceparent") ? .parent : nil
        case 10: return HeaderName.equals(name, "tracestate") ? .state : nil
        default: return nil
        }
    }

    static func isValidRequestID(_ value: String) -> Bool {
        !value.isEmpty && value.utf8.count <= 128 && value.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_") || b == UInt8(ascii: ".")
        }
    }
}
