#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOCore
import NIOHTTP1

/// Reads HTTP/1.x message heads (RFC 9112 §2–§5) from received bytes without decoding them:
/// the result records where the method, target, version and each field are (`WireHead`).
///
/// Strictness is the proxy's contract (`docs/security.md`, *HTTP/1.1 framing*): every line ends
/// in CRLF (a bare LF or CR is refused), one SP between the parts of the start line, only
/// HTTP/1.0 and HTTP/1.1, field names of token characters directly followed by `:`, no
/// obs-fold, no control character but HTAB in a value. Empty lines before a request line are
/// skipped (RFC 9112 §2.2). A head longer than `maxHeadBytes` (start line and fields) or with
/// more than `maxFields` fields is `tooLarge` (431). Where this is stricter than NIO's llhttp
/// decoder, `WireDifferentialTests` lists it with the reason.
///
/// Resumable: `parse` returns nil until the head is complete, remembering the lines it has read,
/// and consumes nothing until then; a bad line is refused as soon as its line end arrives.
struct HeadParser {
    enum Kind {
        case request
        case response
    }

    let kind: Kind
    let maxHeadBytes: Int
    let maxFields: Int

    /// Offset (from the reader index) up to which the buffer was scanned for line ends, and
    /// where the line being scanned starts.
    private var scanned = 0
    private var lineStart = 0
    /// The head read so far, line by line (its bytes are set when it is complete).
    private var pending = HeadParser.blank()
    private var sawStartLine = false

    init(kind: Kind, maxHeadBytes: Int = 16 * 1024, maxFields: Int = 100) {
        self.kind = kind
        self.maxHeadBytes = maxHeadBytes
        self.maxFields = maxFields
    }

    /// Takes one head from the front of `buffer` when all of it has arrived; nil (and nothing
    /// consumed) while more is needed. Each line is checked as soon as its CRLF arrives.
    mutating func parse(_ buffer: inout ByteBuffer) throws(WireError) -> WireHead? {
        let result: Result<Int?, WireError> = buffer.withUnsafeReadableBytes { raw in readLines(raw) }
        guard let end = try result.get() else { return nil }
        // Moved out, not copied (a copy retained and released what the head holds: ~2 % of a
        // proxied request).
        var head = Self.blank()
        swap(&head, &pending)
        head.bytes = buffer.readSlice(length: end)!
        scanned = 0
        lineStart = 0
        sawStartLine = false
        return head
    }

    /// Forgets a partly read head (the connection moves on to something else).
    mutating func reset() {
        scanned = 0
        lineStart = 0
        sawStartLine = false
        pending = Self.blank()
    }

    /// A head to fill, with room for the fields of most heads (growing the list one append at a
    /// time was four allocations a head).
    private static func blank() -> WireHead {
        var fields: [WireField] = []
        fields.reserveCapacity(16)
        return WireHead(bytes: ByteBuffer(), version: .http1_1, fieldsStart: 0, fields: fields)
    }

    /// Reads the lines that have arrived: the head's length once its empty line has.
    private mutating func readLines(_ raw: UnsafeRawBufferPointer) -> Result<Int?, WireError> {
        while let newline = Self.index(of: 0x0A, in: raw, from: scanned) {
            guard newline > lineStart, raw[newline - 1] == 0x0D else { return .failure(.malformed("line not ended by CRLF")) }
            let lineEnd = newline + 1
            var p = lineStart
            if raw[lineStart] == 0x0D, newline - 1 != lineStart { return .failure(.malformed("bare CR")) }
            if newline - 1 == lineStart {
                if sawStartLine { return .success(lineEnd) }
                // An empty line before the start line: skipped (RFC 9112 §2.2), for a request.
                guard kind == .request else { return .failure(.malformed("empty line before the status line")) }
            } else if !sawStartLine {
                switch kind {
                case .request:
                    guard Self.readRequestLine(raw, &p, into: &pending), p == lineEnd else { return .failure(.malformed("invalid request line")) }
                case .response:
                    guard Self.readStatusLine(raw, &p, into: &pending), p == lineEnd else { return .failure(.malformed("invalid status line")) }
                }
                pending.fieldsStart = Int32(lineEnd)
                sawStartLine = true
            } else {
                guard let field = Self.readField(raw, &p), p == lineEnd else { return .failure(.malformed("invalid header field")) }
                if pending.fields.count == maxFields { return .failure(.tooLarge("more than \(maxFields) header fields")) }
                pending.fields.append(field)
            }
            lineStart = lineEnd
            scanned = lineEnd
            if lineEnd > maxHeadBytes { return .failure(.tooLarge("head larger than \(maxHeadBytes) bytes")) }
        }
        scanned = raw.count
        if raw.count > maxHeadBytes { return .failure(.tooLarge("head larger than \(maxHeadBytes) bytes")) }
        return .success(nil)
    }

