import NIOHTTP1

/// How a request's body is delimited, from its head (RFC 9112 §6.3), refusing every head whose
/// framing two parsers could read differently (`docs/security.md`, *HTTP/1.1 framing*): one
/// `Content-Length` of digits only, or one `Transfer-Encoding` that is exactly `chunked` in
/// HTTP/1.1, never both. Neither may end in HTAB: RFC 9110 trims it, but llhttp refuses it, and
/// a backend reading `chunked\t` as an unknown coding would frame the body differently.
enum MessageFraming {
    static func request(_ head: borrowing WireHead) throws(WireError) -> BodyDecoder.Framing {
        let fields = try FramingFields(head)
        if fields.encodings > 0, !fields.chunked { throw .malformed("unsupported Transfer-Encoding") }
        if fields.lengths > 1 { throw .malformed("duplicate Content-Length") }
        if fields.encodings > 1 { throw .malformed("duplicate Transfer-Encoding") }
        if fields.encodings > 0 {
            if fields.lengths > 0 { throw .malformed("both Content-Length and Transfer-Encoding") }
            if head.version.minor == 0 { throw .malformed("Transfer-Encoding in HTTP/1.0") }
            return .chunked
        }
        return .contentLength(fields.length ?? 0)
    }

    /// What a head's `Content-Length` and `Transfer-Encoding` fields say, each length checked.
    private struct FramingFields {
        var length: Int? = nil
        var lengths = 0
        var encodings = 0
        /// Every `Transfer-Encoding` is exactly `chunked` (and there is at least one).
        var chunked = false

        init(_ head: borrowing WireHead) throws(WireError) {
            var allChunked = true
            for field in head.fields {
                if head.nameIs(field, "content-length") {
                    lengths += 1
                    length = try MessageFraming.contentLength(head, field)
                } else if head.nameIs(field, "transfer-encoding") {
                    encodings += 1
                    allChunked = allChunked && head.valueIs(field, "chunked") && !head.hasTrailingTab(field)
                }
            }
            chunked = encodings > 0 && allChunked
        }
    }

    /// A `Content-Length` value: 1 to 18 digits, no HTAB after them.
    private static func contentLength(_ head: WireHead, _ field: WireField) throws(WireError) -> Int {
        let value = head.bytes.withUnsafeReadableBytes { raw in
            Self.decimal(UnsafeRawBufferPointer(rebasing: raw[Int(field.valueStart)..<Int(field.valueStart + field.valueLength)]))
        }
        guard let value, !head.hasTrailingTab(field) else { throw .malformed("invalid Content-Length") }
        return value
    }

    /// 1 to 18 ASCII digits (no sign, no list, no space): nil otherwise.
    static func decimal(_ bytes: UnsafeRawBufferPointer) -> Int? {
        guard !bytes.isEmpty, bytes.count <= 18 else { return nil }
        var value = 0
        for byte in bytes {
            let digit = byte &- 0x30
            guard digit <= 9 else { return nil }
            value = value * 10 + Int(digit)
        }
        return value
    }
}

extension WireHead {
    /// Whether an HTAB followed the value on its line (trimmed from the value).
    func hasTrailingTab(_ field: WireField) -> Bool {
        let end = field.valueStart + field.valueLength
        guard end + 2 != field.lineEnd else { return false }
        return bytes.withUnsafeReadableBytes { raw in raw[Int(end)..<Int(field.lineEnd - 2)].contains(0x09) }
    }
}

extension MessageFraming {
    /// How a response's body is delimited (RFC 9112 §6.3), refusing what two parsers could read
    /// differently (`ExchangeRules.responseHead`: more than one `Transfer-Encoding`, one other
    /// than exactly `chunked`, or one beside `Content-Length`). Without either, the body runs
    /// until the connection closes.
    /// The framing fields are checked even where no body follows (HEAD, 1xx, 204, 304), as llhttp
    /// does: a response that lies about its length is not relayed.
    static func response(_ head: borrowing WireHead, requestMethod: HTTPMethod) throws(WireError) -> BodyDecoder.Framing {
        let bodyless = requestMethod == .HEAD || (100..<200).contains(head.status) || head.status == 204 || head.status == 304
        let fields = try FramingFields(head)
        if fields.lengths > 1 { throw .malformed("duplicate Content-Length") }
        if fields.encodings > 0, !(fields.encodings == 1 && fields.chunked && fields.lengths == 0) { throw .malformed("ambiguous response framing") }
        if bodyless { return .contentLength(0) }
        if fields.encodings > 0 { return .chunked }
        return fields.length.map { .contentLength($0) } ?? .untilClose
    }

    /// Whether a response that has no body by its request's method or its status (HEAD, 1xx,
    /// 204, 304) declares one all the same (a non-zero `Content-Length`, or `Transfer-Encoding`).
    /// It is framed as bodyless, but an app that sends the body it announced puts bytes on the
    /// connection behind the response, where the next request's answer is expected: such a
    /// connection is never used again.
    static func declaresUnsentBody(_ head: borrowing WireHead, requestMethod: HTTPMethod) -> Bool {
        let status = head.status
        guard requestMethod == .HEAD || (100..<200).contains(status) || status == 204 || status == 304,
              let fields = try? FramingFields(head) else { return false }
        return fields.encodings > 0 || (fields.length ?? 0) > 0
    }
}
