import NIOCore
import NIOHPACK

/// An HTTP/2 request's header block, checked by HTTP/2's own rules (RFC 9113 §8.2–§8.3), then
/// presented to admission as the HTTP/1.1 head it stands for: written as HTTP/1.1 bytes
/// (`METHOD :path HTTP/1.1`, `host: <:authority>`, the fields) and read by the wire engine's
/// strict `HeadParser`. The header rules, target parsing, routing, guard, identity-header
/// stripping and upstream head that follow are HTTP/1's, unchanged: the two protocols cannot
/// disagree about a request.
///
/// What changes on the way (RFC 9113 §8.2.3, §8.3.1): `:authority` becomes the `host` line (a
/// `host` field must name the same host, and is then dropped); `cookie` fields are joined with
/// `"; "` into one line where the first was; a body without `content-length` is announced as
/// `transfer-encoding: chunked`, the framing its DATA frames get upstream.
struct HTTP2RequestHead {
    /// The head admission reads.
    var head: WireHead
    /// How the body reaches the upstream.
    var body: Body

    enum Body: Equatable {
        /// The HEADERS frame ended the stream (or announced `content-length: 0`).
        case none
        /// `content-length`: the DATA frames pass as they are (NIOHTTP2 checks that they add up
        /// to it).
        case length(Int)
        /// No `content-length`: each DATA frame goes upstream as a chunk.
        case chunked
    }

    /// Checks `headers` and makes the head, or says why the request is refused.
    /// - Parameters:
    ///   - endStream: the HEADERS frame carried END_STREAM (there is no body).
    ///   - maxHeadBytes, maxFields: the bounds on the head made (`server.limits`); over them the
    ///     request is `tooLarge` (431).
    static func make(_ headers: HPACKHeaders, endStream: Bool, maxHeadBytes: Int, maxFields: Int) -> Result<HTTP2RequestHead, HTTP2RequestRefusal> {
        var pseudo = Pseudo()
        var sawField = false
        var hosts: [String] = []
        var cookies: [String] = []
        var contentLength: Int? = nil
        // Regular fields in order; the first cookie's place is kept for the joined line.
        var fields: [(name: String, value: String)] = []
        var cookieIndex: Int? = nil
        fields.reserveCapacity(headers.count)

        for (name, value, _) in headers {
            if let refusal = Self.checkValue(value) { return .failure(refusal) }
            if name.utf8.first == UInt8(ascii: ":") {
                if sawField { return .failure(.pseudoHeaderAfterField(name)) }
                if let refusal = pseudo.set(name, value) { return .failure(refusal) }
                continue
            }
            sawField = true
            if let refusal = Self.checkName(name) { return .failure(refusal) }
            switch name {
            case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
                return .failure(.connectionSpecificField(name))
            case "te":
                guard value == "trailers" else { return .failure(.teNotTrailers) }
                fields.append((name, value))
            case "host":
                hosts.append(value)
            case "cookie":
                if cookieIndex == nil {
                    cookieIndex = fields.count
                    fields.append((name, ""))
                }
                cookies.append(value)
            case "content-length":
                guard let length = Self.contentLength(value), contentLength == nil || contentLength == length else {
                    return .failure(.invalidContentLength)
                }
                contentLength = length
                fields.append((name, value))
            default:
                fields.append((name, value))
            }
        }
        if let cookieIndex { fields[cookieIndex].value = cookies.joined(separator: "; ") }

        guard let method = pseudo.method else { return .failure(.missingPseudoHeader(":method")) }
        // CONNECT has neither :scheme nor :path (RFC 9113 §8.5): refused as what it is.
        if method == "CONNECT" || pseudo.hasProtocol { return .failure(.connect) }
        guard let scheme = pseudo.scheme else { return .failure(.missingPseudoHeader(":scheme")) }
        guard let path = pseudo.path else { return .failure(.missingPseudoHeader(":path")) }
        guard !method.isEmpty, method.utf8.allSatisfy(HeadParser.isToken) else { return .failure(.invalidMethod) }
        guard scheme == "http" || scheme == "https" else { return .failure(.invalidScheme) }
        guard Self.isOriginForm(path) || (path == "*" && method == "OPTIONS") else { return .failure(.invalidPath) }

        let host: String
        switch (pseudo.authority, hosts.count) {
        case (nil, 0): return .failure(.missingAuthority)
        case (nil, 1): host = hosts[0]
        case (nil, _): return .failure(.invalidAuthority)
        case (let authority?, _):
            guard case .success(let named) = RequestHost.parse(authority) else { return .failure(.invalidAuthority) }
            for other in hosts {
                guard case .success(let parsed) = RequestHost.parse(other) else { return .failure(.invalidAuthority) }
                if parsed != named { return .failure(.authorityHostMismatch) }
            }
            host = authority
        }

        let body: Body
        if endStream {
            if let contentLength, contentLength > 0 { return .failure(.contentLengthWithoutBody) }
            body = .none
        } else if let contentLength {
            body = contentLength > 0 ? .length(contentLength) : .none
        } else {
            body = .chunked
        }

        var bytes = ByteBuffer()
        bytes.reserveCapacity(64 + path.utf8.count + host.utf8.count + fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count + 4 })
        bytes.writeString(method)
        bytes.writeStaticString(" ")
        bytes.writeString(path)
        bytes.writeStaticString(" HTTP/1.1\r\nhost: ")
        bytes.writeString(host)
        bytes.writeStaticString("\r\n")
        for (name, value) in fields {
            bytes.writeString(name)
            bytes.writeStaticString(": ")
            bytes.writeString(value)
            bytes.writeStaticString("\r\n")
        }
        if body == .chunked { bytes.writeStaticString("transfer-encoding: chunked\r\n") }
        bytes.writeStaticString("\r\n")