    private static func index(of byte: UInt8, in raw: UnsafeRawBufferPointer, from start: Int) -> Int? {
        guard start < raw.count, let base = raw.baseAddress else { return nil }
        guard let found = memchr(base + start, Int32(byte), raw.count - start) else { return nil }
        return base.distance(to: UnsafeRawPointer(found))
    }

    // MARK: lines (each known to end in CRLF)

    /// `method SP request-target SP HTTP-version CRLF`.
    private static func readRequestLine(_ raw: UnsafeRawBufferPointer, _ p: inout Int, into head: inout WireHead) -> Bool {
        let methodStart = p
        while Self.isToken(raw[p]) { p += 1 }
        guard p > methodStart, raw[p] == 0x20,
              let method = Self.method(UnsafeRawBufferPointer(rebasing: raw[methodStart..<p])) else { return false }
        head.method = method
        p += 1
        let targetStart = p
        while Self.isTargetByte(raw[p]) { p += 1 }
        guard p > targetStart, raw[p] == 0x20,
              method == .CONNECT || isTargetForm(UnsafeRawBufferPointer(rebasing: raw[targetStart..<p])) else { return false }
        head.targetStart = Int32(targetStart)
        head.targetLength = Int32(p - targetStart)
        p += 1
        guard let version = readVersion(raw, &p), raw[p] == 0x0D else { return false }
        head.version = version
        p += 2
        return true
    }

    /// `HTTP-version SP status-code [SP reason-phrase] CRLF` (llhttp, like most clients, takes a
    /// status line without the SP when the reason is empty).
    private static func readStatusLine(_ raw: UnsafeRawBufferPointer, _ p: inout Int, into head: inout WireHead) -> Bool {
        guard let version = readVersion(raw, &p), raw[p] == 0x20 else { return false }
        head.version = version
        p += 1
        var status = 0
        for _ in 0..<3 {
            let digit = raw[p] &- 0x30
            guard digit <= 9 else { return false }
            status = status * 10 + Int(digit)
            p += 1
        }
        guard status >= 100 else { return false }
        head.status = status
        if raw[p] == 0x20 {
            p += 1
            let reasonStart = p
            while raw[p] == 0x09 || raw[p] == 0x20 || Self.isFieldByte(raw[p]) { p += 1 }
            head.reasonStart = Int32(reasonStart)
            head.reasonLength = Int32(p - reasonStart)
        } else {
            head.reasonStart = Int32(p)
        }
        guard raw[p] == 0x0D else { return false }
        p += 2
        return true
    }

    /// Origin form (`/…`), asterisk form (`*`) or absolute form (`scheme://…`), told apart by
    /// their start (RFC 9112 §3.2); CONNECT's authority form is not checked here.
    /// `RequestTarget` decides what each means.
    private static func isTargetForm(_ target: UnsafeRawBufferPointer) -> Bool {
        switch target[0] {
        case 0x2F: return true
        case 0x2A: return target.count == 1
        default:
            // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then "://" (an opaque
            // `scheme:rest` is refused, as llhttp does)
            guard let colon = target.firstIndex(of: 0x3A), colon > 0, colon + 2 < target.count,
                  target[colon + 1] == 0x2F, target[colon + 2] == 0x2F else { return false }
            return target[..<colon].enumerated().allSatisfy { index, byte in
                let letter = (byte | 0x20) >= 0x61 && (byte | 0x20) <= 0x7A
                return letter || (index > 0 && ((byte >= 0x30 && byte <= 0x39) || byte == 0x2B || byte == 0x2D || byte == 0x2E))
            }
        }
    }

    /// `HTTP/1.0` or `HTTP/1.1`.
    private static func readVersion(_ raw: UnsafeRawBufferPointer, _ p: inout Int) -> HTTPVersion? {
        guard p + 8 <= raw.count, raw[p] == 0x48, raw[p + 1] == 0x54, raw[p + 2] == 0x54, raw[p + 3] == 0x50, raw[p + 4] == 0x2F,
              raw[p + 5] == 0x31, raw[p + 6] == 0x2E, raw[p + 7] == 0x30 || raw[p + 7] == 0x31 else { return nil }
        let minor = Int(raw[p + 7] - 0x30)
        p += 8
        return HTTPVersion(major: 1, minor: minor)
    }

