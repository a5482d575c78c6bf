import NIOCore
import NIOHTTP1

/// An upstream's response head as the client receives it: the status line written by the
/// proxy (HTTP/1.1, its own reason phrase), the app's field lines copied byte for byte except
/// those the rules remove, then the proxy's own fields. Nothing is decoded into `String`s but
/// the values the rules must read (`Connection`, a `Set-Cookie` when the gateway hides cookies).
struct ResponseHead {
    let head: WireHead
    /// `Content-Length` was sent (the body passes as it is).
    private(set) var hasContentLength = false
    /// The app set `X-Request-Id` itself.
    private(set) var hasRequestID = false
    /// The `Connection` tokens, lower-cased.
    private(set) var connectionTokens: [String] = []

    init(_ head: WireHead) {
        self.head = head
        for field in head.fields {
            if head.nameIs(field, "content-length") {
                hasContentLength = true
            } else if head.nameIs(field, "connection") {
                HeaderName.appendTokens(of: head.value(field), to: &connectionTokens)
            } else if head.nameIs(field, "x-request-id") {
                hasRequestID = true
            }
        }
    }

    var status: Int { head.status }

    /// What the proxy adds to a relayed head.
    struct Additions {
        var requestID: String?
        var chunked = false
        var keepAlive = true
        var clientVersion: HTTPVersion = .http1_1
    }

    /// The head for the client of a final (2xx–5xx) response.
    func write(rules: RequestHeaderRules?, _ additions: Additions, into buffer: inout ByteBuffer) {
        HTTPWire.writeStatusLine(HTTPResponseStatus(statusCode: head.status), into: &buffer)
        let named = connectionNamed
        copyFields(into: &buffer) { relays($0, named: named, rules: rules) }
        if !hasRequestID, let id = additions.requestID { HTTPWire.writeHeader("x-request-id", id, into: &buffer) }
        if additions.chunked { buffer.writeStaticString("transfer-encoding: chunked\r\n") }
        HTTPWire.writeConnection(ExchangeRules.connectionField(keepAlive: additions.keepAlive, clientVersion: additions.clientVersion), into: &buffer)
        buffer.writeStaticString("\r\n")
    }

    /// Fields the app named in `Connection`: hop-by-hop too (RFC 9110 §7.6.1).
    var connectionNamed: [String] { connectionTokens.filter { $0 != "close" && $0 != "keep-alive" } }

    /// Whether a field of a final response reaches the client, over HTTP/1.1 and HTTP/2 alike:
    /// not hop-by-hop or framing (`Connection`, `Upgrade`, `Transfer-Encoding`, `Keep-Alive`, …),
    /// not named in `Connection` (`named`), not `Content-Length` on a 204, not a `Set-Cookie`
    /// for one of the gateway's cookies.
    @inline(__always)
    func relays(_ field: WireField, named: [String], rules: RequestHeaderRules?) -> Bool {
        switch head.kind(of: field) {
        case .hopByHop, .connection, .upgrade, .transferEncoding: return false
        case .contentLength where head.status == 204: return false
        case .other where !named.isEmpty && named.contains(where: { head.nameEquals(field, $0) }):
            // Only ordinary fields: an app answering `Connection: content-length` must not
            // make the proxy relay a body without its length on a kept-alive connection.
            return false
        default: return !withholds(field, rules)
        }
    }

    /// The head of a 101 that opens a WebSocket tunnel: `Connection` and `Upgrade` stay (the
    /// client needs them), framing and other hop-by-hop fields go.
    func writeUpgrade(rules: RequestHeaderRules?, into buffer: inout ByteBuffer) {
        HTTPWire.writeStatusLine(.switchingProtocols, into: &buffer)
        copyFields(into: &buffer) { field in
            switch head.kind(of: field) {
            case .hopByHop, .transferEncoding, .contentLength: return false
            default: return !withholds(field, rules)
            }
        }
        buffer.writeStaticString("\r\n")
    }

    /// A `Set-Cookie` for one of the gateway's own cookies.
    private func withholds(_ field: WireField, _ rules: RequestHeaderRules?) -> Bool {
        guard let rules, !rules.hiddenCookies.isEmpty, head.nameIs(field, "set-cookie") else { return false }
        return rules.setsHiddenCookie(head.value(field))
    }

    /// Copies the field lines `keep` accepts as they were received, in runs: consecutive kept
    /// lines are one copy.
    private func copyFields(into buffer: inout ByteBuffer, keep: (WireField) -> Bool) {
        head.bytes.withUnsafeReadableBytes { raw in
            var runStart = Int(head.fieldsStart)
            var runEnd = runStart
            for field in head.fields {
                if keep(field) {
                    runEnd = Int(field.lineEnd)
                    continue
                }
                if runEnd > runStart { buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[runStart..<runEnd])) }
                runStart = Int(field.lineEnd)
                runEnd = runStart
            }
            if runEnd > runStart { buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[runStart..<runEnd])) }
        }
    }
}

extension WireHead {
    /// Whether the field's name is `lower` (a lower-case `String` of letters, digits and `-`),
    /// without regard to case.
    func nameEquals(_ field: WireField, _ lower: String) -> Bool {
        guard Int(field.nameLength) == lower.utf8.count else { return false }
        return bytes.withUnsafeReadableBytes { raw in
            var i = Int(field.nameStart)
            for byte in lower.utf8 {
                guard raw[i] | 0x20 == byte else { return false }
                i += 1
            }
            return true
        }
    }
}