        var parser = HeadParser(kind: .request, maxHeadBytes: maxHeadBytes, maxFields: maxFields)
        do {
            guard let head = try parser.parse(&bytes) else { return .failure(.malformedHead("incomplete head")) }
            return .success(HTTP2RequestHead(head: head, body: body))
        } catch {
            switch error {
            case .tooLarge(let reason): return .failure(.tooLarge(reason))
            case .malformed(let reason): return .failure(.malformedHead(reason))
            }
        }
    }

    /// The four request pseudo-headers, each at most once.
    private struct Pseudo {
        var method: String?
        var scheme: String?
        var path: String?
        var authority: String?
        var hasProtocol = false

        mutating func set(_ name: String, _ value: String) -> HTTP2RequestRefusal? {
            func once(_ slot: inout String?) -> HTTP2RequestRefusal? {
                if slot != nil { return .duplicatePseudoHeader(name) }
                slot = value
                return nil
            }
            switch name {
            case ":method": return once(&method)
            case ":scheme": return once(&scheme)
            case ":path": return once(&path)
            case ":authority": return once(&authority)
            case ":protocol":
                // Extended CONNECT (RFC 8441): not offered, whatever the method.
                if hasProtocol { return .duplicatePseudoHeader(name) }
                hasProtocol = true
                return nil
            default: return .unknownPseudoHeader(name)
            }
        }
    }

    /// A value holds no CR, LF or NUL (RFC 9113 §8.2.1), no other control character (RFC 9110
    /// §5.5), and starts and ends with neither space nor tab.
    private static func checkValue(_ value: String) -> HTTP2RequestRefusal? {
        var invalid = false
        for byte in value.utf8 {
            if byte == 0x00 || byte == 0x0A || byte == 0x0D { return .forbiddenCharacter }
            if (byte < 0x20 && byte != 0x09) || byte == 0x7F { invalid = true }
        }
        if invalid { return .invalidValue }
        if let first = value.utf8.first, first == 0x20 || first == 0x09 { return .surroundingWhitespace }
        if let last = value.utf8.last, last == 0x20 || last == 0x09 { return .surroundingWhitespace }
        return nil
    }

    /// A regular field's name: lower-case token characters, at least one (RFC 9113 §8.2.1).
    private static func checkName(_ name: String) -> HTTP2RequestRefusal? {
        if name.isEmpty { return .invalidName }
        for byte in name.utf8 {
            if byte == 0x00 || byte == 0x0A || byte == 0x0D { return .forbiddenCharacter }
            if byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") { return .upperCaseName }
        }
        return name.utf8.allSatisfy(HeadParser.isToken) ? nil : .invalidName
    }

    /// `/` followed by request-target bytes (VCHAR: no space, control or non-ASCII byte).
    private static func isOriginForm(_ path: String) -> Bool {
        guard path.utf8.first == UInt8(ascii: "/") else { return false }
        return path.utf8.allSatisfy(HeadParser.isTargetByte)
    }

    /// Digits only, at most 18 of them.
    private static func contentLength(_ value: String) -> Int? {
        guard !value.isEmpty, value.utf8.count <= 18, value.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int(value)
    }
}