    /// `field-name ":" OWS field-value OWS CRLF`; the value's OWS is trimmed.
    static func readField(_ raw: UnsafeRawBufferPointer, _ p: inout Int) -> WireField? {
        let nameStart = p
        while Self.isToken(raw[p]) { p += 1 }
        guard p > nameStart, raw[p] == 0x3A else { return nil }  // also refuses obs-fold: a line starting with SP/HTAB
        let nameLength = p - nameStart
        p += 1
        while raw[p] == 0x20 || raw[p] == 0x09 { p += 1 }
        let valueStart = p
        var valueEnd = p
        while true {
            let byte = raw[p]
            if byte == 0x0D { break }
            if byte == 0x20 || byte == 0x09 {
                p += 1
                continue
            }
            guard Self.isFieldByte(byte) else { return nil }
            p += 1
            valueEnd = p
        }
        guard raw[p + 1] == 0x0A else { return nil }  // a CR inside the line
        p += 2
        return WireField(nameStart: Int32(nameStart), nameLength: Int32(nameLength), valueStart: Int32(valueStart),
                         valueLength: Int32(valueEnd - valueStart), lineEnd: Int32(p))
    }

    // MARK: character classes

    private static let classes: [UInt8] = {
        var table = [UInt8](repeating: 0, count: 256)
        for byte in 0x21...0x7E { table[byte] |= target | field }
        for byte in 0x80...0xFF { table[byte] |= field }
        let tchars = Array("!#$%&'*+-.^_`|~".utf8) + Array(0x30...0x39) + Array(0x41...0x5A) + Array(0x61...0x7A)
        for byte in tchars { table[Int(byte)] |= token }
        return table
    }()
    private static let token: UInt8 = 1
    /// VCHAR: what a request target may hold (RFC 9112 §3.2; no SP, CTL, DEL or non-ASCII).
    private static let target: UInt8 = 2
    /// field-vchar: VCHAR and obs-text (RFC 9110 §5.5).
    private static let field: UInt8 = 4

    @inline(__always) static func isToken(_ byte: UInt8) -> Bool { classes[Int(byte)] & token != 0 }
    @inline(__always) static func isTargetByte(_ byte: UInt8) -> Bool { classes[Int(byte)] & target != 0 }
    @inline(__always) static func isFieldByte(_ byte: UInt8) -> Bool { classes[Int(byte)] & field != 0 }

    /// The request methods llhttp knows (its HTTP method map), the ones the proxy has always
    /// accepted; anything else is refused.
    private static let methods: [(name: [UInt8], method: HTTPMethod)] = ([
        ("GET", .GET), ("POST", .POST), ("PUT", .PUT), ("DELETE", .DELETE), ("HEAD", .HEAD), ("OPTIONS", .OPTIONS),
        ("PATCH", .PATCH), ("CONNECT", .CONNECT), ("TRACE", .TRACE), ("COPY", .COPY), ("LOCK", .LOCK), ("MKCOL", .MKCOL),
        ("MOVE", .MOVE), ("PROPFIND", .PROPFIND), ("PROPPATCH", .PROPPATCH), ("SEARCH", .SEARCH), ("UNLOCK", .UNLOCK),
        ("BIND", .BIND), ("REBIND", .REBIND), ("UNBIND", .UNBIND), ("ACL", .ACL), ("REPORT", .REPORT),
        ("MKACTIVITY", .MKACTIVITY), ("CHECKOUT", .CHECKOUT), ("MERGE", .MERGE), ("M-SEARCH", .MSEARCH),
        ("NOTIFY", .NOTIFY), ("SUBSCRIBE", .SUBSCRIBE), ("UNSUBSCRIBE", .UNSUBSCRIBE), ("PURGE", .PURGE),
        ("MKCALENDAR", .MKCALENDAR), ("LINK", .LINK), ("UNLINK", .UNLINK), ("SOURCE", .RAW(value: "SOURCE")), ("QUERY", .RAW(value: "QUERY")),
    ] as [(String, HTTPMethod)]).map { (Array($0.0.utf8), $0.1) }

    private static func method(_ bytes: UnsafeRawBufferPointer) -> HTTPMethod? {
        // The common ones first, without a table walk.
        if bytes.count == 3, bytes[0] == 0x47, bytes[1] == 0x45, bytes[2] == 0x54 { return .GET }
        if bytes.count == 4, bytes[0] == 0x50, bytes[1] == 0x4F, bytes[2] == 0x53, bytes[3] == 0x54 { return .POST }
        return methods.first { $0.name.elementsEqual(bytes) }?.method
    }
}
