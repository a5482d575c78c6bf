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
    var host: String?
    var framing: BodyFraming
    /// The client wants the connection kept after this exchange.
    var keepAlive: Bool
    /// `Upgrade: websocket` with `Connection: upgrade`.
    var isWebSocketUpgrade: Bool
    /// Headers for the upstream: hop-by-hop, Connection-named, identity and untrusted forwarding
    /// headers removed; forwarding headers and the request id not yet added.
    var upstreamHeaders: HTTPHeaders
    /// A trusted proxy's `X-Forwarded-For` chain, to append the peer to.
    var forwardedFor: String?
    var forwardedProto: String?
    var forwardedHost: String?
    var requestID: String?
}

enum RequestRejection: Error, Equatable {
    /// 400 and close: framing in doubt.
    case badRequest(String)
}

/// The header rules of the proxy, fixed per route table.
struct RequestHeaderRules: Sendable {
    /// Identity header names, lower-case with `_` folded to `-`.
    let strippedNames: [String]
    /// The gateway's own cookies: removed from the `Cookie` header sent upstream.
    let hiddenCookies: [String]
    private let hiddenCookieMarkers: [String]

    init(identityHeaders: [String], hiddenCookies: [String] = []) {
        self.strippedNames = identityHeaders.map(HeaderName.normalize)
        self.hiddenCookies = hiddenCookies
        self.hiddenCookieMarkers = hiddenCookies.map { $0 + "=" }
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
        var host: String? = nil
        var hostCount = 0
        var contentLength: Int? = nil
        var contentLengthCount = 0
        var transferEncodingCount = 0
        var chunked = false
        var connectionTokens: [String] = []
        var upgradeValue: String? = nil
        var drop = false
        var forwardedFor: String? = nil
        var forwardedProto: String? = nil
        var forwardedHost: String? = nil
        var requestID: String? = nil

        for (name, value) in head.headers {
            switch Self.classify(name) {
            case .host:
                hostCount += 1
                host = value
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
            case .connection:
                connectionTokens += HeaderName.tokens(value)
                drop = true
            case .upgrade:
                upgradeValue = value
                drop = true
            case .hopByHop:
                drop = true
            case .forwarding(let which):
                if peerTrusted {
                    switch which {
                    case .forwardedFor: forwardedFor = forwardedFor.map { "\($0), \(value)" } ?? value
                    case .forwardedProto: forwardedProto = value
                    case .forwardedHost: forwardedHost = value
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
                if name.utf8.count <= maxIdentityNameLength, strippedNames.contains(where: { HeaderName.equalsNormalized(name, $0) }) {
                    drop = true
                }
            }
        }
        if hostCount > 1 { return .failure(.badRequest("duplicate Host")) }
        if hostCount == 0, head.version.major == 1, head.version.minor >= 1 { return .failure(.badRequest("missing Host")) }
        if contentLengthCount > 1 { return .failure(.badRequest("duplicate Content-Length")) }
        if transferEncodingCount > 1 { return .failure(.badRequest("duplicate Transfer-Encoding")) }
        if transferEncodingCount > 0, contentLengthCount > 0 { return .failure(.badRequest("both Content-Length and Transfer-Encoding")) }
        if transferEncodingCount > 0, head.version.minor == 0 { return .failure(.badRequest("Transfer-Encoding in HTTP/1.0")) }
        if let host, host.isEmpty || host.utf8.contains(where: { $0 <= 0x20 || $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "@") || $0 == 0x7f }) {
            return .failure(.badRequest("invalid Host"))
        }

        let framing: BodyFraming = chunked ? .chunked : (contentLength.map { $0 > 0 ? .contentLength($0) : .none } ?? .none)
        var keepAlive = head.version.minor >= 1
        if connectionTokens.contains("close") { keepAlive = false }
        if head.version.minor == 0, connectionTokens.contains("keep-alive") { keepAlive = true }
        let isWebSocket = connectionTokens.contains("upgrade") && upgradeValue.map { HeaderName.equals($0, "websocket") } == true

        var headers: HTTPHeaders
        if drop {
            // Remove hop-by-hop, Connection-named, identity and forwarding headers, then (for
            // a WebSocket handshake) put back exactly the hop-by-hop pair it needs.
            let named = connectionTokens.filter { $0 != "close" && $0 != "keep-alive" && $0 != "upgrade" }
            headers = HTTPHeaders()
            for (name, value) in head.headers {
                switch Self.classify(name) {
                case .connection, .upgrade, .hopByHop, .forwarding, .requestID: continue
                case .other:
                    if name.utf8.count <= maxIdentityNameLength, strippedNames.contains(where: { HeaderName.equalsNormalized(name, $0) }) { continue }
                    if !named.isEmpty, named.contains(where: { HeaderName.equals(name, $0) }) { continue }
                case .cookie:
                    if let kept = cookieWithoutHidden(value) { headers.add(name: name, value: kept) }
                    continue
                case .host, .contentLength, .transferEncoding: break
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
            host: host, framing: framing, keepAlive: keepAlive, isWebSocketUpgrade: isWebSocket,
            upstreamHeaders: headers, forwardedFor: forwardedFor, forwardedProto: forwardedProto,
            forwardedHost: forwardedHost, requestID: requestID))
    }

    private var maxIdentityNameLength: Int { strippedNames.map(\.utf8.count).max() ?? 0 }

    enum Forwarding { case forwardedFor, forwardedProto, forwardedHost, other }

    enum Kind {
        case host, contentLength, transferEncoding, connection, upgrade, hopByHop, requestID, cookie, other
        case forwarding(Forwarding)
    }

    /// RFC 9110 §7.6.1 hop-by-hop fields, plus the forwarding fields only trusted proxies set.
    static func classify(_ name: String) -> Kind {
        switch name.utf8.count {
        case 2: if HeaderName.equals(name, "te") { return .hopByHop }
        case 4: if HeaderName.equals(name, "host") { return .host }
        case 6: if HeaderName.equals(name, "cookie") { return .cookie }
        case 7:
            if HeaderName.equals(name, "upgrade") { return .upgrade }
            if HeaderName.equals(name, "trailer") { return .hopByHop }
        case 9:
            if HeaderName.equals(name, "forwarded") { return .forwarding(.other) }
            if HeaderName.equals(name, "x-real-ip") { return .forwarding(.other) }
        case 10:
            if HeaderName.equals(name, "connection") { return .connection }
            if HeaderName.equals(name, "keep-alive") { return .hopByHop }
        case 12: if HeaderName.equals(name, "x-request-id") { return .requestID }
        case 13:
            if HeaderName.equals(name, "x-rewrite-url") { return .forwarding(.other) }
        case 14:
            if HeaderName.equals(name, "content-length") { return .contentLength }
            if HeaderName.equals(name, "x-original-url") { return .forwarding(.other) }
            if HeaderName.equals(name, "x-original-uri") { return .forwarding(.other) }
        case 15:
            if HeaderName.equals(name, "x-forwarded-for") { return .forwarding(.forwardedFor) }
        case 16:
            if HeaderName.equals(name, "proxy-connection") { return .hopByHop }
            if HeaderName.equals(name, "x-forwarded-host") { return .forwarding(.forwardedHost) }
            if HeaderName.equals(name, "x-forwarded-port") { return .forwarding(.other) }
        case 17:
            if HeaderName.equals(name, "transfer-encoding") { return .transferEncoding }
            if HeaderName.equals(name, "x-forwarded-proto") { return .forwarding(.forwardedProto) }
        case 18: if HeaderName.equals(name, "proxy-authenticate") { return .hopByHop }
        case 19: if HeaderName.equals(name, "proxy-authorization") { return .hopByHop }
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
